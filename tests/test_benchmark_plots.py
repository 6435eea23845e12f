"""benchmarks/plots.py: figures from a results JSON with the benchmark modules' shapes.

The results are hand-written, but every key in them is checked against the dict keys the
benchmark module itself writes (its source), so a renamed key fails here first.
"""

from __future__ import annotations

import ast
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from benchmarks import plots, run

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SVG = "{http://www.w3.org/2000/svg}"


def _step(calls: int, cores: float, min_fps: float, ok: bool = True) -> dict[str, Any]:
    return {
        "calls": calls,
        "min_fps": min_fps,
        "mean_fps": min_fps + 0.4,
        "delay_grows": False,
        "server_cores": cores,
        "pass": ok,
        "dropped": 0,
    }


def _window(p50: float, p95: float) -> dict[str, Any]:
    return {
        "frames": 500,
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p95 + 5,
        "max_ms": p95 + 20,
        "dropped": {},
        "client_fps": [24.9],
        "delay_ms": 190.0,
        "lookahead_ms": 120.0,
        "server_cpu_s_per_s": 0.3,
    }


def _sessions_row(ratio: float, batch: float) -> dict[str, Any]:
    return {
        "raw_fps": 100.0,
        "served_fps": 100.0 * ratio,
        "ratio": ratio,
        "ratio_of_totals": ratio,
        "round_ratios": [ratio],
        "mean_batch": batch,
        "expired": 0,
        "rejected": 0,
    }


def _model(sweep: dict[int, float], ratios: dict[int, float]) -> dict[str, Any]:
    return {
        "sweep_fps": sweep,
        "best_batch": max(sweep, key=lambda b: sweep[b]),
        "sessions": {n: _sessions_row(r, min(n, 4.0)) for n, r in ratios.items()},
        "fixed_ms_per_frame": 0.05,
        "run_batch_ms": 1.05,
        "run_ms": 1.0,
    }


def _target(name: str, value: float, limit: float) -> dict[str, Any]:
    return {"name": name, "value": value, "limit": limit, "op": ">=", "pass": value >= limit}


def _gpu_row(raw: float, ratio: float) -> dict[str, float]:
    return {"raw_fps": raw, "served_fps": raw * ratio, "ratio": ratio}


RESULTS: dict[str, Any] = {
    "machine": {"cpu": "Test CPU", "cpus": 2, "date": "2026-11-26 05:00 UTC"},
    "quick": True,
    "sessions_per_core": {
        "sizes": {
            "854x480": {
                "steps": [_step(1, 0.21, 24.8), _step(2, 0.43, 24.7), _step(3, 0.66, 21.3, False)],
                "max_sessions": 2,
                "sessions_per_server_core": 4.65,
            },
            "1280x720": {
                "steps": [_step(1, 0.31, 24.9), _step(2, 0.77, 22.2, False)],
                "max_sessions": 1,
                "sessions_per_server_core": 3.2,
            },
        },
        "seconds": 6.0,
        "targets": [_target("720p sessions per server core", 3.2, 4.0)],
    },
    "delay": {
        "seconds": 8.0,
        "calls": {1: [_window(11.5, 17.25)], 4: [_window(23.5, 41.75), _window(25.0, 44.5)]},
        "median_p95_ms": {1: 17.25, 4: 43.125},
        "targets": [_target("p95 server-added delay, 1 call(s), median window", 17.25, 60.0)],
    },
    "core_throughput": {
        "models": {
            "benchmark_unet": _model({1: 8.5, 2: 9.25, 4: 9.75, 8: 9.5}, {1: 0.871, 8: 0.963}),
            "demo_model": _model({1: 610.0, 2: 930.0, 4: 1210.0, 8: 1420.0}, {1: 0.512, 8: 0.947}),
        },
        "rounds": 3,
        "seconds": 2.0,
        "width": 32,
        "bytes_per_frame": {"uint8": 650000, "float_path": 2600000},
        "targets": [_target("benchmark_unet served/raw at 8 sessions", 0.963, 0.95)],
    },
    "gpu": {
        "throughput": {
            "fp32": {1: _gpu_row(400.0, 0.912), 8: _gpu_row(2900.0, 0.957)},
            "fp16": {1: _gpu_row(450.0, 0.903), 8: _gpu_row(5100.0, 0.946)},
        },
        "memory": {"bench-unet": {"mb_per_model": 120.0, "models_per_gpu": 1100.0}},
        "not_measured": {},
        "nvenc": "listed but does not open",
        "targets": [_target("fp32 served/raw at batch 8", 0.957, 0.9)],
    },
}

#: benchmark module → the result dicts in RESULTS whose keys it must write
EXPECTED_FILES = {
    "sessions_per_core": "capacity.svg",
    "delay": "delay.svg",
    "core_throughput": "served_raw.svg",
    "gpu": "gpu_served_raw.svg",
}


