"""Raw batch inference: ``POST /v1/infer/{model_id}?batch_size=N``.

For deployments that composite elsewhere. Two body types, named by ``Content-Type``:

* ``application/octet-stream`` (the model's own float contract): ``N`` visual inputs
  (float32 little-endian ``[6,S,S]``, already scaled as the model expects) followed by
  ``N`` audio windows (float32 ``audio_shape`` each, ``[32,16,16]`` for unet_328). The
  answer is ``N`` raw outputs (float32 ``[3,S,S]``, channel-planar).
* ``application/vnd.lipstream.uint8`` (what the serving graph takes, a quarter of the
  bytes): ``N`` BGR model regions (uint8 ``[S,S,3]``: the inner ``S×S`` of the crop)
  followed by the ``N`` float32 audio windows. The answer is ``N`` BGR faces (uint8
  ``[S,S,3]``), ready to paste back.

The device and timing come back in ``X-Lipstream-*`` headers. Requests larger than the
model's batch size are split.
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

FLOAT_TYPE = "application/octet-stream"
UINT8_TYPE = "application/vnd.lipstream.uint8"
_F32 = np.dtype("<f4")
_WRITE_CHUNK = 1 << 20


async def infer(request: web.Request) -> web.StreamResponse:
    """Run a raw batch through the model; see the module docstring for the wire formats."""
    model_id = check_avatar_id(request.match_info["model_id"])
    n = validate(InferQuery, dict(request.query)).batch_size
    content_type = request.content_type
    if content_type not in (FLOAT_TYPE, UINT8_TYPE):
        raise RequestError(
            415,
            "bad_content_type",
            f"Content-Type must be {FLOAT_TYPE} (float32 model inputs) or {UINT8_TYPE} "
            f"(uint8 BGR regions), got {content_type!r}",
        )
    uint8 = content_type == UINT8_TYPE
    core = request.app[CORE]
    timeout_s = request.app[SETTINGS].server.request_timeout_s
    async with await core.open(model_id) as model:
        spec = model.spec
        s = spec.input_size
        frame_shape = (s, s, 3) if uint8 else spec.visual_shape
        dtype = np.dtype(np.uint8) if uint8 else _F32
        visual_shape = (n, *frame_shape)
        audio_shape = (n, *spec.audio_shape)
        visual_bytes = math.prod(visual_shape) * dtype.itemsize
        expected = visual_bytes + math.prod(audio_shape) * 4
        what = f"{n}x{list(frame_shape)} {dtype.name} + {n}x{list(spec.audio_shape)} float32"
        declared = request.content_length
        if declared is not None and declared != expected:
            raise RequestError(
                400 if declared < expected else 413,
                "bad_body_size",
                f"body must be exactly {expected} bytes for batch_size={n} ({what}), "
                f"got Content-Length {declared}",
            )
        body = await read_limited(request, expected, f"the body for batch_size={n}")
        if len(body) != expected:
            raise RequestError(
                400,
                "bad_body_size",
                f"body must be exactly {expected} bytes for batch_size={n}, got {len(body)}",
            )
        visual = np.frombuffer(body, dtype, math.prod(visual_shape)).reshape(visual_shape)
        audio = np.frombuffer(body, _F32, offset=visual_bytes).reshape(audio_shape)
        finite = np.isfinite(audio).all() and (uint8 or np.isfinite(visual).all())
        if not finite:
            raise RequestError(400, "bad_values", "inputs must be finite numbers (no NaN/inf)")
        started = time.perf_counter()
        outputs = await model.infer(
            visual if uint8 else visual.astype(np.float32),
            audio.astype(np.float32),
            timeout_s=timeout_s,
            raw=not uint8,
        )
        elapsed_ms = (time.perf_counter() - started) * 1000
        device = model.device.name
    payload = memoryview(outputs.tobytes() if uint8 else outputs.astype(_F32, copy=False).tobytes())
    response = web.StreamResponse(
        headers={
            "Content-Type": content_type,
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
