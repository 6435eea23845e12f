"""The delay budget as a caller reads it: `GET /webrtc-config` and the start-up log.

One figure (``streaming.live.reporting.delay_budget``, ``docs/design/delay.md`` §8),
stated with what a browser adds on top; the `/offer` answer's copy is checked against the
session's own figures in ``tests/test_openapi.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from streaming.live.reporting import BROWSER_EXTRA_MS_TYPICAL
from web.app import build_app
from web.serve import log_delay


def _settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data"), "demo": False},
            **sections,
        }
    )


async def _delay(settings: Settings) -> dict[str, Any]:
    async with TestClient(TestServer(build_app(settings))) as client:
        response = await client.get("/webrtc-config")
        assert response.status == 200, await response.text()
        body = await response.json()
    assert isinstance(body["delay"], dict)
    return body["delay"]


async def test_webrtc_config_states_the_configured_delay_and_the_browsers_part(
    tmp_path: Path,
) -> None:
    delay = await _delay(_settings(tmp_path))
    low, high = BROWSER_EXTRA_MS_TYPICAL
    assert delay == {
        "server_ms": 512.5,
        "lookahead_ms": 452.5,  # audio.right_context 7, 25 fps, unet_328's features
        "tick_ms": 20.0,
        "margin_ms": 40.0,  # session.pipeline_margin_ms
        "browser_extra_ms_low": low,
        "browser_extra_ms_high": high,
    }
    assert delay["server_ms"] == delay["lookahead_ms"] + delay["tick_ms"] + delay["margin_ms"]


async def test_webrtc_config_follows_the_settings(tmp_path: Path) -> None:
    delay = await _delay(
        _settings(
            tmp_path,
            audio={"right_context": 6},  # one row less: 40 ms less lookahead
            session={"pipeline_margin_ms": 95.5},
        )
    )
    assert delay["lookahead_ms"] == 412.5
    assert delay["margin_ms"] == 95.5
    assert delay["server_ms"] == 412.5 + 20.0 + 95.5


def test_the_start_up_log_states_both_parts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    low, high = BROWSER_EXTRA_MS_TYPICAL
    with caplog.at_level(logging.INFO, logger="web.serve"):
        log_delay(_settings(tmp_path, session={"pipeline_margin_ms": 80}))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "web.serve"]
    assert "server_ms=552.5" in line
    assert "pipeline_margin_ms=80.0" in line
    assert f"mic to heard {552.5 + low:.0f}-{552.5 + high:.0f} ms" in line
