"""Figures from a results JSON of the benchmark suite (the optional ``plots`` extra).

    .venv/bin/python -m benchmarks.plots results.json [--out DIR] [--format svg|png]
    .venv/bin/python -m benchmarks.run --json results.json --plots   # measure, then plot

One file per figure, written next to the JSON unless ``--out`` names a folder, and only
for the benchmarks the JSON holds:

- ``capacity.svg`` (``sessions_per_core``): per frame size, the server cores used and the
  calls' min/mean fps against the number of speaking calls;
- ``delay.svg`` (``delay``): each window's p50/p95/p99/max server-added delay, per call
  count, against the p95 target;
- ``served_raw.svg`` (``core_throughput``): the raw frames/s per batch size of the sweep,
  and served/raw per session count with each row's mean served batch;
- ``gpu_served_raw.svg`` (``gpu``, when it measured): raw and served frames/s and
  served/raw per batch size, per precision.

Matplotlib draws them through its object API (``Figure``, no pyplot state): SVG with its
own writer, PNG with Agg; no display is ever opened. Without matplotlib the functions
raise :class:`PlotsUnavailableError`, whose message says what to install.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import Result

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = (
    "plots need matplotlib, an optional extra: pip install 'lipstream[plots]' "
    "(in a checkout: .venv/bin/pip install -e '.[plots]')"
)
FORMATS = ("svg", "png")


class PlotsUnavailableError(RuntimeError):
    """Matplotlib is not installed; the message says how to add it."""


def write_plots(results: Mapping[str, Any], out_dir: Path, fmt: str = "svg") -> list[Path]:
    """Write a figure per plotted benchmark present in ``results``; return the files.

    ``results`` is what ``benchmarks.run --json`` writes (benchmark name → result), as
    loaded from the file (string keys) or as returned by the modules (integer keys).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: choose one of {', '.join(FORMATS)}")
    figure_class = _figure_class()
    from matplotlib import rc_context

    caption = _caption(results)
    written = []
    for name, (stem, draw) in _PLOTS.items():
        result = results.get(name)
        if not isinstance(result, Mapping) or not _has_data(name, result):
            continue
        # Text as <text> (the JSON's figures stay readable and searchable in the SVG), and
        # fixed element ids, so a re-plot of the same JSON writes the same file.
        with rc_context({"svg.fonttype": "none", "svg.hashsalt": "lipstream"}):
            figure = figure_class(figsize=(11, 4.5), layout="constrained")
            draw(figure, result)
            if caption:
                figure.supxlabel(caption, fontsize=8, color="0.35")
            path = out_dir / f"{stem}.{fmt}"
            out_dir.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, format=fmt, metadata=_metadata(fmt))
        written.append(path)
    return written


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotsUnavailableError(INSTALL_HINT) from exc
    return Figure


def _metadata(fmt: str) -> dict[str, Any]:
    # SVG: drop the date so a re-plot of the same JSON gives the same file
    return {"Date": None} if fmt == "svg" else {}


def _caption(results: Mapping[str, Any]) -> str:
    info = results.get("machine")
    if not isinstance(info, Mapping):
        return ""
    quick = " (--quick)" if results.get("quick") else ""
    return f"{info.get('cpu', '?')}, {info.get('cpus', '?')} CPUs, {info.get('date', '?')}{quick}"


def _has_data(name: str, result: Mapping[str, Any]) -> bool:
    if name == "gpu":  # {"skipped": reason} where there was no CUDA
        return bool(result.get("throughput"))
    return "skipped" not in result


def _by_number(table: Mapping[Any, Any]) -> list[tuple[int, Any]]:
    """A table keyed by a count (int in memory, str once through JSON), in number order."""
    return sorted((int(k), v) for k, v in table.items())


def _label_points(axes: Axes, xs: Sequence[float], ys: Sequence[float], fmt: str) -> None:
    for x, y in zip(xs, ys, strict=True):
        axes.annotate(
            format(y, fmt),
            (x, y),
            textcoords="offset points",
            xytext=(0, 5),
            ha="center",
            fontsize=7,
        )


def _capacity(figure: Figure, result: Mapping[str, Any]) -> None:
    cores, fps = figure.subplots(1, 2)
    for label, size in result["sizes"].items():
        steps = size["steps"]
        calls = [s["calls"] for s in steps]
        used = [s["server_cores"] for s in steps]
        (line,) = cores.plot(calls, used, marker="o", label=label)
        _label_points(cores, calls, used, ".2f")
        failed = [(s["calls"], s["server_cores"]) for s in steps if not s["pass"]]
        if failed:
            cores.plot(*zip(*failed, strict=True), "x", color="red", markersize=10)
        fps.plot(
            calls,
            [s["mean_fps"] for s in steps],
            marker="o",
            color=line.get_color(),
            label=f"{label} mean",
        )
        fps.plot(
            calls,
            [s["min_fps"] for s in steps],
            marker="v",
            linestyle="--",
            color=line.get_color(),
            label=f"{label} min",
        )
        _label_points(fps, calls, [s["min_fps"] for s in steps], ".1f")
    fps.axhline(24, color="red", linewidth=0.8, linestyle=":", label="24 fps floor")
    cores.set(
        xlabel="speaking calls",
        ylabel="server CPU (cores used)",
        title="Server CPU per call count (x: step failed)",
    )
    fps.set(xlabel="speaking calls", ylabel="frames/s received per call", title="Calls' frame rate")
    for axes in (cores, fps):
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(f"Sessions per core (demo avatar, {result.get('seconds', '?')} s per step)")


