"""Shared pieces of the benchmark suite: targets, tables, machine description."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A benchmark's JSON-able result.
Result = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One target checked by a benchmark: PASS when ``ok``, MISS otherwise."""

    name: str
    value: float
    limit: float
    higher_is_better: bool
    unit: str = ""

    @property
    def ok(self) -> bool:
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def as_json(self) -> Result:
        return {
            "name": self.name,
            "value": round(self.value, 4),
            "limit": self.limit,
            "op": ">=" if self.higher_is_better else "<=",
            "pass": self.ok,
        }

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "PASS" if self.ok else "MISS"
        value, limit = f"{self.value:.3f}{self.unit}", f"{self.limit:g}{self.unit}"
        return f"  target {self.name}: {value} {op} {limit}  {verdict}"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a Markdown table (so it can be pasted into the docs' performance pages as is)."""
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(_cell(v) for v in row) + " |")


def print_targets(targets: Sequence[Target]) -> None:
    print()
    for target in targets:
        print(target.line())


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def machine() -> Result:
    """What the figures were measured on."""
    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_average": os.getloadavg(),
    }


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (default: this one) from ``/proc``."""
    statm = Path(f"/proc/{pid or os.getpid()}/statm").read_text().split()
    return int(statm[1]) * os.sysconf("SC_PAGE_SIZE")


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    import numpy as np

    if not values:
        return [float("nan")] * len(qs)
    return [float(np.percentile(np.asarray(values), q)) for q in qs]


def per_call_ms(fn: Callable[[], object], repeat: int, rounds: int = 3) -> float:
    """Best-of-``rounds`` mean time of ``fn`` over ``repeat`` calls, in ms."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1000.0
