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

socket(2) is refused for the address families AF_INET (2) to AF_INET6 (10)
(REFUSED_SOCKET_FAMILIES), unless the daemon's `sandbox.loopback` is set.

Nothing else differs from upstream: same default action (EPERM), same
architectures, same capability-, architecture- and kernel-conditional
rules. On an engine newer than 20.10 this profile replaces that engine's
own default, so a syscall a later default allows and 20.10.24's does not
(pkey_*, fchmodat2, cachestat, ...) is refused as on 20.10: EPERM, or
ENOSYS from runc for numbers above the profile's highest (futex_waitv).

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

# Address families socket(2) refuses (EPERM, the profile's default action):
# the sandbox has no network but its loopback, which every job of the
# sandbox shares. A run listening on 127.0.0.1 (TCP or UDP) could be
# reached by another job's run beside it: two completions of one prompt
# passing outputs, or one session reading another's. No verifier needs IP
# sockets. (Abstract Unix sockets, the other shared namespace, are scoped
# per run with Landlock: agent/forked/worker.py.) The refused range, AF_INET (2) to
# AF_INET6 (10), also holds the legacy AX.25, IPX, AppleTalk, NET/ROM, bridge,
# ATM PVC and X.25 families; AF_UNIX (1) and AF_NETLINK (16, which glibc's
# if_nameindex uses) stay allowed.
REFUSED_SOCKET_FAMILIES = range(2, 11)

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
    """socket(2) allowed for every family below and above REFUSED_SOCKET_FAMILIES (one comparison per rule:
    libseccomp takes no two on one argument), so the families between fall to the default action."""
    low, high = REFUSED_SOCKET_FAMILIES[0], REFUSED_SOCKET_FAMILIES[-1]
    comment = f"sandboxd: socket() for every family but {low}..{high} (AF_INET to AF_INET6; see sandboxd/seccomp.py)"
    return [{"names": ["socket"], "action": "SCMP_ACT_ALLOW", "comment": comment, "includes": {}, "excludes": {},
             "args": [{"index": 0, "value": value, "valueTwo": 0, "op": op}]}
            for value, op in ((low, "SCMP_CMP_LT"), (high, "SCMP_CMP_GT"))]


def build(base: dict[str, Any], *, loopback: bool = False) -> dict[str, Any]:
    """`base` without DENIED in any rule, plus the rules that answer them with ENOSYS, and socket(2) for
    every address family but REFUSED_SOCKET_FAMILIES (for every family, as upstream, with `loopback`)."""
    profile = copy.deepcopy(base)
    refused = set(DENIED) | (set() if loopback else {"socket"})
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
