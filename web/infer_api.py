"""Raw batch inference: ``POST /v1/infer/{model_id}?batch_size=N``.

For deployments that composite elsewhere. The body is ``N`` visual inputs (float32,
little-endian, ``[6,S,S]`` each, already scaled as the model expects) followed by ``N``
audio windows (float32 ``audio_shape`` each, ``[32,16,16]`` for unet_328). The answer is
``N`` raw outputs (float32 ``[3,S,S]``, channel-planar), with the device and timing in
``X-Lipstream-*`` headers. Requests larger than the model's batch size are split.
"""

from __future__ import annotations

import math
import time

import numpy as np
from aiohttp import web

from inference_core.avatars.package import check_avatar_id
from web.app_keys import CORE, SETTINGS
from web.errors import RequestError
from web.request_body import read_limited, validate
from web.schemas import InferQuery

_F32 = np.dtype("<f4")
_WRITE_CHUNK = 1 << 20


async def infer(request: web.Request) -> web.StreamResponse:
    """Run a raw batch through the model; see the module docstring for the wire format."""
    model_id = check_avatar_id(request.match_info["model_id"])
    n = validate(InferQuery, dict(request.query)).batch_size
    core = request.app[CORE]
    timeout_s = request.app[SETTINGS].server.request_timeout_s
    async with await core.open(model_id) as model:
        spec = model.spec
        visual_shape = (n, *spec.visual_shape)
        audio_shape = (n, *spec.audio_shape)
        visual_bytes = math.prod(visual_shape) * 4
        expected = visual_bytes + math.prod(audio_shape) * 4
        declared = request.content_length
        if declared is not None and declared != expected:
            raise RequestError(
                400 if declared < expected else 413,
                "bad_body_size",
                f"body must be exactly {expected} bytes for batch_size={n} "
                f"({n}x{list(spec.visual_shape)} + {n}x{list(spec.audio_shape)} float32), "
                f"got Content-Length {declared}",
            )
        body = await read_limited(request, expected, f"the body for batch_size={n}")
        if len(body) != expected:
            raise RequestError(
                400,
                "bad_body_size",
                f"body must be exactly {expected} bytes for batch_size={n}, got {len(body)}",
            )
        visual = np.frombuffer(body, _F32, math.prod(visual_shape)).reshape(visual_shape)
        audio = np.frombuffer(body, _F32, offset=visual_bytes).reshape(audio_shape)
        if not (np.isfinite(visual).all() and np.isfinite(audio).all()):
            raise RequestError(400, "bad_values", "inputs must be finite numbers (no NaN/inf)")
        started = time.perf_counter()
        outputs = await model.infer(
            visual.astype(np.float32), audio.astype(np.float32), timeout_s=timeout_s, raw=True
        )
        elapsed_ms = (time.perf_counter() - started) * 1000
        device = model.device.name
    payload = memoryview(outputs.astype(_F32, copy=False).tobytes())
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "X-Lipstream-Device": device,
            "X-Lipstream-Inference-Ms": f"{elapsed_ms:.2f}",
            "X-Lipstream-Batch-Size": str(n),
            "X-Lipstream-Output-Shape": ",".join(map(str, outputs.shape)),
        }
    )
    response.content_length = len(payload)
    await response.prepare(request)
    # Megabytes of output: write in slices so the transport's flow control paces us.
    for start in range(0, len(payload), _WRITE_CHUNK):
        await response.write(payload[start : start + _WRITE_CHUNK])
    await response.write_eof()
    return response
