"""The request and response models: the codes bad input answers, the snapshots they mirror,
and that the OpenAPI document is generated from them (a model change shows in it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonschema
import numpy as np
import pytest
from pydantic import create_model
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from streaming.audio_in.exceptions import AudioInputError
from streaming.audio_in.push import decode_pushed_audio
from streaming.live.snapshot import SessionSnapshot
from tests.snapshots import session_snapshot
from web import openapi
from web.errors import RequestError
from web.request_body import parse_body, validate
from web.schemas import (
    OPERATIONS,
    AudioQuery,
    InferQuery,
    LoadRequest,
    Offer,
    RequestModel,
    ResponseModel,
    Say,
    SessionInfo,
    SessionState,
)

SNAPSHOT = session_snapshot()


@pytest.mark.parametrize(
    ("model", "data", "code", "named"),
    [
        (Offer, {"type": "offer"}, "bad_field", "'sdp' is required"),
        (Offer, {"sdp": 5, "type": "offer"}, "bad_field", "'sdp'"),
        (Offer, {"sdp": "v=0", "type": 5}, "bad_field", "'type'"),
        (Offer, {"sdp": "v=0", "type": "answer"}, "bad_offer", "'offer'"),
        (Offer, {"sdp": "v=0", "type": "offer", "avatar": 7}, "bad_field", "'avatar'"),
        (Offer, {"sdp": "v=0", "type": "offer", "avatar": "Bad.Id"}, "invalid_model_id", "a-z0-9"),
        # The shape first: a wrong type is reported before a wrong value.
        (Offer, {"sdp": "v=0", "type": "answer", "avatar": 7}, "bad_field", "'avatar'"),
        (Say, {}, "bad_field", "'text' is required"),
        (Say, {"text": ["hi"]}, "bad_field", "'text'"),
        (Say, {"text": ""}, "bad_text", "at least 1 character"),
        (Say, {"text": "hi", "voice": "-x"}, "bad_text", "'voice'"),
        (Say, {"text": "hi", "voice": 3}, "bad_field", "'voice'"),
        (LoadRequest, {"device": True}, "bad_device", "integer"),
        (LoadRequest, {"device": "cpu:0"}, "bad_device", "integer"),
        (LoadRequest, {"device": 1.0}, "bad_device", "integer"),
        (LoadRequest, {"device": -1}, "bad_device", "greater than or equal to 0"),
        (InferQuery, {}, "missing_batch_size", "query parameter 'batch_size' is required"),
        (InferQuery, {"batch_size": "x"}, "bad_batch_size", "integer"),
        (InferQuery, {"batch_size": "33"}, "bad_batch_size", "less than or equal to 32"),
    ],
)
def test_bad_input_answers_the_models_code_naming_the_field(
    model: type[RequestModel], data: dict[str, Any], code: str, named: str
) -> None:
    with pytest.raises(RequestError) as info:
        validate(model, data, hint="devices: 0=cpu:0")
    assert (info.value.status, info.value.code) == (400, code)
    assert named in str(info.value)
    assert str(info.value).endswith("(devices: 0=cpu:0)")
    assert code in model.error_codes()


def test_good_input_is_typed_and_unknown_keys_are_ignored() -> None:
    offer = validate(Offer, {"sdp": "v=0", "type": "offer", "avatar": None, "trickle": True})
    assert (offer.sdp, offer.avatar_id) == ("v=0", "demo")
    assert validate(Offer, {"sdp": "v=0", "type": "offer", "avatar": ""}).avatar_id == "demo"
    assert validate(Offer, {"sdp": "v=0", "type": "offer", "avatar": "bob"}).avatar_id == "bob"
    assert validate(Say, {"text": "hi"}).voice is None
    assert validate(LoadRequest, {}).device is None
    assert validate(InferQuery, {"batch_size": "2"}).batch_size == 2


@pytest.mark.parametrize(("body", "message"), [(b"{", "not valid JSON"), (b"[0]", "JSON object")])
def test_a_body_that_is_not_a_json_object_is_bad_json(body: bytes, message: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_body(LoadRequest, body)
    assert (info.value.status, info.value.code) == (400, "bad_json")
    assert message in str(info.value)


def test_session_state_mirrors_the_session_snapshot() -> None:
    snapshot_fields = [f.name for f in dataclasses.fields(SessionSnapshot)]
    assert list(SessionState.model_fields) == snapshot_fields
    state = SessionState.model_validate(SNAPSHOT, from_attributes=True).dump()
    assert state == dataclasses.asdict(SNAPSHOT)  # what the handler sent before the models
    info = SessionInfo.model_validate(SNAPSHOT, from_attributes=True).dump()
    assert info["id"] == "s-1"
    assert set(info) - {"id"} <= set(snapshot_fields)


def test_a_response_that_breaks_its_model_is_refused() -> None:
    broken = dataclasses.replace(SNAPSHOT, state="dancing")
    with pytest.raises(ValueError, match="state"):
        SessionState.model_validate(broken, from_attributes=True)


def _schema_validator(document: dict[str, Any], component: str) -> jsonschema.Validator:
    registry: Registry[Any] = Registry().with_resource(
        "urn:doc", DRAFT202012.create_resource(document)
    )
    schema = {"$ref": f"urn:doc#/components/schemas/{component}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def test_a_model_change_shows_in_the_document(monkeypatch: pytest.MonkeyPatch) -> None:
    response = SessionState.model_validate(SNAPSHOT, from_attributes=True).dump()
    _schema_validator(openapi.openapi_document(), "SessionState").validate(response)

    # The same model without `bitrate_bps`: the document follows, and the real response
    # no longer fits it.
    fields: dict[str, Any] = {
        name: (field.annotation, field)
        for name, field in SessionState.model_fields.items()
        if name != "bitrate_bps"
    }
    shorter = create_model("SessionState", __base__=ResponseModel, **fields)
    operations = tuple(
        dataclasses.replace(
            operation,
            replies=tuple(
                dataclasses.replace(reply, model=shorter) if reply.model is SessionState else reply
                for reply in operation.replies
            ),
        )
        for operation in OPERATIONS
    )
    monkeypatch.setattr(openapi, "OPERATIONS", operations)
    document = openapi.openapi_document()
    assert "bitrate_bps" not in document["components"]["schemas"]["SessionState"]["properties"]
    with pytest.raises(jsonschema.ValidationError, match="bitrate_bps"):
        _schema_validator(document, "SessionState").validate(response)


def _raw(query: dict[str, Any]) -> None:
    params = {"format": "s16le", "rate": "16000", "channels": "1"}
    params.update({name: str(value) for name, value in query.items()})
    body = np.zeros(32 * 64, dtype="<f4").tobytes()  # whole frames for any format and channels
    decode_pushed_audio(body, "application/octet-stream", params)


def test_the_audio_query_model_allows_what_the_decoder_takes() -> None:
    """AudioQuery only documents the raw PCM parameters: it must agree with the decoder."""
    properties = AudioQuery.model_json_schema()["properties"]
    for audio_format in properties["format"]["enum"]:
        _raw({"format": audio_format})
    with pytest.raises(AudioInputError):
        _raw({"format": "s8"})
    for name in ("rate", "channels"):
        low, high = properties[name]["minimum"], properties[name]["maximum"]
        _raw({name: low})
        _raw({name: high})
        for outside in (low - 1, high + 1):
            with pytest.raises(AudioInputError):
                _raw({name: outside})
