"""lipstream and Chromium → Chromium over the same shaped links, side by side, in one run.

Each scenario (a link, changed over time: ``tc tbf`` caps on server → caller, random
loss both ways with ``iptables``, ``benchmarks/netns.py``) is run twice on this machine:

- **lipstream**: the server here, the demo avatar at 720p, called by Debian's Chromium
  in its own network namespace with lipstream.js, its fake microphone playing speech
  with pauses (espeak-ng);
- **anchor**: a second Chromium here sends the avatar's own rendered video (``lipstream
  render`` of the same speech, written as Y4M: Chromium's fake camera) and the speech to
  the caller's Chromium, H.264 capped at 2.5 Mbit/s: what libwebrtc makes of that link.

Each prints what the caller's Chromium measured over the window (after a settle time;
``benchmarks/link_stats.py``): fps, freezes and their duration, jitter-buffer delay,
received kbit/s, video loss, keyframes, PLIs, audio concealed, round trip, frame
heights; and, for lipstream, what the server's controller did (estimate, ladder step).
Targets: on every capped scenario, freezes at most the anchor's + 1 and jitter-buffer
delay within the anchor's + 50 ms. Needs root (namespaces), Debian's chromium, iproute2,
iptables and espeak-ng. Not a test: ``tests/test_shaped_links.py`` asserts the bounds.

    sudo .venv/bin/python -m benchmarks.network [--quick] [--only cap600 dip] [--no-anchor]

The server takes ``LIPSTREAM_*`` variables from the environment, so a setting is measured
on the same links: ``LIPSTREAM_VIDEO__SHARED_IDLE=false sudo -E ... --only cap600``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import tempfile
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import av
import numpy as np

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.link_stats import WindowFigures, rate_series, window_figures
from benchmarks.live_server import served
from benchmarks.netns import Namespace, Shaping, client_namespace
from benchmarks.shaped_calls import (
    Change,
    Scenario,
    ScenarioRun,
    anchor_call,
    chromium,
    close_anchor,
    hang_up,
    lipstream_call,
    namespaced_chromium,
    run_scenario,
)
from config.loader import CONFIG_ENV, ENV_PREFIX, load_settings
from config.settings import Settings, TtsSettings
from streaming.audio_in.tts import build_tts_engine
from streaming.audio_rates import OUT_RATE
from web.app import build_app
from web.app_keys import SESSIONS

CAP_1500 = Shaping(1500)
CAP_600 = Shaping(600)
CAP_300 = Shaping(300)
CAP_2500 = Shaping(2500)
DIP_500 = Shaping(500)
POLICER = Shaping(1500, burst_bytes=10_000, latency_ms=50)

#: The scenarios of issue 35, by name. The dip: 8 s at 2.5 Mbit/s after the settle
#: time, 20 s at 0.5, then 2.5 again for the rest of the window.
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("clean", ()),
        Scenario("loss2", (Change(0, loss=0.02),)),
        Scenario("loss5", (Change(0, loss=0.05),)),
        Scenario("cap1500", (Change(0, CAP_1500),)),
        Scenario("cap600", (Change(0, CAP_600),)),
        Scenario("cap300", (Change(0, CAP_300),)),
        Scenario("policer", (Change(0, POLICER),)),
        Scenario(
            "dip",
            (Change(0, CAP_2500), Change(14, DIP_500), Change(34, CAP_2500)),
            window_s=42,
        ),
    )
}


#: What the fake microphone says, with a pause after each phrase (seconds).
PHRASES = (
    ("Hello, and thank you for calling. How can I help you today?", 0.6),
    ("I can look that up for you right away, it only takes a moment.", 1.2),
    ("Your order left our warehouse this morning and should arrive on Friday.", 0.5),
    ("Is there anything else I can do for you?", 1.5),
)


async def _speech_pcm() -> np.ndarray:
    engine = build_tts_engine(TtsSettings(engine="espeak"))
    parts = []
    try:
        for text, pause_s in PHRASES:
            parts += [
                await engine.synthesize(text),
                np.zeros(round(pause_s * OUT_RATE), np.float32),
            ]
    finally:
        await engine.close()
    return np.concatenate(parts)


def speech_wav(path: Path) -> Path:
    """espeak-ng speech with pauses (:data:`PHRASES`), 48 kHz mono: the fake microphone."""
    pcm = asyncio.run(_speech_pcm())
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(OUT_RATE)
        out.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def server_settings(root: Path) -> Settings:
    """The server's settings: the defaults, any ``LIPSTREAM_*`` variable of this process
    (to measure a setting on the same links: ``LIPSTREAM_VIDEO__SHARED_IDLE=false``), the
    demo avatar in ``root`` on the CPU."""
    environ = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX) and k != CONFIG_ENV}
    environ.update(
        {
            "LIPSTREAM_AVATARS__ROOT": str(root / "avatars"),
            "LIPSTREAM_AVATARS__DATA_DIR": str(root / "data"),
            "LIPSTREAM_DEVICES__KIND": "cpu",
            "LIPSTREAM_SERVER__MAX_SESSIONS": "8",
        }
    )
    return load_settings(None, environ)


def anchor_video(root: Path, speech: Path) -> Path:
    """The demo avatar speaking ``speech``, as ``lipstream render`` makes it, written as
    Y4M (Chromium's fake camera reads nothing else)."""
    from web.cli.main import main as cli

    mp4, y4m = root / "anchor.mp4", root / "anchor.y4m"
    settings = root / "settings.yaml"
    settings.write_text(
        json.dumps({"avatars": {"root": str(root / "avatars"), "data_dir": str(root / "data")}})
    )
    code = cli(["--config", str(settings), "render", "--audio", str(speech), "--out", str(mp4),
                "--no-progress"])  # fmt: skip
    if code:
        raise SystemExit(f"lipstream render failed ({code})")
    with av.open(str(mp4)) as source, av.open(str(y4m), "w", format="yuv4mpegpipe") as out:
        stream = out.add_stream("rawvideo", rate=25)
        video = source.streams.video[0]
        stream.width, stream.height, stream.pix_fmt = video.width, video.height, "yuv420p"
        for frame in source.decode(video):
            for packet in stream.encode(frame.reformat(format="yuv420p")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return y4m


def _session_figures(app: Any) -> dict[str, Any]:
    """The last session's snapshot (the one call this benchmark makes at a time)."""
    sessions = list(app[SESSIONS].sessions)
    return dataclasses.asdict(sessions[-1].snapshot()) if sessions else {}


async def run_lipstream(
    root: Path, namespace: Namespace, speech: Path, scenarios: Sequence[Scenario]
) -> list[ScenarioRun]:
    app = build_app(server_settings(root))
    runs = []
    async with served(app, host=namespace.host_address) as (app, url):
        wrapper = namespaced_chromium(namespace, root)
        async with chromium(fake_mic=speech, executable=wrapper, secure_origins=[url]) as browser:
            for scenario in scenarios:
                page = await browser.new_page()

                async def start(page: Any = page) -> None:
                    await lipstream_call(page, url)

                links: list[dict[str, Any]] = []

                async def during(elapsed: float, links: list[dict[str, Any]] = links) -> None:
                    links.append({"at_s": elapsed, **_session_figures(app).get("link", {})})

                run = await run_scenario(namespace, page, scenario, start, during=during)
                run.server = {"session": _session_figures(app), "link_series": links}
                await hang_up(page)
                await page.close()
                runs.append(run)
                print(f"lipstream {scenario.name}: {_line(run)}", flush=True)
    return runs


async def run_anchor(
    root: Path, namespace: Namespace, speech: Path, video: Path, scenarios: Sequence[Scenario]
) -> list[ScenarioRun]:
    app = build_app(server_settings(root))  # only serves the pages an origin
    runs = []
    async with served(app, host=namespace.host_address) as (app, url):
        wrapper = namespaced_chromium(namespace, root)
        async with (
            chromium(fake_mic=speech, fake_camera=video, secure_origins=[url]) as sending,
            chromium(fake_mic=speech, executable=wrapper, secure_origins=[url]) as receiving,
        ):
            for scenario in scenarios:
                sender, receiver = await sending.new_page(), await receiving.new_page()
                await sender.goto(f"{url}/")
                await receiver.goto(f"{url}/")

                async def start(sender: Any = sender, receiver: Any = receiver) -> None:
                    await anchor_call(sender, receiver)

                run = await run_scenario(namespace, receiver, scenario, start)
                await close_anchor(sender, receiver)
                await sender.close()
                await receiver.close()
                runs.append(run)
                print(f"anchor {scenario.name}: {_line(run)}", flush=True)
    return runs


def figures(run: ScenarioRun) -> WindowFigures:
    return window_figures(run.samples, *run.window_ms)


def dip_figures(run: ScenarioRun) -> dict[str, float]:
    """The dip's drop and recovery: fps over the dip from 3 s after the drop, and
    seconds from the lift until 2 s of reception reached 1.5 Mbit/s."""
    if len(run.change_ms) < 3:
        return {}
    drop, lift = run.change_ms[1], run.change_ms[2]
    during = window_figures(run.samples, drop + 3000, lift)
    kbps = rate_series(run.samples, "v_bytes", 2000, scale=0.008)
    back = next((t for t, v in kbps if t > lift and v >= 1500), math.inf)
    freezes_at_drop = window_figures(run.samples, drop - 1000, lift).freezes
    return {
        "fps_from_3s_after_drop": during.fps,
        "freezes_in_dip": freezes_at_drop,
        "recovered_1500_after_s": (back - lift) / 1000,
    }


def _line(run: ScenarioRun) -> str:
    f = figures(run)
    return (
        f"{f.fps:.1f} fps, {f.freezes} freezes ({f.freeze_s:.1f} s), jitter {f.jitter_ms:.0f} ms, "
        f"{f.kbps:.0f} kbit/s, loss {100 * f.video_loss:.1f} %, audio concealed "
        f"{100 * f.audio_concealed:.2f} %, rtt {f.rtt_ms:.0f}/{f.rtt_max_ms:.0f} ms, "
        f"heights {f.heights}"
    )


def _row(side: str, run: ScenarioRun) -> list[object]:
    f = figures(run)
    link = run.server.get("session", {}).get("link", {})
    return [
        run.scenario.name, side, round(f.fps, 1), f"{f.freezes} ({f.freeze_s:.1f} s)",
        _rounded(f.jitter_ms), round(f.kbps), f"{100 * f.video_loss:.1f}", f.keyframes, f.plis,
        f"{100 * f.audio_concealed:.2f}", f"{f.rtt_ms:.0f} / {f.rtt_max_ms:.0f}",
        "/".join(map(str, f.heights)), link.get("step", "-"),
    ]  # fmt: skip


def _rounded(value: float) -> object:
    return "-" if math.isnan(value) else round(value)


def run(quick: bool = False, *, only: Sequence[str] = (), anchor: bool = True) -> Result:
    """Every scenario (or ``only`` those), lipstream then the anchor."""
    from benchmarks.chromium import CHROMIUM

    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    chosen = [SCENARIOS[name] for name in (only or SCENARIOS)]
    if quick:
        chosen = [Scenario(s.name, s.changes, s.settle_s, min(s.window_s, 20)) for s in chosen
                  if s.name != "dip"] + [s for s in chosen if s.name == "dip"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, client_namespace("net") as namespace:
        root = Path(tmp)
        speech = speech_wav(root / "speech.wav")
        ours = asyncio.run(run_lipstream(root, namespace, speech, chosen))
        theirs: list[ScenarioRun] = []
        if anchor:
            video = anchor_video(root, speech)
            theirs = asyncio.run(run_anchor(root, namespace, speech, video, chosen))
    header = ["scenario", "side", "fps", "freezes", "jitter ms", "kbit/s", "video loss %",
              "keyframes", "PLIs", "audio concealed %", "RTT ms p50 / max", "heights",
              "step"]  # fmt: skip
    rows: list[list[object]] = []
    targets: list[Target] = []
    for index, ours_run in enumerate(ours):
        rows.append(_row("lipstream", ours_run))
        if theirs:
            rows.append(_row("anchor", theirs[index]))
            a, b = figures(ours_run), figures(theirs[index])
            if ours_run.scenario.name not in ("clean", "loss2", "loss5"):
                name = ours_run.scenario.name
                targets += [
                    Target(f"{name}: freezes - anchor's", a.freezes - b.freezes, 1, False),
                    Target(f"{name}: jitter buffer - anchor's", a.jitter_ms - b.jitter_ms,
                           50, False, " ms"),
                ]  # fmt: skip
    print_table("Shaped links: what the caller's Chromium measured over the window", header, rows)
    dips = {side: dip_figures(r) for side, runs in (("lipstream", ours), ("anchor", theirs))
            for r in runs if r.scenario.name == "dip"}  # fmt: skip
    if dips:
        print_table(
            "The dip (2.5 → 0.5 → 2.5 Mbit/s)",
            ["side", "fps from 3 s after the drop", "freezes in the dip", "s to 1.5 Mbit/s"],
            [[side, round(d["fps_from_3s_after_drop"], 1), d["freezes_in_dip"],
              round(d["recovered_1500_after_s"], 1)] for side, d in dips.items() if d],
        )  # fmt: skip
    print_targets(targets)
    return {
        "lipstream": {r.scenario.name: _result(r) for r in ours},
        "anchor": {r.scenario.name: _result(r) for r in theirs},
        "dip": dips,
        "targets": [t.as_json() for t in targets],
    }


def _result(run: ScenarioRun) -> Result:
    return {
        "window": figures(run).as_json(),
        "server": run.server,
        "samples": run.samples,
        "change_ms": run.change_ms,
        "connected_ms": run.connected_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20 s windows")
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), default=[])
    parser.add_argument("--no-anchor", action="store_true", help="lipstream only")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    result = run(args.quick, only=args.only, anchor=not args.no_anchor)
    if args.json:
        args.json.write_text(json.dumps(result, default=_json_default))


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


if __name__ == "__main__":
    main()
