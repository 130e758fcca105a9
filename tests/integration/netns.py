"""Network namespaces a test makes for itself: one veth pair each, addresses no route of the host's covers.

The host end of each pair gets the first address of a /30 and the namespace's end the second, so the test
process (in the host's namespace) reaches each namespace's address over its own link and nothing else: no
bridge, no forwarding, no default route inside. Everything is removed on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

# Where the test's subnets are looked for: 10.200.0.0/24 to 10.249.255.0/24, the first /24 that no address or
# route of the host overlaps (private space a network rarely uses this deep; checked, not assumed).
CANDIDATE_SECOND_OCTETS = range(200, 250)


@dataclass(frozen=True)
class Namespace:
    """One namespace: its name, the host end of its link, and the address inside it."""

    name: str
    host_link: str
    host_address: str
    address: str

    def exec_prefix(self) -> tuple[str, ...]:
        """The command prefix that runs a program inside (exec'd in place: the process is the program's)."""
        return ("ip", "netns", "exec", self.name)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def unavailable() -> str:
    """Why namespaces cannot be made here ("" when they can): no `ip`, or no right to make one."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"sbdprobe{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return ""


def _taken() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every IPv4 network the host has an address in or a route to (all tables)."""
    taken = []
    for info in json.loads(_ip("-j", "-4", "addr").stdout or "[]"):
        for addr in info.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        if route.get("dst", "default") != "default":
            taken.append(ipaddress.ip_network(route["dst"], strict=False))
    return taken


def free_subnet(salt: int) -> ipaddress.IPv4Network:
    """A /24 in 10.200-249.x.0 that overlaps nothing of the host's; `salt` (a pid) picks where to start."""
    taken = _taken()
    for second in CANDIDATE_SECOND_OCTETS:
        subnet = ipaddress.IPv4Network(f"10.{second}.{salt % 256}.0/24")
        if not any(subnet.overlaps(network) for network in taken):
            return subnet
    raise RuntimeError("no free 10.x test subnet")


@contextlib.contextmanager
def namespaces(count: int, tag: str) -> Iterator[list[Namespace]]:
    """`count` namespaces named sbd-`tag`-<pid>-<i>, each linked to the host by a veth pair; removed on exit."""
    pid = os.getpid()
    subnet = free_subnet(pid)
    links = list(subnet.subnets(new_prefix=30))
    made: list[Namespace] = []
    try:
        for i in range(count):
            host, inside = list(links[i].hosts())
            # Interface names: 15 characters at most.
            space = Namespace(f"sbd-{tag}-{pid}-{i}", f"sbd{pid % 100000}h{i}", str(host), str(inside))
            peer = f"sbd{pid % 100000}n{i}"
            made.append(space)
            for args in (
                ("netns", "add", space.name),
                ("link", "add", space.host_link, "type", "veth", "peer", "name", peer, "netns", space.name),
                ("addr", "add", f"{host}/30", "dev", space.host_link),
                ("link", "set", space.host_link, "up"),
                ("-n", space.name, "addr", "add", f"{inside}/30", "dev", peer),
                ("-n", space.name, "link", "set", peer, "up"),
                ("-n", space.name, "link", "set", "lo", "up"),
            ):
                done = _ip(*args)
                if done.returncode != 0:
                    raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
        yield made
    finally:
        for space in made:
            _ip("link", "del", space.host_link)  # and its peer with it
            _ip("netns", "del", space.name)
