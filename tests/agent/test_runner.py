"""kill_uid against real processes on this machine (needs root to switch uids)."""

from __future__ import annotations

import contextlib
import os
import resource
import time

import pytest

from sandboxd.agent.runner import kill_uid

BOMB_UID = 29_999  # outside the agent's job range, unused on a test machine


def _processes_of(uid: int) -> list[int]:
    alive = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                if stat_file.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    alive.append(int(name))
        except (OSError, IndexError):
            continue
    return alive


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_kill_uid_ends_a_fork_bomb() -> None:
    # Each process forks as fast as it can up to the uid's process limit, so
    # killing them one by one only frees slots for new ones.
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(BOMB_UID, BOMB_UID, BOMB_UID)
            resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
            os.setresuid(BOMB_UID, BOMB_UID, BOMB_UID)
            os.setsid()
            while True:
                with contextlib.suppress(OSError):
                    os.fork()
        finally:
            os._exit(1)
    try:
        deadline = time.monotonic() + 10
        while len(_processes_of(BOMB_UID)) < 32 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_processes_of(BOMB_UID)) >= 32, "the bomb did not start"

        def reap() -> None:
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        return
                except ChildProcessError:
                    return

        kill_uid(BOMB_UID, reap)
        assert _processes_of(BOMB_UID) == []
    finally:
        kill_uid(BOMB_UID, lambda: None)
        with pytest.raises(ChildProcessError):
            while True:
                os.waitpid(-1, 0)
