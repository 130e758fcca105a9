"""Landlock (Documentation/userspace-api/landlock.rst): what the controller reports and what each worker enters.

Shared by both sides of the agent: the controller reports the kernel's ABI
in its `hello` (`landlock_abi`); a worker scopes its abstract sockets with
`scope_abstract_sockets` right after its fork.
"""

from __future__ import annotations

import ctypes
import os

# Looked up at import, which for a worker is in the zygote: in each worker the lookup (dlsym)
# searched the symbol tables of every loaded library, page faults in a fresh fork.
_syscall = ctypes.CDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long

# Every job of a sandbox
# shares its network namespace, where abstract Unix socket names are global
# and carry no permissions: a run could listen on one and another job's run
# (a session beside it, the next stdio case of another completion) connect.
# Each worker enters a Landlock domain of its own that scopes abstract sockets
# (protocol.LANDLOCK_SCOPE_ABI): its processes may connect only to those bound inside it.
# The syscall numbers are the same on every architecture but alpha.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


# Built at import, in the zygote, like the lookup above: a worker only makes the
# two calls (about 40 us of its CPU, against about 90 us when it built the
# attribute and set no_new_privs itself; 400 forks, 3 rounds, on this host).
_ABSTRACT_SCOPE = _LandlockRulesetAttr(0, 0, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
_ABSTRACT_SCOPE_ARGS = (ctypes.byref(_ABSTRACT_SCOPE), ctypes.c_size_t(ctypes.sizeof(_ABSTRACT_SCOPE)),
                        ctypes.c_uint32(0))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (an old kernel, or a seccomp filter that refuses it)."""
    return max(0, _syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION)))


def scope_abstract_sockets() -> bool:
    """Enter a Landlock domain that keeps this process tree's abstract Unix sockets to itself; False if unsupported."""
    ruleset = _syscall(SYS_LANDLOCK_CREATE_RULESET, *_ABSTRACT_SCOPE_ARGS)
    if ruleset < 0:
        return False  # ENOSYS, or E2BIG/EINVAL from a kernel before ABI 6
    try:
        # Without CAP_SYS_ADMIN this needs no_new_privs, which the sandbox sets
        # for every process (no-new-privileges); EPERM (False) elsewhere.
        return _syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) == 0
    finally:
        os.close(ruleset)
