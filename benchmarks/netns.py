"""A caller's own network namespace, linked to this one by a veth pair, and its link shaped.

The namespace plays a caller somewhere else on a network: :func:`client_namespace` makes
it (root is needed; CI runs as root), :meth:`Namespace.command` runs a program inside it,
and the link between the two ends is what the tests and ``benchmarks/network.py`` make
slow or lossy:

- :meth:`Namespace.shape_downlink` caps what leaves this namespace towards the caller
  (server → caller) with a token bucket, ``tc qdisc ... tbf rate R burst B latency L``
  on this end of the veth pair: packets queue up to ``L`` and are then dropped, as at a
  congested link's bottleneck; a small ``burst`` with a short ``latency`` is a shallow
  policer instead;
- :meth:`Namespace.random_loss` drops a fraction of the UDP datagrams at random, both
  ways if asked, with ``iptables -m statistic`` inside the namespace;
- :meth:`Namespace.allow_udp_only_to` leaves a TURN server the only way out (the relay
  tests).

This kernel has ``tbf`` but no ``netem``, so there is no added delay or jitter: the
queue a cap builds is the only delay. Names carry this process's id, so two runs on one
machine do not meet; the namespace and its veth pair are deleted whatever happens.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: Each run takes one /24 out of this range for its veth pair.
SUBNETS = ipaddress.IPv4Network("10.99.0.0/16")
#: The chain random loss rules live in, inside the namespace (flushed by clear_loss).
LOSS_CHAIN = "LIPSTREAM_LOSS"


def run_command(*args: str) -> str:
    """Run ``args``; its stdout, or a RuntimeError with its stderr."""
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Shaping:
    """A token bucket on the link: ``rate_kbit`` with a ``burst_bytes`` bucket, packets
    queued at most ``latency_ms`` before they are dropped."""

    rate_kbit: int
    burst_bytes: int = 15_000
    latency_ms: int = 300

    def tc_args(self) -> tuple[str, ...]:
        return (
            "tbf",
            "rate",
            f"{self.rate_kbit}kbit",
            "burst",
            str(self.burst_bytes),
            "latency",
            f"{self.latency_ms}ms",
        )


@dataclass(frozen=True)
class Namespace:
    """A network namespace whose only link is a veth pair to this namespace."""

    name: str
    host_address: str  # this namespace's end of the veth pair
    client_address: str  # the namespace's end
    host_interface: str  # the name of this namespace's end

    def command(self, *args: str) -> list[str]:
        """``args`` as a command line that runs inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    # -- shaping ----------------------------------------------------------------------

    def shape_downlink(self, shaping: Shaping | None) -> None:
        """Cap what goes to the namespace (None: the link at full speed again)."""
        if shaping is None:
            subprocess.run(
                ["tc", "qdisc", "del", "dev", self.host_interface, "root"],
                capture_output=True,
                check=False,
            )
            return
        run_command(
            "tc", "qdisc", "replace", "dev", self.host_interface, "root", *shaping.tc_args()
        )

    def downlink_drops(self) -> int:
        """Packets the downlink's token bucket dropped since it was set."""
        listing = run_command("tc", "-s", "qdisc", "show", "dev", self.host_interface)
        for line in listing.splitlines():
            fields = line.replace(",", " ").replace(")", " ").split()
            if "dropped" in fields:
                return int(fields[fields.index("dropped") + 1])
        return 0

    def random_loss(
        self, probability: float, *, inbound: bool = True, outbound: bool = True
    ) -> None:
        """Drop UDP datagrams at random with ``probability`` into the namespace
        (``inbound``: server → caller) and out of it (``outbound``); 0 clears it."""
        self.clear_loss()
        if probability <= 0:
            return
        run_command(
            *self.command(
                "iptables", "-A", LOSS_CHAIN, "-p", "udp", "-m", "statistic",
                "--mode", "random", "--probability", f"{probability:.4f}", "-j", "DROP",
            ),
        )  # fmt: skip
        # One rule, jumped to from each direction: each datagram meets it once.
        for chain, on in (("INPUT", inbound), ("OUTPUT", outbound)):
            if on:
                run_command(*self.command("iptables", "-I", chain, "1", "-j", LOSS_CHAIN))

    def clear_loss(self) -> None:
        """No random loss (the loss chain emptied and unhooked)."""
        for chain in ("INPUT", "OUTPUT"):
            while (
                subprocess.run(
                    self.command("iptables", "-D", chain, "-j", LOSS_CHAIN),
                    capture_output=True,
                    check=False,
                ).returncode
                == 0
            ):
                pass
        subprocess.run(self.command("iptables", "-F", LOSS_CHAIN), capture_output=True, check=False)
        subprocess.run(self.command("iptables", "-N", LOSS_CHAIN), capture_output=True, check=False)

    # -- firewall (relay tests) -------------------------------------------------------

    def allow_udp_only_to(self, address: str, port: int) -> None:
        """Drop every UDP datagram in the namespace except to and from ``address:port``.

        TCP stays open (the caller's signalling over HTTP), so the only way media can
        flow is through the server at ``address:port``: a TURN relay.
        """
        for chain, peer, port_option in (("OUTPUT", "-d", "--dport"), ("INPUT", "-s", "--sport")):
            accept = ("-p", "udp", peer, address, port_option, str(port), "-j", "ACCEPT")
            run_command(*self.command("iptables", "-A", chain, *accept))
            run_command(*self.command("iptables", "-A", chain, "-p", "udp", "-j", "DROP"))

    def dropped_udp_packets(self) -> int:
        """UDP datagrams the namespace's firewall dropped so far (both directions)."""
        total = 0
        for chain in ("INPUT", "OUTPUT", LOSS_CHAIN):
            done = subprocess.run(
                self.command("iptables", "-L", chain, "-n", "-v", "-x"),
                capture_output=True,
                text=True,
                check=False,
            )
            for line in done.stdout.splitlines():
                fields = line.split()
                # iptables-nft names the protocol by number, iptables-legacy by name
                if len(fields) > 3 and fields[2] == "DROP" and fields[3] in ("udp", "17"):
                    total += int(fields[0])
        return total


