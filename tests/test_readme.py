"""The documentation's code examples run as written against a real server.

The guides hold them: the raw inference client, the OIP ``curl`` lines, the tritonclient
and seed clients (``docs/guides/raw-inference.md``) and the Python client's streaming call
(``docs/guides/voice-agents.md``). The switching example of ``docs/guides/calling.md``
runs in ``tests/test_clients_switch.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp.test_utils import TestServer

from config.settings import Settings
from web.app import build_app

REPO = Path(__file__).resolve().parent.parent
RAW_INFERENCE = REPO / "docs/guides/raw-inference.md"
VOICE_AGENTS = REPO / "docs/guides/voice-agents.md"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


async def test_raw_inference_client_example(tmp_path: Path) -> None:
    (example,) = [b for b in _python_blocks(RAW_INFERENCE) if "/v1/infer/" in b]
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
    (example,) = [b for b in _python_blocks(VOICE_AGENTS) if "stream_audio" in b]
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


def _bash_blocks(page: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL)


def _demo_settings(tmp_path: Path) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "devices": {"kind": "cpu", "count": 1},
        }
    )


async def test_inference_protocol_examples(tmp_path: Path) -> None:
    """The OIP curl lines, the tritonclient HTTP + gRPC loop and the seed client's call."""
    from tests.grpc_served import served

    (shell,) = [b for b in _bash_blocks(RAW_INFERENCE) if "request.json" in b]
    (triton,) = [b for b in _python_blocks(RAW_INFERENCE) if "tritonclient" in b]
    (seed,) = [b for b in _python_blocks(RAW_INFERENCE) if "InferBatchRequest" in b]
    async with served(_demo_settings(tmp_path)) as server:
        http = f"127.0.0.1:{server.http.port}"
        rpc = server.address

        def run_shell() -> str:
            script = shell.replace("localhost:8080", http)
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            return done.stdout

        out = await asyncio.to_thread(run_shell)
        lines = out.splitlines()
        meta = json.loads(lines[0])
        assert [i["name"] for i in meta["inputs"]] == ["input", "audio"]
        assert meta["inputs"][0]["shape"] == [-1, 6, 320, 320]
        assert lines[1] in ("200", "400")  # loaded or not yet: both are answers
        assert out.count('"model_name":"demo"') + out.count('"model_name": "demo"') == 1
        assert '"datatype":"UINT8"' in out.replace(" ", "")

        namespace: dict[str, Any] = {}
        code = triton.replace('"127.0.0.1:8080"', repr(http)).replace('"127.0.0.1:8081"', repr(rpc))
        await asyncio.to_thread(exec, code, namespace)
        faces = namespace["faces"]
        assert isinstance(faces, np.ndarray)
        assert faces.shape == (8, 320, 320, 3)
        assert faces.dtype == np.uint8

        protos = str(REPO / "web" / "inference" / "protos")
        code = seed.replace('"-Iweb/inference/protos"', repr(f"-I{protos}"))
        code = code.replace('"127.0.0.1:8081"', repr(rpc))
        namespace = {}
        before = list(sys.path)
        try:
            await asyncio.to_thread(exec, code, namespace)
        finally:
            sys.path[:] = before
        mouths = namespace["mouths"]
        assert isinstance(mouths, list)
        assert len(mouths) == 4
        assert all(m.shape == (3, 320, 320) for m in mouths)
        assert namespace["reply"].gpu_id == -1
