"""The sandboxes' seccomp profile: Docker's default, less the syscalls in DENIED and IP sockets.

Upstream: `data/docker-default-20.10.24.json` is, byte for byte, moby
v20.10.24's `profiles/seccomp/default.json` as Debian bookworm builds it
into docker.io 20.10.24+dfsg1-1+deb12u1 (the engine this project runs on):
the upstream file plus Debian's `engine-seccomp-mipsx.patch` (moby#43005),
which only splits the clone3 ENOSYS rule into a MIPS and a non-MIPS one.
Given as a custom profile, it makes the engine hand runc exactly the
filter the engine's built-in default does (compared on amd64, in the OCI
config, for our capability set and for each capability the profile
names). tests/test_seccomp.py checks the file against UPSTREAM_SHA256.

What we take out, and why (DENIED): each of those syscalls is removed from
the profile's allow rules and answered with ENOSYS by a rule of our own, as
if the kernel were built without it. ENOSYS rather than the profile's
default EPERM because it is what software probes for and falls back on:
libuv (Node) and liburing users take a failed io_uring_setup as "no
io_uring" and use threads; libaio users take ENOSYS from io_setup as "no
kernel AIO" (glibc's POSIX AIO never calls it: it uses threads); a
memfd_secret caller sees a kernel without secretmem. (Landlock, denied here
until the agent began to scope each run's abstract Unix sockets with it, is
allowed again: it only ever restricts its caller.) MIPS numbers errnos
its own way (ENOSYS is 89 there), so the rule comes in a MIPS and a
non-MIPS variant, as upstream's clone3 rule does.

socket(2) is allowed for AF_UNIX (SOCKET_FAMILY) and netlink's sock_diag
(SOCK_DIAG) only, and socketcall(2), the multiplexer of 32-bit x86 (and of
s390 and powerpc), which a filter cannot look into, is refused, unless the
daemon's `sandbox.loopback` is set.

The filter knows each host's native architecture only, not the 32-bit and
x32 ones upstream adds (archMap's subArchitectures): an x86-64 process
reaches 32-bit x86's table with `int 0x80`, and there libseccomp turns the
AF_UNIX rule into one for socketcall that no longer checks the family (a
run made an AF_INET socket so, with socketcall itself refused). A call
through another architecture's table is refused as runc answers any
architecture the filter does not name. No verifier needs 32-bit code.

Nothing else differs from upstream: same default action (EPERM), same
capability-, architecture- and kernel-conditional rules. On an engine
newer than 20.10 this profile replaces that engine's own default, so a
syscall a later default allows and 20.10.24's does not (pkey_*,
fchmodat2, cachestat, ...) is refused as on 20.10: EPERM, or ENOSYS from
runc for numbers above the profile's highest (futex_waitv).

`python -m sandboxd.seccomp` prints the profile the sandboxes get.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

UPSTREAM_FILE = Path(__file__).parent / "data" / "docker-default-20.10.24.json"
UPSTREAM_SHA256 = "e5e91f884647e7332b3f89280777752f563df4f1372a186f14ddb7bf2f55cf61"

_AIO = ("Kernel AIO: contexts are counted host-wide against fs.aio-max-nr (65,536); a job that holds them all "
        "makes io_setup fail for every process on the host (red-team finding).")
_URING = ("io_uring: a large kernel surface behind many container escapes, whose operations seccomp cannot "
          "filter; no verifier needs it (Docker 25.0's default drops it too: moby#46762, containerd#9320).")
DENIED: dict[str, str] = {
    "io_setup": _AIO,
    "io_submit": _AIO,
    "io_getevents": _AIO,
    "io_pgetevents": _AIO,
    "io_pgetevents_time64": _AIO,
    "io_cancel": _AIO,
    "io_destroy": _AIO,
    "io_uring_setup": _URING,
    "io_uring_enter": _URING,
    "io_uring_register": _URING,
    "memfd_secret": ("Secret memory is taken out of the kernel's direct map, which splits the map's huge pages "
                     "for the whole host, and cannot be swapped; no verifier needs it."),
}

# The address family socket(2) allows (and SOCK_DIAG); the others get EPERM, the
# profile's default action. IP: the sandbox has no network but its
# loopback, which every job of the sandbox shares, so a run listening on
# 127.0.0.1 (TCP or UDP) could be reached by another job's run beside it:
# two completions of one prompt passing outputs, or one session reading
# another's. (Abstract Unix sockets, the other shared namespace, are scoped
# per run with Landlock: agent/forked/worker.py.) The rest pin memory no
# process maps where the agent cannot count it (agent/host/kernelmem.py
# counts Unix sockets): a netlink socket of any uid queues 8 MiB of replies
# it never reads where rmem_max is 4 MiB, and one sent over a Unix socket
# and closed is in no process's table; and each family is kernel code a run
# could reach. No verifier needs them: glibc's getaddrinfo takes a failed
# netlink socket as "IPv4 and IPv6 both configured", and if_nameindex fails.
# Netlink's sock_diag is the exception (SOCK_DIAG).
SOCKET_FAMILY = 1  # AF_UNIX
# (AF_NETLINK, NETLINK_SOCK_DIAG): the agent, under this filter too, reads each run's Unix sockets with it
# (agent/host/kernelmem.py). A run's own such socket queues replies as any netlink socket does: the agent
# counts each one a run holds as a full receive buffer.
SOCK_DIAG = (16, 4)
# Refused with socket(2): it carries socket(2)'s family in memory a filter cannot read.
SOCKET_MULTIPLEXER = "socketcall"

ENOSYS = 38
# MIPS numbers errnos its own way; upstream's clone3 rules name these arches (typo included).
ENOSYS_MIPS = 89
MIPS_ARCHES = ["mips3l64n32", "mips64", "mips64n32", "mipsel", "mipsel64"]


def upstream() -> dict[str, Any]:
    """Docker's default profile (see the module's docstring), as parsed JSON."""
    return json.loads(UPSTREAM_FILE.read_bytes())


def _deny_rule(errno: int, comment: str, **conditions: dict[str, list[str]]) -> dict[str, Any]:
    return {"names": sorted(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno, "args": [],
            "comment": comment, "includes": conditions.get("includes", {}), "excludes": conditions.get("excludes", {})}


def _socket_rules() -> list[dict[str, Any]]:
    """socket(2) allowed for SOCKET_FAMILY, and for NETLINK_SOCK_DIAG; everything else falls to the default action."""
    comment = "sandboxd: socket() for AF_UNIX and netlink's sock_diag only (see sandboxd/seccomp.py)"

    def equal(index: int, value: int) -> dict[str, Any]:
        return {"index": index, "value": value, "valueTwo": 0, "op": "SCMP_CMP_EQ"}

    return [{"names": ["socket"], "action": "SCMP_ACT_ALLOW", "comment": comment, "includes": {}, "excludes": {},
             "args": args} for args in ([equal(0, SOCKET_FAMILY)],
                                        [equal(0, SOCK_DIAG[0]), equal(2, SOCK_DIAG[1])])]


def build(base: dict[str, Any], *, loopback: bool = False) -> dict[str, Any]:
    """`base` for native architectures only, without DENIED in any rule, plus the rules that answer them with
    ENOSYS, and socket(2) for SOCKET_FAMILY and SOCK_DIAG only, without SOCKET_MULTIPLEXER (as upstream, every
    family, with `loopback`)."""
    profile = copy.deepcopy(base)
    for arch in profile["archMap"]:
        arch["subArchitectures"] = []
    refused = set(DENIED) | (set() if loopback else {"socket", SOCKET_MULTIPLEXER})
    rules = []
    for rule in profile["syscalls"]:
        rule["names"] = [name for name in rule["names"] if name not in refused]
        if rule["names"]:
            rules.append(rule)
    why = "sandboxd: ENOSYS for kernel AIO, io_uring and memfd_secret (see sandboxd/seccomp.py)"
    rules.append(_deny_rule(ENOSYS, f"{why}, on non-mips architectures", excludes={"arches": MIPS_ARCHES}))
    rules.append(_deny_rule(ENOSYS_MIPS, f"{why}, on mips architectures", includes={"arches": MIPS_ARCHES}))
    if not loopback:
        rules.extend(_socket_rules())
    profile["syscalls"] = rules
    return profile


@functools.cache
def profile_json(*, loopback: bool = False) -> str:
    """The profile as compact JSON: what `security_opt=["seccomp=..."]` carries to the engine."""
    return json.dumps(build(upstream(), loopback=loopback), separators=(",", ":"))


if __name__ == "__main__":
    print(json.dumps(json.loads(profile_json()), indent=1))
