"""The metrics page, written from what ``GET /metrics`` exposes.

The page scrapes a real server: the app ``lipstream serve`` runs (``web.app.build_app``,
default settings on one CPU device, an empty avatar root), started in this process and
asked for ``/metrics`` once through its own handler, with no socket (the build needs no
network, not even loopback). Every family it answers is listed with its type and help
text, in the order the server writes them; a cluster front's own families follow.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from md_writer import code, table

from config.settings import Settings
from web.app import build_app
from web.cluster.aggregate import _Labelled
from web.metrics import serve_metrics

_HELP = re.compile(r"^# HELP (\S+) (.*)$", re.M)
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
# Series prometheus_client adds beside the family a collector declares: not families.
_COMPANIONS = ("_created", "_gcount", "_gsum")


def page() -> str:
    text = asyncio.run(_scrape())
    rows = _families(text)
    front = _families(_front_text())
    return "\n".join(
        [
            "# Metrics\n",
            "Generated from what `GET /metrics` answers: the page scrapes a freshly "
            "started server (one process, one CPU device) while it builds. The format is "
            "Prometheus text 0.0.4; `/metrics` takes no token, so scrape it over a private "
            "network. Labels are device names, fixed reasons and ladder step indexes only: "
            "session and model ids never become labels (per-model figures are in "
            "`GET /admin/models` and `GET /admin/stats`).\n",
            "## One process\n",
            table(("metric", "type", "help"), rows),
            "## A cluster front\n",
            "A front (`lipstream serve --workers N`) answers every worker's series above "
            "with `worker` and `node` labels added, and these of its own:\n",
            table(("metric", "type", "help"), front),
            "The alert rules and the Grafana dashboard that read these series are in "
            "[Monitoring](../operations/monitoring.md).\n",
        ]
    )


async def _scrape() -> str:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        settings = Settings.model_validate(
            {
                "avatars": {"root": str(root / "avatars"), "data_dir": str(root / "data")},
                "devices": {"kind": "cpu", "count": 1},
                "server": {"grpc_port": None},
            }
        )
        app = build_app(settings)
        runner = web.AppRunner(app)
        await runner.setup()  # start-up and cleanup contexts run; no listener is opened
        try:
            answer = await serve_metrics(make_mocked_request("GET", "/metrics", app=app))
        finally:
            await runner.cleanup()
        assert isinstance(answer.body, bytes)
        return answer.body.decode()


def _front_text() -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(_Labelled(SimpleNamespace(workers={}), {}))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def _families(text: str) -> list[tuple[str, str, str]]:
    kinds = dict(_TYPE.findall(text))
    rows = []
    for name, help_text in _HELP.findall(text):
        base = next((name[: -len(s)] for s in _COMPANIONS if name.endswith(s)), None)
        if base is not None and (base in kinds or f"{base}_total" in kinds):
            continue
        rows.append((code(name), kinds.get(name, ""), help_text.replace("\\n", " ")))
    return rows