def _written_keys(module: str) -> set[str]:
    """Every string used as a dict-literal key in ``benchmarks/<module>.py``."""
    tree = ast.parse((BENCHMARKS / f"{module}.py").read_text())
    return {
        key.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        for key in node.keys
        if isinstance(key, ast.Constant) and isinstance(key.value, str)
    }


def _record_dicts(name: str) -> Iterator[Mapping[str, Any]]:
    """The result's dicts with fixed keys (not those keyed by a size, model or count)."""
    r = RESULTS[name]
    yield r
    if name == "sessions_per_core":
        for size in r["sizes"].values():
            yield size
            yield from size["steps"]
    elif name == "delay":
        for windows in r["calls"].values():
            yield from windows
    elif name == "core_throughput":
        for model in r["models"].values():
            yield model
            yield from model["sessions"].values()
    elif name == "gpu":
        for table in r["throughput"].values():
            yield from table.values()


@pytest.mark.parametrize("name", EXPECTED_FILES)
def test_synthetic_results_use_the_modules_keys(name: str) -> None:
    written = _written_keys(name)
    for record in _record_dicts(name):
        assert set(record) - {"targets"} <= written, f"{name} does not write {set(record)}"


def _texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()).strip() for t in root.iter(f"{SVG}text") if "".join(t.itertext())]


@pytest.fixture
def results_json(tmp_path: Path) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(RESULTS))  # integer keys become strings, as in a real run
    return path


def test_every_figure_from_a_results_file(results_json: Path) -> None:
    out = results_json.parent / "figures"
    assert plots.main([str(results_json), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(EXPECTED_FILES.values())

    capacity = _texts(out / "capacity.svg")
    assert {"0.21", "0.43", "0.66", "0.31", "0.77"} <= set(capacity)  # cores per step
    assert {"24.8", "21.3", "22.2"} <= set(capacity)  # min fps per step
    assert any("Test CPU, 2 CPUs, 2026-11-26 05:00 UTC (--quick)" in t for t in capacity)

    delay = _texts(out / "delay.svg")
    assert {"11.5", "17.2", "22.2", "37.2", "41.8", "44.5", "64.5"} <= set(delay)
    assert {"p50", "p95", "p99", "max"} <= set(delay)
    assert "p95 target 60 ms" in delay

    served = _texts(out / "served_raw.svg")
    assert {"8.5", "9.8", "1420.0"} <= set(served)  # the raw sweep
    assert {"0.871", "0.963", "0.512", "0.947", "batch 1.0", "batch 4.0"} <= set(served)
    assert "benchmark_unet target 0.95" in served

    gpu = _texts(out / "gpu_served_raw.svg")
    assert {"0.912", "0.957", "0.903", "0.946"} <= set(gpu)


def test_png_next_to_the_json(results_json: Path) -> None:
    assert plots.main([str(results_json), "--format", "png"]) == 0
    for name in EXPECTED_FILES.values():
        png = (results_json.parent / name).with_suffix(".png")
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 10_000


def test_in_memory_results_plot_the_same(tmp_path: Path) -> None:
    written = plots.write_plots(RESULTS, tmp_path)
    assert [p.name for p in written] == list(EXPECTED_FILES.values())


def test_only_the_benchmarks_in_the_json(tmp_path: Path) -> None:
    partial = {
        "machine": RESULTS["machine"],
        "delay": RESULTS["delay"],
        "gpu": {"skipped": "CUDA is not available"},
    }
    written = plots.write_plots(json.loads(json.dumps(partial)), tmp_path)
    assert [p.name for p in written] == ["delay.svg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["delay.svg"]


def test_nothing_to_plot_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"machine": RESULTS["machine"], "memory": {}}))
    assert plots.main([str(path)]) == 0
    assert "nothing to plot" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [path]


def test_the_suite_plots_next_to_its_json(
    results_json: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run._plot(results_json)
    assert sorted(p.name for p in results_json.parent.glob("*.svg")) == sorted(
        EXPECTED_FILES.values()
    )
    assert "plot: " in capsys.readouterr().out


def test_without_matplotlib_a_message_not_a_traceback(
    results_json: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None: import raises ImportError
    with pytest.raises(plots.PlotsUnavailableError, match=r"pip install 'lipstream\[plots\]'"):
        plots.write_plots(RESULTS, results_json.parent)
    assert plots.main([str(results_json)]) == 1
    assert "pip install 'lipstream[plots]'" in capsys.readouterr().err
    run._plot(results_json)  # the suite's run has written its JSON: it says, and goes on
    assert "no plots: plots need matplotlib" in capsys.readouterr().out
    assert not list(results_json.parent.glob("*.svg"))