def _free_subnet(start: int) -> ipaddress.IPv4Network:
    """A /24 of :data:`SUBNETS` no address of this namespace is in, trying ``start`` first."""
    in_use = [
        ipaddress.ip_interface(fields[3])
        for line in run_command("ip", "-4", "-o", "addr", "show").splitlines()
        if len(fields := line.split()) > 3
    ]
    subnets = list(SUBNETS.subnets(new_prefix=24))[1:]
    for offset in range(len(subnets)):
        subnet = subnets[(start + offset) % len(subnets)]
        if not any(interface.ip in subnet for interface in in_use):
            return subnet
    raise RuntimeError(f"every /24 of {SUBNETS} is in use on this machine")


@contextlib.contextmanager
def client_namespace(tag: str) -> Iterator[Namespace]:
    """A fresh namespace ``<tag>-<pid>`` linked by a veth pair; deleted on exit."""
    pid = os.getpid()
    name = f"{tag}-{pid}"
    # interface names: <= 15 chars; the tag's first letter keeps two of one process apart
    host_end, client_end = f"ls{tag[:1]}{pid}h", f"ls{tag[:1]}{pid}c"
    subnet = _free_subnet(pid)
    host, client = (str(address) for address in list(subnet.hosts())[:2])
    setup: Sequence[tuple[str, ...]] = (
        ("ip", "netns", "add", name),
        ("ip", "link", "add", host_end, "type", "veth", "peer", "name", client_end),
        ("ip", "link", "set", client_end, "netns", name),
        ("ip", "addr", "add", f"{host}/24", "dev", host_end),
        ("ip", "link", "set", host_end, "up"),
        ("ip", "-n", name, "addr", "add", f"{client}/24", "dev", client_end),
        ("ip", "-n", name, "link", "set", client_end, "up"),
        ("ip", "-n", name, "link", "set", "lo", "up"),
    )
    try:
        for args in setup:
            run_command(*args)
        namespace = Namespace(name, host, client, host_end)
        namespace.clear_loss()  # creates the (empty) loss chain
        yield namespace
    finally:
        # Deleting the namespace deletes its end of the pair, and with it this end; the
        # explicit delete covers a failure before the client end moved into it.
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", host_end], capture_output=True, check=False)
