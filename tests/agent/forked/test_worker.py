"""The worker's own seccomp filter, installed in a fresh interpreter."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_the_workers_filter_refuses_memfd_create_to_it_and_to_what_it_execs() -> None:
    program = ("import errno, os, subprocess, sys\n"
               "from sandboxd.agent.forked import worker\nassert worker.install_candidate_filter()\n"
               "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
               "child = 'import os\\ntry: os.memfd_create(\"y\")\\nexcept OSError as e: print(e.errno)'\n"
               "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
               "print(len(os.listdir('/proc/self/fd')) > 0, os.getpid() > 0)\n")
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the filter knows x86_64 and aarch64")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[3])
    assert done.stdout.split() == ["ENOSYS", str(errno.ENOSYS), "True", "True"], done


# Run in a fresh interpreter under the filter: each line prints what a socket's buffer option reads after a set.
BUFFERS_PROGRAM = """
import ctypes, socket, subprocess, sys
from sandboxd.agent.forked import worker
a, b = socket.socketpair()
default = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF), a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
assert worker.install_candidate_filter()
for option in (socket.SO_SNDBUF, socket.SO_RCVBUF, 32, 33):  # and the FORCE twins, which root may set
    assert a.setsockopt(socket.SOL_SOCKET, option, 8 << 20) is None
# The kernel reads int arguments by their low word: high bits set in the registers change nothing here.
libc = ctypes.CDLL(None, use_errno=True)
value = ctypes.c_int(8 << 20)
number = {"x86_64": 54, "aarch64": 208}[__import__("os").uname().machine]
assert libc.syscall(ctypes.c_long(number), ctypes.c_long(a.fileno()), ctypes.c_long(1 | 1 << 32),
                    ctypes.c_long(socket.SO_SNDBUF | 1 << 32), ctypes.byref(value), ctypes.c_long(4)) == 0
print((a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF), a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
      == default)
# Other options still take effect, at SOL_SOCKET and elsewhere.
a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
print(a.getsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED))
diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)
before = diag.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
diag.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
print(diag.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == before)
child = ("import socket\\na, _ = socket.socketpair()\\nn = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)\\n"
         "a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)\\n"
         "print(a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == n)")
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
"""


def test_the_workers_filter_keeps_socket_buffers_at_their_defaults() -> None:
    """SO_SNDBUF/SO_RCVBUF and their FORCE twins are answered 0 and change nothing, in the worker and in what it
    execs, whatever the high bits of the arguments; other options still take effect."""
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the filter knows x86_64 and aarch64")
    done = subprocess.run([sys.executable, "-c", BUFFERS_PROGRAM], capture_output=True, text=True,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0 and done.stdout.split() == ["True", "1", "True", "True"], done
    # Without the filter the same sets take effect: the test can tell.
    unfiltered = subprocess.run([sys.executable, "-c", BUFFERS_PROGRAM.replace(
        "assert worker.install_candidate_filter()", "")], capture_output=True, text=True,
        cwd=Path(__file__).parents[3])
    assert unfiltered.stdout.split()[0] == "False", unfiltered
