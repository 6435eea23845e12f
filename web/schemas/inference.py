"""Raw batch inference: the query of ``POST /v1/infer/{model_id}`` (its bodies are binary)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import ConfigDict, Field

from web.schemas.base import RequestModel

MAX_REQUEST_FRAMES = 32


class InferQuery(RequestModel):
    # Query values are strings: "2" is read as the integer 2.
    model_config = ConfigDict(strict=False)

    noun = "query parameter"
    missing_code = "missing_batch_size"
    wrong_type_code = "bad_batch_size"
    value_codes: ClassVar[Mapping[str, str]] = {"batch_size": "bad_batch_size"}

    batch_size: int = Field(
        ge=1, le=MAX_REQUEST_FRAMES, description="`N`, the number of frames in the body."
    )
