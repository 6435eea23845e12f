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
model's batch size are split. The request goes through the same door as the standard
protocols' (``web/inference/door.py``).
"""

from __future__ import annotations

import numpy as np
from aiohttp import web

from inference_core.avatars.package import check_avatar_id
from web.app_keys import DOOR
from web.errors import RequestError
from web.inference.contract import frames
from web.request_body import read_buffer, validate
from web.schemas import InferQuery

FLOAT_TYPE = "application/octet-stream"
UINT8_TYPE = "application/vnd.lipstream.uint8"
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
    door = request.app[DOOR]
    contract = await door.infer_contract(
        model_id, "uint8" if content_type == UINT8_TYPE else "float"
    )
    visual, audio = contract.inputs
    visual_bytes = n * visual.frame_bytes
    expected = n * contract.frame_bytes
    what = (
        f"{n}x{list(visual.frame_shape)} {visual.dtype.name} + "
        f"{n}x{list(audio.frame_shape)} float32"
    )
    declared = request.content_length
    if declared is not None and declared != expected:
        raise RequestError(
            400 if declared < expected else 413,
            "bad_body_size",
            f"body must be exactly {expected} bytes for batch_size={n} ({what}), "
            f"got Content-Length {declared}",
        )
    body = await read_buffer(request, expected, f"the body for batch_size={n}")
    if len(body) != expected:
        raise RequestError(
            400,
            "bad_body_size",
            f"body must be exactly {expected} bytes for batch_size={n}, got {len(body)}",
        )
    view = memoryview(body)
    parts = {visual.name: view[:visual_bytes], audio.name: view[visual_bytes:]}
    result = await door.infer(contract, *frames(contract, n, parts))
    outputs = result.outputs
    payload = np.ascontiguousarray(outputs).data.cast("B")
    response = web.StreamResponse(
        headers={
            "Content-Type": content_type,
            "X-Lipstream-Device": result.device,
            "X-Lipstream-Inference-Ms": f"{result.elapsed_ms:.2f}",
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
