"""deploy/: the alert rules and the Grafana dashboard, checked by promtool and a real Prometheus.

``promtool check rules`` and ``promtool test rules`` (a firing and a quiet case per alert)
run on the rules as shipped. Then Debian's ``prometheus``, loading the rules, scrapes every
second a real ``lipstream serve`` that has had a call (so per-device and per-frame series
exist) and a ``lipstream serve --workers 2`` cluster front on a local Ray (its
``lipstream_cluster_*`` and every worker's series, labelled). Every expression of the
dashboard and of the rules goes to its query API: each must parse and name only series
those scrapes exposed; the dashboard's must return data as well, and every rule must
evaluate without an error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp import ClientSession

import lipstream_client as lc
from tests.live_calls import until
from tests.server_process import Server, free_port, lipstream_serve

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "lipstream-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "lipstream-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "lipstream-dashboard.json"
#: Prometheus, a server with a call, and a front on two cores that may be busy.
TIMEOUT_S = 120.0

# Words of PromQL that are not metric names where :func:`metric_names` looks.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
)


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} not found: these tests need Debian's prometheus package "
            "(`.ci/run` installs it: apt-get install prometheus)"
        )
    return found


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_exprs() -> dict[str, str]:
    exprs: dict[str, str] = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            exprs[f"{panel['title']} / {target['refId']}"] = target["expr"]
    return exprs


def concrete(expr: str) -> str:
    """A dashboard expression as Grafana would send it: its intervals a fixed ``1m``, its
    template variables (all ``=~`` matchers) the "All" value ``.*``."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "1m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers that are not functions, keywords,
    label names or durations (strings, matchers, groupings and ranges removed first)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    return set(re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b(?!\s*\()", text)) - _KEYWORDS


def test_metric_names_are_read_out_of_expressions() -> None:
    expr = (
        'sum without (reason) (rate(lipstream_a_total{reason!="x"}[5m])) '
        "/ on (instance) histogram_quantile(0.95, rate(lipstream_b_bucket[1m])) > 0.01 "
        "and lipstream_c > 0"
    )
    assert metric_names(expr) == {"lipstream_a_total", "lipstream_b_bucket", "lipstream_c"}
    assert concrete('rate(x{job=~"$job"}[$__rate_interval])') == 'rate(x{job=~".*"}[1m])'


def test_promtool_checks_the_rules_and_their_unit_cases_pass() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in checked.stdout
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    # Every alert has a test group where it fires (its expected alerts) and a quiet
    # server in the same series (instance good:9000), which must not appear.
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for group in cases
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == set(rule_exprs())
    for group in cases:
        series = " ".join(s["series"] for s in group["input_series"])
        assert set(re.findall(r'instance="([^"]+)"', series)) == {"bad:9000", "good:9000"}
        for case in group["alert_rule_test"]:
            assert all(a["exp_labels"]["instance"] == "bad:9000" for a in case["exp_alerts"])


def test_the_example_prometheus_config_is_valid() -> None:
    checked = promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_is_importable_as_is() -> None:
    board = dashboard()
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["uid"] == "lipstream"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in board["panels"] if p["type"] != "row"]
    assert len(graphs) >= 11
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
    variables = {v["name"] for v in board["templating"]["list"]}
    used = {name for expr in dashboard_exprs().values() for name in re.findall(r"\$(\w+)", expr)}
    assert used - {"__rate_interval"} <= variables


# -- a real Prometheus scraping lipstream --------------------------------------------------


@asynccontextmanager
async def prometheus(tmp_path: Path, targets: dict[str, int]) -> AsyncIterator[ClientSession]:
    """Debian's prometheus on a free port with its own storage, scraping each job's
    ``127.0.0.1:<port>/metrics`` every second and evaluating the rules every second."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
            for job, port in targets.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=out,
            stderr=out,
        )
    try:
        async with ClientSession(base_url=f"http://127.0.0.1:{port}") as http:

            async def ready() -> bool:
                assert proc.returncode is None, log.read_text(errors="replace")
                try:
                    async with http.get("/-/ready") as response:
                        return response.status == 200
                except OSError:
                    return False

            await until(ready, "prometheus to be ready", timeout_s=TIMEOUT_S, poll_s=0.2)
            yield http
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def query(http: ClientSession, expr: str) -> tuple[int, dict[str, Any]]:
    async with http.get("/api/v1/query", params={"query": expr}) as response:
        return response.status, await response.json()


async def scraped_at_least_twice(http: ClientSession, selector: str) -> bool:
    status, body = await query(http, f"count_over_time({selector}[1m])")
    assert status == 200, body
    return any(float(r["value"][1]) >= 2 for r in body["data"]["result"])


@asynccontextmanager
async def cluster_front(tmp_path: Path) -> AsyncIterator[Server]:
    """``lipstream serve --workers 2``: a front on a local Ray runtime with two worker
    processes (as tests/test_cluster_grpc.py starts it), stopped with SIGTERM at the end
    so that Ray's processes go with it."""
    async with lipstream_serve(
        tmp_path, "--workers", "2", server={"drain_timeout_s": 5}, startup_timeout_s=180.0
    ) as front:
        try:
            assert "cluster: 2 of 2 workers up" in front.log()
            yield front
        finally:  # also when the test failed: Ray's processes end with a drained front
            if front.proc.returncode is None:
                front.proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(TIMEOUT_S):
                    await front.proc.wait()
        assert front.proc.returncode == 0, front.log()


async def call_with_speech(server: Server) -> None:
    """A call that hears a pushed second of tone, held until the server has measured its
    CPU per frame (so ``lipstream_cpu_seconds_per_frame`` is exported)."""
    async with await lc.connect(f"http://127.0.0.1:{server.port}", "demo") as call:
        tone = np.sin(np.arange(24_000) / 24_000 * 2 * math.pi * 220).astype(np.float32)
        pushed = await call.push_pcm(tone * 0.5, 24_000)
        assert pushed.duration_ms == pytest.approx(1000, abs=1)

        async def measured() -> bool:
            async with server.http.get("/metrics") as response:
                text = await response.text()
            return (
                "\nlipstream_cpu_seconds_per_frame " in text
                and re.search(r"\nlipstream_frames_inferred_total [1-9]", text) is not None
            )

        await until(measured, "the call's CPU per frame and inferred frames", timeout_s=TIMEOUT_S)


@pytest.mark.slow
async def test_prometheus_scrapes_lipstream_and_every_expression_works(
    tmp_path: Path, loopback: None
) -> None:
    (tmp_path / "server").mkdir()
    (tmp_path / "front").mkdir()
    (tmp_path / "prometheus").mkdir()
    async with (
        lipstream_serve(tmp_path / "server", server={"ice_loopback_only": "true"}) as server,
        cluster_front(tmp_path / "front") as front,
    ):
        await call_with_speech(server)
        targets = {"lipstream": server.port, "lipstream-front": front.port}
        async with prometheus(tmp_path / "prometheus", targets) as http:
            for selector in (
                'lipstream_cpu_seconds_per_frame{job="lipstream"}',
                'lipstream_cluster_workers{job="lipstream-front", state="answering"}',
                'lipstream_device_workers{job="lipstream-front", worker=~".+", node=~".+"}',
            ):
                await until(
                    functools.partial(scraped_at_least_twice, http, selector),
                    f"two scrapes of {selector}",
                    timeout_s=TIMEOUT_S,
                    poll_s=0.5,
                )
            status, answering = await query(http, 'lipstream_cluster_workers{state="answering"}')
            assert status == 200
            assert [r["value"][1] for r in answering["data"]["result"]] == ["2"]
            async with http.get("/api/v1/label/__name__/values") as response:
                names = set((await response.json())["data"])
            exported = {n for n in names if n.startswith("lipstream_")}
            assert "lipstream_device_workers_restarted_total" in exported

            for title, expr in dashboard_exprs().items():
                sent = concrete(expr)
                status, body = await query(http, sent)
                assert (status, body["status"]) == (200, "success"), (title, sent, body)
                assert metric_names(sent) <= exported, (title, metric_names(sent) - exported)
                assert body["data"]["result"], f"{title}: no data for {sent}"
            for alert, expr in rule_exprs().items():
                status, body = await query(http, expr)
                assert (status, body["status"]) == (200, "success"), (alert, body)
                names_read = metric_names(expr)
                assert names_read, alert
                assert names_read <= exported, (alert, names_read - exported)

            # Prometheus loaded the rules and evaluates each without an error.
            async def rules_evaluated() -> list[dict[str, Any]] | None:
                async with http.get("/api/v1/rules") as response:
                    groups = (await response.json())["data"]["groups"]
                rules = [rule for group in groups for rule in group["rules"]]
                return rules if all(r["health"] == "ok" for r in rules) else None

            rules = await until(rules_evaluated, "every rule evaluated", timeout_s=TIMEOUT_S)
            assert {r["name"] for r in rules} == set(rule_exprs())
            assert [r["name"] for r in rules if r.get("lastError")] == []
            # Nothing is wrong with these servers: no alert fires (some may be pending).
            assert [r["name"] for r in rules if r["state"] == "firing"] == []
