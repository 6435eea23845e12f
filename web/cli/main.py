"""The ``lipstream`` command line.

    lipstream serve [--host H] [--port P]
    lipstream render --avatar demo --audio speech.wav --out out.mp4
    lipstream avatar validate DIR
    lipstream avatar list | lipstream avatar demo
    lipstream avatar import synctalk2d DIR --lipsync M.onnx --audio-encoder E.onnx [--id ID]
    lipstream avatar import livetalking DIR --kind wav2lip --lipsync M.onnx [--id ID]
        (import and build: [--clip NAME=START:STOP]... frames or seconds, idle=0:60, x=1s:3s)
    lipstream avatar preview ID [--audio FILE] --out preview.mp4 [--seconds S]
    lipstream avatar build --video V.mp4 (--face-detector D.onnx | --rects R.json)
        --lipsync M.onnx --audio-encoder E.onnx --id ID   (or --prepare-synctalk OUT/)
    lipstream model bench-unet --out unet.onnx [--width W]
    lipstream token mint --avatar ID [--ttl SECONDS]
    lipstream config check [--config FILE]
    lipstream health [--url URL] [--timeout S]     (exit 0 when /health answers 200)

Exit status: 0 success, 1 the work failed (message on stderr), 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from config.loader import ConfigError, apply_cli_overrides, dump_settings, load_settings
from config.settings import Settings
from inference_core.assets.benchmark_model import build_benchmark_unet, estimate_macs
from inference_core.assets.builtin import avatar_locator
from inference_core.avatars.package import check_avatar_id
from inference_core.avatars.validation import validate_package
from inference_core.importers import (
    AvatarSource,
    ImportReport,
    clip_ranges,
    livetalking,
    parse_clip,
    synctalk2d,
    ultralight,
    write_package,
)
from inference_core.importers.build import build_from_video, prepare_synctalk
from streaming.offline.render import RenderOptions, render_file
from web.cli.health import check_health, health_url
from web.cluster.ray_check import ClusterUnavailableError, ray_missing
from web.errors import LIBRARY_ERRORS
from web.log_format import configure_logging
from web.serve import serve
from web.session_tokens import mint_token

logger = logging.getLogger("lipstream")

SAMPLE_AUDIO = Path(__file__).parent.parent / "static" / "sample.wav"
CLIP_HELP = "NAME=START:STOP names frames [START, STOP) (or seconds, 2s:4.5s) a clip; repeat"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lipstream", description="Real-time talking-avatar server and tools."
    )
    parser.add_argument(
        "--config", type=Path, help="YAML settings file (default: $LIPSTREAM_CONFIG or built-in)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server (built-in demo avatar by default)")
    serve.add_argument("--host", help="listen address (default: server.host)")
    serve.add_argument("--port", type=int, help="listen port (default: server.port)")
    serve.add_argument(
        "--workers",
        type=int,
        help="worker processes on Ray behind this front (default: cluster.workers; 0 = one "
        "process); needs pip install 'lipstream[cluster]'",
    )
    serve.add_argument(
        "--ray-address",
        help="join this Ray cluster instead of starting a local one (default: cluster.ray_address)",
    )

    render = sub.add_parser("render", help="render an audio file to a lip-synced mp4")
    render.add_argument("--avatar", default="demo", help="avatar id (default: demo)")
    render.add_argument(
        "--audio", type=Path, default=SAMPLE_AUDIO, help="audio file (any format; default: sample)"
    )
    render.add_argument("--out", type=Path, required=True, help="output .mp4 path")
    render.add_argument("--no-progress", action="store_true", help="no progress bar")

    avatar = sub.add_parser("avatar", help="avatar packages")
    avatar_sub = avatar.add_subparsers(dest="avatar_command", required=True)
    validate = avatar_sub.add_parser("validate", help="check a package and list every problem")
    validate.add_argument("directory", type=Path)
    avatar_sub.add_parser("list", help="list the avatar ids under the avatar root")
    avatar_sub.add_parser("demo", help="generate the built-in demo avatar; print its path")
    _import_parser(avatar_sub.add_parser("import", help="import an avatar from another project"))
    _build_parser(avatar_sub.add_parser("build", help="build an avatar from a video of a person"))
    preview = avatar_sub.add_parser(
        "preview", help="a short render with each frame's crop rect drawn, to check the crops"
    )
    preview.add_argument("avatar", help="avatar id")
    preview.add_argument(
        "--audio", type=Path, default=SAMPLE_AUDIO, help="audio file (default: sample)"
    )
    preview.add_argument("--out", type=Path, required=True, help="output .mp4 path")
    preview.add_argument("--seconds", type=float, default=5.0, help="length (default 5 s)")

    model = sub.add_parser("model", help="model tools")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    bench = model_sub.add_parser("bench-unet", help="write the UNet benchmark model (unet_328 I/O)")
    bench.add_argument("--out", type=Path, required=True)
    bench.add_argument("--width", type=int, default=None, help="channel width (default: ~4.9 GMAC)")

    token = sub.add_parser("token", help="session tokens (when auth.jwt_secret is set)")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    mint = token_sub.add_parser("mint", help="print a signed session token for one avatar")
    mint.add_argument("--avatar", required=True, help="avatar id the token is scoped to")
    mint.add_argument("--ttl", type=float, default=3600.0, help="lifetime in seconds")
    mint.add_argument("--subject", help="optional sub claim (who the token is for)")

    health = sub.add_parser("health", help="exit 0 if the server answers GET /health")
    health.add_argument("--url", help="the /health URL (default: from server.host and .port)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    config_sub.add_parser("check", help="validate the settings and print the effective values")
    return parser


def _import_parser(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="source", required=True)
    synctalk = kinds.add_parser(
        "synctalk2d", help="a SyncTalk_2D dataset folder (full_body_img/, landmarks/)"
    )
    synctalk.add_argument("directory", type=Path, help="dataset/<name>")
    synctalk.add_argument("--lipsync", type=Path, required=True, help="its unet_328 ONNX export")
    synctalk.add_argument(
        "--audio-encoder", type=Path, required=True, help="its audio encoder ONNX (ave, 512-d)"
    )
    live = kinds.add_parser("livetalking", help="a LiveTalking avatar (full_imgs/, coords.pkl)")
    live.add_argument("directory", type=Path, help="data/avatars/<id>")
    live.add_argument("--kind", choices=("wav2lip", "ultralight"), required=True)
    live.add_argument("--lipsync", type=Path, required=True, help="the Wav2Lip 96 ONNX model")
    ultra = kinds.add_parser("ultralight", help="an Ultralight-Digital-Human folder")
    ultra.add_argument("directory", type=Path)
    for sub in (synctalk, live, ultra):
        sub.add_argument("--id", help="avatar id (default: the folder's name)")
        sub.add_argument(
            "--link", action="store_true", help="hard-link frames and models instead of copying"
        )
        sub.add_argument("--replace", action="store_true", help="overwrite an existing avatar")
        sub.add_argument("--no-progress", action="store_true", help="no progress bar")
        sub.add_argument("--clip", action="append", default=[], help=CLIP_HELP)


def _build_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--video", type=Path, required=True, help="a video of the person")
    parser.add_argument("--face-detector", type=Path, help="an SCRFD-style ONNX face detector")
    parser.add_argument("--rects", type=Path, help="JSON: one [x1, y1, x2, y2] face box per frame")
    parser.add_argument("--lipsync", type=Path, help="the person's lip-sync ONNX (unet_328 I/O)")
    parser.add_argument("--audio-encoder", type=Path, help="its audio encoder ONNX")
    parser.add_argument("--id", help="avatar id (default: the video's file name)")
    parser.add_argument("--fps", type=int, default=25, help="avatar frame rate (default 25)")
    parser.add_argument("--jpeg-quality", type=int, default=95, help="frames' JPEG quality")
    parser.add_argument(
        "--min-seconds", type=float, default=4.0, help="shortest segment kept (default 4 s)"
    )
    parser.add_argument(
        "--prepare-synctalk",
        type=Path,
        metavar="OUT",
        help="write OUT/<id>.mp4 (25 fps) and OUT/aud.wav (16 kHz) for SyncTalk_2D training",
    )
    parser.add_argument("--replace", action="store_true", help="overwrite an existing avatar")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--clip", action="append", default=[], help=CLIP_HELP + " of the video")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lipstream`` console script."""
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
        if args.command == "serve":
            settings = apply_cli_overrides(
                settings,
                host=args.host,
                port=args.port,
                workers=args.workers,
                ray_address=args.ray_address,
            )
    except ConfigError as exc:
        print(f"lipstream: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve" and settings.cluster.workers and (missing := ray_missing()):
        print(f"lipstream: {missing}", file=sys.stderr)
        return 2
    configure_logging(settings.logging.level, settings.logging.format)
    try:
        return _dispatch(args, settings)
    except LIBRARY_ERRORS as exc:
        print(f"lipstream: {exc}", file=sys.stderr)
        return 1
    except ClusterUnavailableError as exc:  # Ray missing, or no cluster where configured
        print(f"lipstream: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "serve":
        return serve(settings)  # 1 when the server gave up (its log says why)
    if args.command == "render":
        return _render(settings, args.avatar, args.audio, args.out, progress=not args.no_progress)
    if args.command == "avatar" and args.avatar_command == "preview":
        return _render(
            settings, args.avatar, args.audio, args.out, progress=True, preview_s=args.seconds
        )
    if args.command == "avatar" and args.avatar_command == "import":
        return _import(settings, args)
    if args.command == "avatar" and args.avatar_command == "build":
        return _build(settings, args)
    if args.command == "avatar":
        return _avatar(settings, args.avatar_command, getattr(args, "directory", None))
    if args.command == "token":
        try:
            token = mint_token(
                settings.auth, check_avatar_id(args.avatar), ttl_s=args.ttl, subject=args.subject
            )
        except ValueError as exc:
            print(f"lipstream: {exc}", file=sys.stderr)
            return 2
        print(token)
        return 0
    if args.command == "health":
        healthy, said = check_health(args.url or health_url(settings.server), args.timeout)
        print(said, file=sys.stdout if healthy else sys.stderr)
        return 0 if healthy else 1
    if args.command == "model":
        kwargs = {} if args.width is None else {"width": args.width}
        path = build_benchmark_unet(args.out, **kwargs)
        print(f"{path}: {estimate_macs(**kwargs):,} MAC per frame")
        return 0
    print(json.dumps(dump_settings(settings), indent=2))
    return 0


def _avatar(settings: Settings, command: str, directory: Path | None) -> int:
    a = settings.avatars
    locator = avatar_locator(a)
    if command == "validate":
        assert directory is not None
        problems = validate_package(directory)
        if problems:
            print(f"{directory}: {len(problems)} problem(s)")
            for problem in problems:
                print(f"  - {problem}")
            return 1
        print(f"{directory}: ok")
        return 0
    if command == "list":
        for avatar_id in locator.list_ids():
            print(avatar_id)
        return 0
    print(locator.locate("demo"))
    return 0


def _import(settings: Settings, args: argparse.Namespace) -> int:
    directory: Path = args.directory
    if not directory.is_dir():
        print(f"lipstream: {directory} is not a directory", file=sys.stderr)
        return 2
    with tqdm(
        total=1,
        unit="frame",
        disable=args.no_progress or not sys.stderr.isatty(),
        file=sys.stderr,
    ) as bar:

        def report(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        if args.source == "synctalk2d":
            source = synctalk2d(directory, args.lipsync, args.audio_encoder, progress=report)
        elif args.source == "livetalking":
            source = livetalking(directory, args.kind, args.lipsync)
        else:
            source = ultralight(directory)
        bar.reset()
        clips = clip_ranges([parse_clip(c) for c in args.clip], source.fps, len(source.frames))
        result = write_package(
            dataclasses.replace(source, clips=clips),
            settings.avatars.root,
            args.id or directory.name,
            link=args.link,
            replace=args.replace,
            progress=report,
        )
    _print_report(result, source)
    return 0


def _build(settings: Settings, args: argparse.Namespace) -> int:
    avatar_id = args.id or check_avatar_id(args.video.stem.lower())
    if args.prepare_synctalk is not None:
        for path in prepare_synctalk(args.video, args.prepare_synctalk, avatar_id, fps=args.fps):
            print(f"wrote {path}")
        print(f"  next: train SyncTalk_2D on {args.prepare_synctalk}, then lipstream avatar import")
        return 0
    if args.lipsync is None:
        print("lipstream: avatar build needs --lipsync (or --prepare-synctalk)", file=sys.stderr)
        return 2
    work = settings.avatars.root / f".build-{avatar_id}"
    show = not args.no_progress and sys.stderr.isatty()
    try:
        with tqdm(unit="frame", disable=not show, file=sys.stderr) as bar:

            def report(done: int, _total: int) -> None:
                bar.update(done - bar.n)

            source = build_from_video(
                args.video,
                args.lipsync,
                args.audio_encoder,
                work,
                detector=args.face_detector,
                rects_file=args.rects,
                fps=args.fps,
                jpeg_quality=args.jpeg_quality,
                min_seconds=args.min_seconds,
                clips=[parse_clip(c) for c in args.clip],
                progress=report,
            )
        result = write_package(
            source, settings.avatars.root, avatar_id, link=True, replace=args.replace
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print_report(result, source)
    return 0


def _print_report(result: ImportReport, source: AvatarSource) -> None:
    w, h = result.frame_size
    print(f"imported {result.avatar_id} from {source.kind}: {result.path}")
    print(
        f"  {result.frames} frames, {w}x{h}, model {result.model_io}, adapter {source.adapter.name}"
    )
    for note in result.notes:
        print(f"  note: {note}")
    print(f"  validated: ok; look at it: lipstream avatar preview {result.avatar_id} --out p.mp4")


def _render(
    settings: Settings,
    avatar_id: str,
    audio: Path,
    out: Path,
    *,
    progress: bool,
    preview_s: float | None = None,
) -> int:
    a = settings.avatars
    package = avatar_locator(a).load(avatar_id)
    options = RenderOptions(
        right_context=settings.audio.right_context,
        vad_threshold_db=settings.audio.vad_threshold_db,
        hangover_frames=settings.audio.hangover_frames,
        blend_frames=settings.audio.blend_frames,
        max_batch_size=settings.batching.size_for("cpu"),  # the render runs on the CPU
        preset=settings.video.preset,
        cache_bytes=settings.cache.background_cache_bytes,
        max_seconds=preview_s,
        draw_rects=preview_s is not None,
    )
    with tqdm(
        total=1, unit="frame", disable=not progress or not sys.stderr.isatty(), file=sys.stderr
    ) as bar:

        def report(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        result = render_file(package, audio, out, options, progress=report)
    print(
        f"wrote {result.path}: {result.frames} frames at {result.fps} fps "
        f"({result.duration_s:.2f} s audio, {result.inferred_frames} frames lip-synced) "
        f"in {result.seconds:.1f} s; live delay from the model's lookahead: "
        f"{result.lookahead_ms:.0f} ms (audio.right_context={settings.audio.right_context})"
    )
    return 0
