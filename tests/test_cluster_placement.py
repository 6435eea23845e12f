"""Placement and session-id routing on numbers (no Ray): which workers a new session is
offered to, in what order, and which worker a session id names; the CLI without Ray."""

from __future__ import annotations

import subprocess
import sys

from config.settings import Settings
from web.cluster.placement import (
    WorkerReport,
    WorkerState,
    candidates,
    parse_session_id,
)
from web.cluster.worker import worker_settings


def _worker(
    name: str,
    models: set[str],
    share: float,
    *,
    places: int = 4,
    answering: bool = True,
    draining: bool = False,
) -> WorkerState:
    report = WorkerReport(
        name=name,
        incarnation="abcd1234",
        url=f"http://127.0.0.1/{name}",
        node="127.0.0.1",
        node_id="n",
        pid=1,
        models=frozenset(models),
        live_sessions=0,
        room_places=places,
        room_share=share,
        draining=draining,
    )
    return WorkerState(name, report, answering=answering)


def test_a_worker_holding_the_model_comes_first_then_the_most_room() -> None:
    workers = [
        _worker("w0", set(), 0.9),
        _worker("w1", {"alice"}, 0.2),
        _worker("w2", {"alice"}, 0.5),
        _worker("w3", {"bob"}, 0.7),
    ]
    assert [w.name for w in candidates("alice", workers)] == ["w2", "w1", "w0", "w3"]
    assert [w.name for w in candidates("carol", workers)] == ["w0", "w3", "w2", "w1"]


def test_full_silent_and_draining_workers_are_not_asked() -> None:
    workers = [
        _worker("w0", {"alice"}, 0.0),  # no resource left
        _worker("w1", {"alice"}, 0.5, places=0),  # at server.max_sessions
        _worker("w2", {"alice"}, 0.5, answering=False),  # missed its report
        _worker("w3", {"alice"}, 0.5, draining=True),
        _worker("w4", set(), 0.1),
        WorkerState("w5"),  # never reported
    ]
    assert [w.name for w in candidates("alice", workers)] == ["w4"]
    assert candidates("alice", workers[:4]) == []


def test_a_session_id_names_its_worker_and_incarnation() -> None:
    address = parse_session_id("w3-0a1b2c3d-Zr_4-x")
    assert address is not None
    assert (address.worker, address.incarnation) == ("w3", "0a1b2c3d")
    # The token may hold the separator; it comes last.
    assert parse_session_id("w0-beef-a-b-c") is not None
    for plain in ("abc", "w0-beef", "w0--tok", "-beef-tok", "w0-beef-"):
        assert parse_session_id(plain) is None, plain
    report = _worker("w7", set(), 0.5).report
    assert report is not None
    assert parse_session_id(report.session_prefix() + "tok") is not None


def test_asking_for_workers_without_ray_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['ray'] = None; from web.cli.main import main; "
        "raise SystemExit(main(['serve', '--workers', '2']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'lipstream[cluster]'" in done.stderr


def test_a_bad_workers_option_names_it() -> None:
    code = "from web.cli.main import main; raise SystemExit(main(['serve', '--workers', '-1']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--workers" in done.stderr


def test_a_worker_keeps_to_its_share_of_the_gpu_memory_cap() -> None:
    settings = Settings.model_validate(
        {
            "devices": {"max_memory_per_device": "8GiB"},
            "server": {"port": 9000, "offer_rate_limit_per_minute": 30},
            "cluster": {"workers": 4, "gpus_per_worker": 0.25, "worker_host": "0.0.0.0"},
        }
    )
    worker = worker_settings(settings)
    assert worker.devices.max_memory_per_device == 2 * 1024**3
    assert worker.server.host == "0.0.0.0"  # the port: the OS's choice when it starts
    assert worker.server.offer_rate_limit_per_minute == 0  # the front limits offers
    assert worker.cluster.workers == 0  # a worker is one process
    whole = Settings.model_validate({"cluster": {"workers": 2, "gpus_per_worker": 1}})
    assert worker_settings(whole).devices.max_memory_per_device is None
