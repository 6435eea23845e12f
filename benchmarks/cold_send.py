"""What a datagram's send costs when the process wakes up for it, against in a burst.

    .venv/bin/python -m benchmarks.cold_send [--wakeups 300] [--rounds 5]

A listening call's packets leave one or two at a time: each of its tracks sleeps until
its slot (every 20 ms for audio, 40 ms for video, each call on its own clock), wakes, and
sends. This measures the CPU (``time.thread_time``) of ``sendto`` of a 1,200-byte
datagram on loopback, to a socket another process reads, when a thread wakes every
20 ms and sends a burst of 1, 4 or 20 datagrams (one call's frame; the packets of twenty
calls due at the same tick), and in a tight loop. Rounds alternate the order. On the
2-core development VM the first send after a sleep costs many times a warm one (caches
and the kernel's path gone cold), so how many packets share a wake-up decides what a
packet costs (``docs/performance/networks.md``). Not a test.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

from benchmarks.common import machine, print_table

DATAGRAM = bytes(1200)
BURSTS = (1, 4, 20)
GAP_S = 0.020

_READER = """
import socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
while True:
    sock.recv(2048)
"""


def _burst_cost(tx: socket.socket, address: tuple[str, int], burst: int, wakeups: int) -> float:
    """µs of CPU per datagram, ``burst`` datagrams per wake-up every :data:`GAP_S`."""
    spent = 0.0
    for _ in range(wakeups):
        time.sleep(GAP_S)
        start = time.thread_time()
        for _ in range(burst):
            tx.sendto(DATAGRAM, address)
        spent += time.thread_time() - start
    return spent / (burst * wakeups) * 1e6


def _tight_cost(tx: socket.socket, address: tuple[str, int], count: int) -> float:
    start = time.thread_time()
    for _ in range(count):
        tx.sendto(DATAGRAM, address)
    return (time.thread_time() - start) / count * 1e6


def run(wakeups: int, rounds: int) -> dict[str, list[float]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(rx.fileno())], pass_fds=[rx.fileno()]
    )
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = rx.getsockname()
    results: dict[str, list[float]] = {}
    try:
        cases = [f"{b} per wake-up" for b in BURSTS] + ["tight loop"]
        for r in range(rounds):
            for case in cases if r % 2 == 0 else cases[::-1]:
                if case == "tight loop":
                    cost = _tight_cost(tx, address, 20 * wakeups)
                else:
                    cost = _burst_cost(tx, address, int(case.split()[0]), wakeups)
                results.setdefault(case, []).append(cost)
    finally:
        reader.kill()
        reader.wait()
    return results


def _rounds(values: list[float]) -> str:
    return " ".join(f"{x:.1f}" for x in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wakeups", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = run(args.wakeups, args.rounds)
    tight = statistics.median(results["tight loop"])
    print_table(
        f"sendto of 1,200 bytes on loopback, CPU per datagram ({machine()})",
        ["case", "µs / datagram (median)", "rounds", "vs tight loop"],
        [
            [
                case,
                statistics.median(v),
                " ".join(f"{x:.1f}" for x in v),
                statistics.median(v) / tight,
            ]
            for case, v in results.items()
        ],
    )


if __name__ == "__main__":
    main()
