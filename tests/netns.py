"""A caller's own network namespace, linked to this one by a veth pair, for relay tests.

The namespace plays a caller behind a firewall: :func:`client_namespace` makes it (root
is needed; the tests run as root), :meth:`Namespace.allow_udp_only_to` drops every UDP
datagram except those to and from one address and port (a TURN server's), and
:meth:`Namespace.command` runs a program inside it. Names carry this process's id, so two
runs on one machine do not meet, and the namespace and its veth pair are deleted
whatever happens in the test.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

#: The programs relay tests need, and the Debian package of each.
TOOLS = {"ip": "iproute2", "iptables": "iptables", "turnserver": "coturn"}
#: Each run takes one /24 out of this range for its veth pair.
SUBNETS = ipaddress.IPv4Network("10.99.0.0/16")


def require_tools() -> dict[str, str]:
    """The path of each of :data:`TOOLS`; fail (never skip) naming the packages missing."""
    found = {name: shutil.which(name) for name in TOOLS}
    missing = sorted(TOOLS[name] for name, path in found.items() if path is None)
    if missing:
        pytest.fail(
            f"{', '.join(n for n, p in found.items() if p is None)} not found: run "
            f"`apt-get install -y {' '.join(missing)}` (.ci/run installs them)"
        )
    return {name: path for name, path in found.items() if path is not None}


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Namespace:
    """A network namespace whose only link is a veth pair to this namespace."""

    name: str
    host_address: str  # this namespace's end of the veth pair
    client_address: str  # the namespace's end

    def command(self, *args: str) -> list[str]:
        """``args`` as a command line that runs inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def allow_udp_only_to(self, address: str, port: int) -> None:
        """Drop every UDP datagram in the namespace except to and from ``address:port``.

        TCP stays open (the caller's signalling over HTTP), so the only way media can
        flow is through the server at ``address:port``: a TURN relay.
        """
        for chain, peer, port_option in (("OUTPUT", "-d", "--dport"), ("INPUT", "-s", "--sport")):
            accept = ("-p", "udp", peer, address, port_option, str(port), "-j", "ACCEPT")
            _run(*self.command("iptables", "-A", chain, *accept))
            _run(*self.command("iptables", "-A", chain, "-p", "udp", "-j", "DROP"))

    def dropped_udp_packets(self) -> int:
        """UDP datagrams the namespace's firewall dropped so far (both directions)."""
        total = 0
        for chain in ("INPUT", "OUTPUT"):
            listing = _run(*self.command("iptables", "-L", chain, "-n", "-v", "-x"))
            for line in listing.splitlines():
                fields = line.split()
                # iptables-nft names the protocol by number, iptables-legacy by name
                if len(fields) > 3 and fields[2] == "DROP" and fields[3] in ("udp", "17"):
                    total += int(fields[0])
        return total


def _free_subnet(start: int) -> ipaddress.IPv4Network:
    """A /24 of :data:`SUBNETS` no address of this namespace is in, trying ``start`` first."""
    in_use = [
        ipaddress.ip_interface(fields[3])
        for line in _run("ip", "-4", "-o", "addr", "show").splitlines()
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
    host_end, client_end = f"lsr{pid}h", f"lsr{pid}c"  # interface names: <= 15 chars
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
            _run(*args)
        yield Namespace(name, host, client)
    finally:
        # Deleting the namespace deletes its end of the pair, and with it this end; the
        # explicit delete covers a failure before the client end moved into it.
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", host_end], capture_output=True, check=False)