_PERCENTILES = (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"), ("max_ms", "max"))


def _delay(figure: Figure, result: Mapping[str, Any]) -> None:
    axes = figure.subplots()
    counts = _by_number(result["calls"])
    width = 0.8 / max(1, len(counts))
    for i, (calls, windows) in enumerate(counts):
        for n, window in enumerate(windows):
            xs = [j + (i - (len(counts) - 1) / 2) * width for j in range(len(_PERCENTILES))]
            ys = [float(window[key]) for key, _ in _PERCENTILES]
            axes.plot(
                xs,
                ys,
                marker="o",
                color=f"C{i}",
                alpha=0.9 if n == 0 else 0.5,
                label=f"{calls} call(s)" if n == 0 else None,
            )
            _label_points(axes, xs, ys, ".1f")
    targets = [t for t in result.get("targets", []) if "p95" in t.get("name", "")]
    if targets:
        axes.axhline(
            targets[0]["limit"],
            color="red",
            linewidth=0.8,
            linestyle=":",
            label=f"p95 target {targets[0]['limit']:g} ms",
        )
    axes.set_xticks(range(len(_PERCENTILES)), [label for _, label in _PERCENTILES])
    axes.set(
        ylabel="server-added delay (ms)",
        title="Server-added delay per window (one line per window)",
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def _served_raw(figure: Figure, result: Mapping[str, Any]) -> None:
    sweep, ratio = figure.subplots(1, 2)
    targets = {t["name"]: t for t in result.get("targets", [])}
    for i, (model, m) in enumerate(result["models"].items()):
        batches = _by_number(m["sweep_fps"])
        xs, ys = [b for b, _ in batches], [float(f) for _, f in batches]
        sweep.plot(
            xs, ys, marker="o", color=f"C{i}", label=f"{model} (best batch {m['best_batch']})"
        )
        _label_points(sweep, xs, ys, ".1f")
        rows = _by_number(m["sessions"])
        sessions, ratios = [s for s, _ in rows], [float(r["ratio"]) for _, r in rows]
        ratio.plot(sessions, ratios, marker="o", color=f"C{i}", label=model)
        for s, r in rows:
            ratio.annotate(
                f"{r['ratio']:.3f}\nbatch {r['mean_batch']:.1f}",
                (s, r["ratio"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
            )
        target = targets.get(f"{model} served/raw at 8 sessions")
        if target:
            ratio.axhline(
                target["limit"],
                color=f"C{i}",
                linewidth=0.8,
                linestyle=":",
                label=f"{model} target {target['limit']:g}",
            )
    sweep.set(
        xscale="log",
        yscale="log",
        xlabel="batch size",
        ylabel="raw frames/s",
        title="Raw session.run per batch size",
    )
    sweep.set_xticks([b for b, _ in batches], [str(b) for b, _ in batches])
    sweep.minorticks_off()  # log-scale minor labels such as "3 x 10^0" only clutter
    ratio.set_xticks(sessions, [str(s) for s in sessions])
    ratio.set(
        xlabel="sessions (served batch = mean of the queue)",
        ylabel="served / raw (median round)",
        title="Served through the core / raw",
    )
    for axes in (sweep, ratio):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(f"Inference core efficiency ({result.get('rounds', '?')} rounds)")


def _gpu(figure: Figure, result: Mapping[str, Any]) -> None:
    rates, ratio = figure.subplots(1, 2)
    for i, (precision, table) in enumerate(result["throughput"].items()):
        rows = _by_number(table)
        batches = [b for b, _ in rows]
        rates.plot(
            batches,
            [r["raw_fps"] for _, r in rows],
            marker="o",
            color=f"C{i}",
            label=f"{precision} raw",
        )
        rates.plot(
            batches,
            [r["served_fps"] for _, r in rows],
            marker="v",
            linestyle="--",
            color=f"C{i}",
            label=f"{precision} served",
        )
        ys = [float(r["ratio"]) for _, r in rows]
        ratio.plot(batches, ys, marker="o", color=f"C{i}", label=precision)
        _label_points(ratio, batches, ys, ".3f")
    limits = {t["limit"] for t in result.get("targets", [])}
    for limit in sorted(limits):
        ratio.axhline(limit, color="red", linewidth=0.8, linestyle=":", label=f"target {limit:g}")
    rates.set(
        xscale="log",
        yscale="log",
        xlabel="batch size",
        ylabel="frames/s",
        title="Benchmark UNet on the GPU",
    )
    ratio.set(xscale="log", xlabel="batch size", ylabel="served / raw", title="Served / raw")
    for axes in (rates, ratio):
        axes.minorticks_off()
        axes.set_xticks(batches, [str(b) for b in batches])  # after the scale, which resets them
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)


#: benchmark → (file stem, how to draw it); the order the files are written in
_PLOTS: dict[str, tuple[str, Callable[[Figure, Mapping[str, Any]], None]]] = {
    "sessions_per_core": ("capacity", _capacity),
    "delay": ("delay", _delay),
    "core_throughput": ("served_raw", _served_raw),
    "gpu": ("gpu_served_raw", _gpu),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="what benchmarks.run --json wrote")
    parser.add_argument("--out", type=Path, help="folder for the figures (default: the JSON's)")
    parser.add_argument("--format", choices=FORMATS, default="svg")
    args = parser.parse_args(argv)
    results: Result = json.loads(args.json.read_text())
    try:
        written = write_plots(results, args.out or args.json.parent, args.format)
    except PlotsUnavailableError as exc:
        print(exc, file=sys.stderr)
        return 1
    if not written:
        print(f"nothing to plot in {args.json}: none of {', '.join(_PLOTS)} is in it")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
