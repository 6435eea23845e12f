"""Resident memory per loaded avatar, and with 1,200 registered avatars.

    .venv/bin/python -m benchmarks.run --only memory [--quick]

1. Per loaded avatar: N copies of the demo package (1280×720, 125 frames) under a temp
   root; for each, the model is loaded through ``InferenceCore.open`` (lip-sync ONNX
   session, warmed) and 50 background frames are filled into the shared byte-bounded
   cache (as a session's ``AvatarFrames`` does). RSS is read after each avatar. The
   memory per loaded avatar is the least-squares slope over avatars 1..N (what each
   further avatar adds; target <= 75 MB); the first avatar's step also holds what the
   process grows once for all of them (onnxruntime's shared CPU arena, sized by the
   largest run in flight), reported separately with the slope over 0..N.
2. Registered, not loaded: 1,200 manifest-only avatar folders, ``registry.register_all()``;
   process RSS before and after.

Each part runs in a fresh child process so earlier benchmarks do not skew RSS. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import Result, Target, print_table, print_targets, rss_bytes

MB = 1e6
TARGET_MB = 75.0
FRAMES_CACHED = 50
REGISTERED = 1200


async def _per_avatar(root: Path, count: int) -> Result:
    from compositor.background_cache import AvatarFrames, BackgroundCache
    from config.settings import Settings
    from inference_core.assets.demo_avatar import write_demo_avatar
    from inference_core.avatars.locator import AvatarLocator
    from inference_core.serving.core import InferenceCore

    avatars = root / "avatars"
    write_demo_avatar(avatars / "m00")
    for i in range(1, count):
        shutil.copytree(avatars / "m00", avatars / f"m{i:02d}")
    settings = Settings.model_validate(
        {"avatars": {"root": str(avatars), "data_dir": str(root / "data"), "demo": False}}
    )
    core = InferenceCore(settings, AvatarLocator(avatars))
    await core.start()
    cache = BackgroundCache(count * FRAMES_CACHED * 1280 * 720 * 3 // 2 + (1 << 20))
    held = []
    rss = [rss_bytes()]
    try:
        for i in range(count):
            handle = await core.open(f"m{i:02d}")
            frames = AvatarFrames(handle.model_id, handle.package.frame_paths, cache)
            for j in range(FRAMES_CACHED):
                frames.get(j)
            held.append((handle, frames))
            rss.append(rss_bytes())
    finally:
        for handle, _ in held:
            handle.close()
        await core.stop()
    mb = np.asarray(rss) / MB
    further = float(np.polyfit(np.arange(1, count + 1), mb[1:], 1)[0])
    overall = float(np.polyfit(np.arange(count + 1), mb, 1)[0])
    return {
        "rss_mb": mb.tolist(),
        "slope_mb": further,
        "slope_from_zero_mb": overall,
        "first_avatar_mb": float(mb[1] - mb[0]),
        "avatars": count,
    }


async def _registered(root: Path, count: int) -> Result:
    from config.settings import Settings
    from inference_core.avatars.locator import AvatarLocator
    from inference_core.serving.core import InferenceCore

    avatars = root / "avatars"
    for i in range(count):
        folder = avatars / f"r{i:04d}"
        folder.mkdir(parents=True)
        (folder / "avatar.json").write_text('{"format": "lipstream-avatar", "version": 1}\n')
    settings = Settings.model_validate(
        {"avatars": {"root": str(avatars), "data_dir": str(root / "data"), "demo": False}}
    )
    core = InferenceCore(settings, AvatarLocator(avatars))
    before = rss_bytes()
    registered = core.registry.register_all()
    after = rss_bytes()
    return {"registered": registered, "rss_before_mb": before / MB, "rss_after_mb": after / MB}


def child(part: str, count: int, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        func = _per_avatar if part == "per_avatar" else _registered
        out.write_text(json.dumps(asyncio.run(func(Path(tmp), count))))


def _in_child(part: str, count: int) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "memory.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.memory",
                "--child",
                part,
                "--count",
                str(count),
                "--json",
                str(out),
            ],
            check=True,
        )
        result: Result = json.loads(out.read_text())
        return result


def run(quick: bool = False, *, avatars: int | None = None) -> Result:
    count = avatars or (4 if quick else 8)
    per = _in_child("per_avatar", count)
    reg = _in_child("registered", REGISTERED)
    rss = per["rss_mb"]
    assert isinstance(rss, list)
    print_table(
        f"Resident memory per loaded demo avatar (1280x720, {FRAMES_CACHED} cached frames)",
        ["avatars loaded", *[str(i) for i in range(len(rss))]],
        [["RSS MB", *[f"{r:.0f}" for r in rss]]],
    )
    print(
        f"\n  each further avatar: {per['slope_mb']:.1f} MB (slope over 1..{count}; of which "
        f"{FRAMES_CACHED} yuv420p frames = {FRAMES_CACHED * 1.3824:.1f} MB)\n"
        f"  first avatar: {per['first_avatar_mb']:.1f} MB (includes the shared onnxruntime "
        f"arena); slope over 0..{count}: {per['slope_from_zero_mb']:.1f} MB"
    )
    print_table(
        f"Process RSS with {REGISTERED} registered (not loaded) avatars",
        ["registered", "RSS before MB", "RSS after MB", "delta MB"],
        [
            [
                reg["registered"],
                reg["rss_before_mb"],
                reg["rss_after_mb"],
                float(reg["rss_after_mb"]) - float(reg["rss_before_mb"]),
            ]
        ],
    )
    targets = [Target("MB per loaded avatar", float(per["slope_mb"]), TARGET_MB, False, " MB")]
    print_targets(targets)
    return {"per_avatar": per, "registered": reg, "targets": [t.as_json() for t in targets]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", choices=("per_avatar", "registered"))
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.count, args.json)
        return
    result = run(avatars=args.count)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
