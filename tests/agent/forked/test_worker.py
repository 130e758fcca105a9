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
               "from sandboxd.agent.forked import worker\nassert worker.refuse_memfd()\n"
               "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
               "child = 'import os\\ntry: os.memfd_create(\"y\")\\nexcept OSError as e: print(e.errno)'\n"
               "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
               "print(len(os.listdir('/proc/self/fd')) > 0, os.getpid() > 0)\n")
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the filter knows x86_64 and aarch64")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[3])
    assert done.stdout.split() == ["ENOSYS", str(errno.ENOSYS), "True", "True"], done
