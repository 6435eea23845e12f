"""The serving process leaves what start-up made out of the cycle collector's walks
(``web.serve.freeze_startup_heap``): a full collection then walks only what came after,
so it no longer holds the event loop and every call's frames for ~90 ms."""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a process of its own: freezing is process-wide, and the test process must keep
# its collector as it is.
_PROBE = """
import gc, json, time
from config.settings import Settings
from web.app import build_app
from web.serve import freeze_startup_heap

app = build_app(Settings())
tracked = len(gc.get_objects())
frozen = freeze_startup_heap()
garbage = []
for _ in range(1000):  # what calls make later: cycles the collector must still free
    cycle = []
    cycle.append(cycle)
    garbage.append(cycle)
del garbage, cycle
print(json.dumps({"tracked": tracked, "frozen": frozen, "left": len(gc.get_objects()),
                  "collected": gc.collect()}))
"""


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["frozen"] >= 0.9 * figures["tracked"], figures  # start-up's, nearly all
    assert figures["left"] <= 0.05 * figures["tracked"], figures  # what a collection walks
    assert figures["collected"] >= 1000, figures  # cycles made afterwards are freed
