"""Log formatting for the entry point: one line per event, ``key=value`` text or JSON.

Handlers are configured only here, by the CLI; library modules just log.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class TextFormatter(logging.Formatter):
    """``2026-11-22T07:00:00Z level=info logger=x msg="..." key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"{stamp}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={json.dumps(record.getMessage())}",
        ]
        parts += [f"{k}={json.dumps(v, default=str)}" for k, v in _extra(record).items()]
        if record.exc_info:
            parts.append("\n" + self.formatException(record.exc_info))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line with ts, level, logger, msg and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extra(record),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def _extra(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class _LipstreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler this module installed, so a second call replaces only it."""


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send all logs to stderr in the chosen format (replacing a handler set here before)."""
    handler = _LipstreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _LipstreamHandler)]
    root.addHandler(handler)
    root.setLevel(level.upper())
