"""The README's code examples run as written against a real server."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp.test_utils import TestServer

from config.settings import Settings
from web.app import build_app

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


async def test_raw_inference_client_example(tmp_path: Path) -> None:
    (example,) = [b for b in _python_blocks() if "/v1/infer/" in b]
    settings = Settings.model_validate(
        {"avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data")}}
    )
    async with TestServer(build_app(settings)) as server:
        base = str(server.make_url("")).rstrip("/")
        code = example.replace('"http://127.0.0.1:8080"', repr(base))
        namespace: dict[str, object] = {}
        # The example uses blocking urllib, as a client script would: run it off the loop.
        await asyncio.to_thread(exec, code, namespace)
    faces, raw = namespace["faces"], namespace["raw"]
    assert isinstance(faces, np.ndarray)
    assert faces.shape == (2, 320, 320, 3)
    assert faces.dtype == np.uint8
    assert isinstance(raw, np.ndarray)
    assert raw.shape == (2, 3, 320, 320)
    assert 0.0 <= float(raw.min()) <= float(raw.max()) <= 1.0


async def test_python_client_streaming_example(tmp_path: Path, loopback: None) -> None:
    """The voice-agent example: a call, speech streamed in, its events back."""
    (example,) = [b for b in _python_blocks() if "stream_audio" in b]
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )
    async with TestServer(build_app(settings), host="127.0.0.1") as server:
        base = str(server.make_url("")).rstrip("/")
        code = example.replace('"http://127.0.0.1:8080"', repr(base))
        code = code.replace("asyncio.run(main())", "")
        namespace: dict[str, Any] = {}
        exec(code, namespace)
        seen = await namespace["main"]()
    assert seen[0] == "ready"
    assert seen.index("speech_started") < seen.index("speech_ended")
    assert "queued_ms" in seen
