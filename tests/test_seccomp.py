"""The sandboxes' seccomp profile: Docker 20.10.24's default, less kernel AIO, io_uring, memfd_secret and IP sockets."""

from __future__ import annotations

import hashlib
import json

from sandboxd import seccomp

# The syscalls the red-team pass found allowed and host-wide (AIO), or surface no verifier needs.
MUST_DENY = {"io_setup", "io_submit", "io_getevents", "io_pgetevents", "io_cancel", "io_destroy",
             "io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_secret"}
# Kept as upstream has them: what glibc, Python, Go, Java and Rust runtimes use; Landlock, which the agent
# scopes each run's abstract Unix sockets with.
MUST_ALLOW = {"read", "write", "openat", "mmap", "clone", "execve", "epoll_wait", "memfd_create", "futex",
              "rseq", "statx", "getrandom", "pidfd_open", "socketpair", "landlock_create_ruleset",
              "landlock_add_rule", "landlock_restrict_self"}


def profile() -> dict:
    return json.loads(seccomp.profile_json())


def names(rules: list[dict], action: str) -> set[str]:
    return {name for rule in rules if rule["action"] == action for name in rule["names"]}


def test_the_upstream_file_is_the_one_the_docstring_names() -> None:
    assert hashlib.sha256(seccomp.UPSTREAM_FILE.read_bytes()).hexdigest() == seccomp.UPSTREAM_SHA256


def test_the_profile_is_json_with_upstreams_defaults() -> None:
    ours, upstream = profile(), seccomp.upstream()
    assert ours["defaultAction"] == upstream["defaultAction"] == "SCMP_ACT_ERRNO"
    assert "defaultErrnoRet" not in ours  # EPERM for anything not named, as upstream
    assert {key: value for key, value in ours.items() if key not in ("syscalls", "archMap")} == \
        {key: value for key, value in upstream.items() if key not in ("syscalls", "archMap")}


def test_the_filter_knows_native_architectures_only() -> None:
    """`int 0x80` reaches 32-bit x86's table from any x86-64 process, where libseccomp turns the AF_UNIX rule into
    a socketcall rule that checks no family: a run made an AF_INET socket so."""
    ours, upstream = profile()["archMap"], seccomp.upstream()["archMap"]
    assert [arch["architecture"] for arch in ours] == [arch["architecture"] for arch in upstream]
    assert {"SCMP_ARCH_X86", "SCMP_ARCH_X32"} <= {sub for arch in upstream for sub in arch["subArchitectures"]}
    assert all(arch["subArchitectures"] == [] for arch in ours)


def test_every_denied_syscall_was_allowed_upstream_and_is_allowed_nowhere_now() -> None:
    assert set(seccomp.DENIED) >= MUST_DENY
    rules = profile()["syscalls"]
    assert set(seccomp.DENIED) <= names(seccomp.upstream()["syscalls"], "SCMP_ACT_ALLOW")
    assert not set(seccomp.DENIED) & names(rules, "SCMP_ACT_ALLOW")
    assert names(rules, "SCMP_ACT_ALLOW") >= MUST_ALLOW


def test_denied_syscalls_get_enosys_on_every_architecture() -> None:
    denials = [rule for rule in profile()["syscalls"] if set(rule["names"]) & set(seccomp.DENIED)]
    assert len(denials) == 2
    for rule in denials:
        assert rule["action"] == "SCMP_ACT_ERRNO"
        assert set(rule["names"]) == set(seccomp.DENIED)
        assert not rule["args"]
        assert not rule["includes"].get("caps") and not rule["excludes"].get("caps")
    other, mips = denials
    assert other["errnoRet"] == 38 and other["excludes"] == {"arches": seccomp.MIPS_ARCHES}
    assert not other["includes"]
    assert mips["errnoRet"] == 89 and mips["includes"] == {"arches": seccomp.MIPS_ARCHES}
    # The same arches upstream's clone3 ENOSYS rules single out.
    clone3 = [rule for rule in seccomp.upstream()["syscalls"] if rule["names"] == ["clone3"]]
    assert {tuple(rule["includes"].get("arches", ())) for rule in clone3} == {(), tuple(seccomp.MIPS_ARCHES)}


def test_everything_else_is_upstreams_rule_by_rule() -> None:
    ours = profile()["syscalls"][:-4]
    upstream = seccomp.upstream()["syscalls"]
    refused = {*seccomp.DENIED, "socket", "socketcall"}
    assert len(ours) == len(upstream)  # no upstream rule held only denied syscalls
    for mine, theirs in zip(ours, upstream, strict=True):
        assert mine["names"] == [name for name in theirs["names"] if name not in refused]
        assert {k: v for k, v in mine.items() if k != "names"} == {k: v for k, v in theirs.items() if k != "names"}
    removed = {name for rule in upstream for name in rule["names"]} - {name for rule in ours for name in rule["names"]}
    assert removed == refused


def test_socket_is_allowed_for_unix_sockets_only_and_socketcall_not_at_all() -> None:
    """Every job of a sandbox shares its loopback: a run listening on 127.0.0.1 was reachable from the others. And
    the other families pin memory the agent cannot count (a netlink socket queued 8 MiB of replies it never read).
    socketcall carries its family in memory, and `int 0x80` reaches it from any x86-64 process."""
    rules = [rule for rule in profile()["syscalls"] if "socket" in rule["names"]]
    assert all(rule["names"] == ["socket"] and rule["action"] == "SCMP_ACT_ALLOW" for rule in rules)
    assert [[(arg["index"], arg["op"], arg["value"]) for arg in rule["args"]] for rule in rules] == [
        [(0, "SCMP_CMP_EQ", 1)],  # AF_UNIX
        [(0, "SCMP_CMP_EQ", 16), (2, "SCMP_CMP_EQ", 4)],  # AF_NETLINK, NETLINK_SOCK_DIAG: the agent's sweep
    ]
    assert "socketcall" not in names(profile()["syscalls"], "SCMP_ACT_ALLOW")
    assert "socketpair" in names(profile()["syscalls"], "SCMP_ACT_ALLOW")  # AF_UNIX is its only family here


def test_every_denial_has_a_reason() -> None:
    assert all(len(why) > 40 for why in seccomp.DENIED.values())


def test_with_loopback_socket_is_upstreams() -> None:
    """sandbox.loopback: IP sockets on the sandbox's loopback, for tasks that serve and test a server."""
    ours = json.loads(seccomp.profile_json(loopback=True))["syscalls"]
    assert {"socket", "socketcall"} <= names(ours, "SCMP_ACT_ALLOW")
    assert not [rule for rule in ours if rule["names"] == ["socket"]]
    upstream = seccomp.upstream()["syscalls"]
    for mine, theirs in zip(ours[:-2], upstream, strict=True):
        assert mine["names"] == [name for name in theirs["names"] if name not in seccomp.DENIED]
