"""kill_uid and sigkill_uid against real processes on this machine (needs root to switch uids)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandboxd.agent.host import cleanup, errors
from sandboxd.agent.host.cleanup import kill_uid, sigkill_uid
from sandboxd.agent.host.runner import RunOutcome, RunSpec, classify

BOMB_UID = 29_999  # outside the agent's job range, unused on a test machine
QUIET_UID = 29_998
SYSTEM_PYTHON = "/usr/bin/python3"
BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


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
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"no {SYSTEM_PYTHON}")
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
            # A fresh interpreter: this one may hold gRPC, whose fork
            # handlers start threads that would use up the process limit.
            # The system one: the bomb's uid may not reach this one's folder.
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, "-I", "-S", "-c", BOMB])
        finally:
            os._exit(1)
    try:
        deadline = time.monotonic() + 10
        while len(_processes_of(BOMB_UID)) < 32 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_processes_of(BOMB_UID)) >= 32, "the bomb did not start"

        asyncio.run(kill_uid(BOMB_UID, lambda: _reap(pid)))
        assert _processes_of(BOMB_UID) == []
    finally:
        asyncio.run(kill_uid(BOMB_UID, lambda: None))
        # Only the bomb's first process is ours: the rest were reparented.
        # Waiting on any child would hang on other tests' daemons.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _reap(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _start_as(uid: int, memory_bytes: int) -> int:
    """A process of `uid` that holds `memory_bytes` (slow to tear down) and sleeps."""

    def hold() -> None:
        held = bytearray(memory_bytes)
        held[::4096] = b"x" * len(held[::4096])

    return _fork_as(uid, hold, lambda: time.sleep(60))


def _fork_as(uid: int, prepare: Callable[[], None], then: Callable[[], None]) -> int:
    """A child running as `uid`: `prepare()`, then, once the caller knows it is ready, `then()`."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            prepare()
            os.write(ready_w, b"1")
            then()
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_sigkill_uid_signals_each_process_once_without_waiting() -> None:
    pids = {_start_as(QUIET_UID, 1 << 20) for _ in range(2)}
    try:
        assert sigkill_uid(QUIET_UID) == pids
        for pid in pids:
            assert os.WTERMSIG(os.waitpid(pid, 0)[1]) == 9
        assert sigkill_uid(QUIET_UID) == set()
    finally:
        asyncio.run(kill_uid(QUIET_UID, lambda: _reap(*pids)))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_sigkill_uid_can_leave_out_processes_in_their_exit() -> None:
    # What a run's early answer waits for: every process of the uid past the
    # point where it could still create a file (its exit has begun).
    pid = _start_as(QUIET_UID, 64 << 20)
    try:
        assert sigkill_uid(QUIET_UID, count_exiting=False) == {pid}  # sleeping, not exiting: signalled
        deadline = time.monotonic() + 10
        while sigkill_uid(QUIET_UID, count_exiting=False) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sigkill_uid(QUIET_UID, count_exiting=False) == set()
        assert os.WTERMSIG(os.waitpid(pid, 0)[1]) == 9
    finally:
        asyncio.run(kill_uid(QUIET_UID, lambda: _reap(pid)))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_sigkill_uid_kills_a_process_whose_main_thread_ended() -> None:
    # /proc shows such a process as a zombie while its other threads run on.
    pid = _fork_as(QUIET_UID, lambda: threading.Thread(target=time.sleep, args=(60,)).start(),
                   lambda: ctypes.CDLL(None).pthread_exit(None))  # the main thread alone
    try:
        # More than 2 threads when this process holds gRPC: its fork handlers start threads in the child.
        deadline = time.monotonic() + 10
        while not _zombie_with_threads(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _zombie_with_threads(pid), _state(pid)
        assert sigkill_uid(QUIET_UID) == {pid}
        assert os.WTERMSIG(os.waitpid(pid, 0)[1]) == 9
    finally:
        asyncio.run(kill_uid(QUIET_UID, lambda: _reap(pid)))


def _zombie_with_threads(pid: int) -> bool:
    state, threads = _state(pid)
    return state == b"Z" and threads >= 2


def _state(pid: int) -> tuple[bytes, int]:
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        fields = stat_file.read().rsplit(b")", 1)[1].split()
    return fields[0], int(fields[17])


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_kill_uid_waits_for_a_dying_process_without_escalating(monkeypatch: pytest.MonkeyPatch) -> None:
    # A process that is already SIGKILLed but still tearing down its memory
    # is not a fork bomb: kill(-1) as the uid (a fork of the caller) is for
    # processes that appear between sweeps.
    escalations: list[int] = []
    monkeypatch.setattr(cleanup, "_kill_all_as", escalations.append)
    pid = _start_as(QUIET_UID, 256 << 20)
    asyncio.run(kill_uid(QUIET_UID, lambda: _reap(pid)))
    assert _processes_of(QUIET_UID) == []
    assert escalations == []


IPC_UID = 29_997
IPC_CREAT = 0o1000
IPC_SET = 1
IPC_STAT = 2


def _forked_as(uid: int, action: Callable[[], None], *, linger: bool = False) -> int:
    """Run `action` in a child under `uid`; returns the child's pid (waited for, unless `linger`)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            action()
            os.write(ready_w, b"1")
            if linger:
                time.sleep(60)
            status = 0
        finally:
            os._exit(status)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1", "the child's action failed"
    os.close(ready_r)
    if not linger:
        assert os.waitpid(pid, 0)[1] == 0
    return pid


def _ipc_ids() -> dict[str, set[int]]:
    ids: dict[str, set[int]] = {}
    for table in cleanup.SYSV_IPC_TABLES:
        with open(f"/proc/sysvipc/{table}") as rows:
            ids[table] = {int(row.split()[1]) for row in rows.read().splitlines()[1:]}
    return ids


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
@pytest.mark.skipif(not os.path.exists("/proc/sysvipc/msg"), reason="a kernel without System V IPC")
def test_remove_ipc_objects_of_removes_what_a_uid_made_or_owns() -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def make() -> None:
        assert libc.msgget(0, IPC_CREAT | 0o600) >= 0
        assert libc.semget(0, 2, IPC_CREAT | 0o600) >= 0
        # Handed to another owner: its creator may still remove it.
        segment = libc.shmget(0, 4096, IPC_CREAT | 0o600)
        shmid_ds = ctypes.create_string_buffer(512)
        assert libc.shmctl(segment, IPC_STAT, shmid_ds) == 0
        ctypes.memmove(ctypes.addressof(shmid_ds) + 4, ctypes.byref(ctypes.c_uint(QUIET_UID)), 4)  # ipc_perm.uid
        assert libc.shmctl(segment, IPC_SET, shmid_ds) == 0

    before = _ipc_ids()
    _forked_as(IPC_UID, make)
    made = cleanup.ipc_objects_of(IPC_UID)
    assert sorted(table for table, _ in made) == ["msg", "sem", "shm"]
    assert all(ident not in before[table] for table, ident in made)
    cleanup.remove_ipc_objects_of(IPC_UID)
    assert cleanup.ipc_objects_of(IPC_UID) == []
    after = _ipc_ids()
    assert all(ident not in after[table] for table, ident in made)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
@pytest.mark.skipif(not os.path.exists("/proc/sysvipc/msg"), reason="a kernel without System V IPC")
def test_objects_a_neighbour_keeps_handing_to_a_uid_do_not_fail_its_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team: a run kept making message queues and giving them to its neighbour's uid
    (IPC_SET): each of the neighbour's sweeps found one left and retired the sandbox."""
    libc = ctypes.CDLL(None, use_errno=True)

    def give_a_queue() -> None:
        queue = libc.msgget(0, IPC_CREAT | 0o600)
        msqid_ds = ctypes.create_string_buffer(512)
        assert queue >= 0 and libc.msgctl(queue, IPC_STAT, msqid_ds) == 0
        ctypes.memmove(ctypes.addressof(msqid_ds) + 4, ctypes.byref(ctypes.c_uint(IPC_UID)), 4)  # ipc_perm.uid
        assert libc.msgctl(queue, IPC_SET, msqid_ds) == 0

    _forked_as(QUIET_UID, give_a_queue)
    assert [table for table, _ in cleanup.ipc_objects_of(IPC_UID)] == ["msg"]
    assert cleanup.ipc_objects_of(IPC_UID, created_only=True) == []
    removing = cleanup._as_uid

    def remove_then_the_neighbour_gives_another(uid: int, action: Callable[[], None]) -> None:
        removing(uid, action)
        _forked_as(QUIET_UID, give_a_queue)

    monkeypatch.setattr(cleanup, "_as_uid", remove_then_the_neighbour_gives_another)
    cleanup.remove_ipc_objects_of(IPC_UID)  # no SandboxDamaged
    monkeypatch.undo()
    # The neighbour's queues go at its own end.
    cleanup.remove_ipc_objects_of(QUIET_UID)
    assert cleanup.ipc_objects_of(IPC_UID) == [] and cleanup.ipc_objects_of(QUIET_UID) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
@pytest.mark.skipif(not os.path.exists("/proc/sysvipc/shm"), reason="a kernel without System V IPC")
def test_a_removed_segment_still_attached_counts_as_gone() -> None:
    # A job's processes may still be in their exit, attached, when its uid's
    # objects are removed: the segment is destroyed at their last detach.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p

    def attach() -> None:
        segment = libc.shmget(0, 4096, IPC_CREAT | 0o600)
        assert libc.shmat(segment, None, 0) not in (None, ctypes.c_void_p(-1).value)

    holder = _forked_as(IPC_UID, attach, linger=True)
    try:
        (segment,) = [ident for table, ident in cleanup.ipc_objects_of(IPC_UID) if table == "shm"]
        cleanup.remove_ipc_objects_of(IPC_UID)
        assert cleanup.ipc_objects_of(IPC_UID) == []
        assert segment in _ipc_ids()["shm"]  # still there while attached
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    assert segment not in _ipc_ids()["shm"]


def test_remove_tree_takes_a_folder_too_deep_for_rmtree(tmp_path: Path) -> None:
    # Python 3.11's shutil.rmtree recurses: 1,200 levels raise RecursionError.
    top = tmp_path / "deep"
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        name = "deep"
        for _ in range(1200):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, name = inner, "d"
    finally:
        os.close(fd)
    try:
        cleanup.remove_tree(str(top))
        assert not top.exists()
    finally:
        # Left behind, it would break pytest's own rmtree of old temporary folders.
        subprocess.run(["rm", "-rf", str(top)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_remove_tree_outlasts_another_uid_adding_files() -> None:
    # A run made its folder world-writable; a run of another uid keeps adding
    # files to it while it is removed, which left rmtree with ENOTEMPTY (a
    # race: the old rmtree lost it in the red-team run, not on every try).
    # Not under tmp_path: pytest's folders are 0700, closed to the writers.
    parent = tempfile.mkdtemp(prefix="sandboxd-remove-tree-")
    os.chmod(parent, 0o755)
    top = Path(parent) / "relay"
    top.mkdir(mode=0o777)
    top.chmod(0o777)
    os.chown(top, QUIET_UID, QUIET_UID)

    def spam() -> None:
        # Three writers: with one, the old rmtree often won the race here.
        for _ in range(3):
            if os.fork() == 0:
                break
        else:
            return
        n = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.close(os.open(f"{top}/{os.getpid()}-{n}", os.O_CREAT | os.O_WRONLY, 0o644))
                n += 1
        os._exit(0)

    try:
        _forked_as(IPC_UID, spam)
        time.sleep(0.3)
        assert any(top.iterdir()), "the writers never wrote: the race was not run"
        cleanup.remove_tree(str(top))
        assert not top.exists()
        time.sleep(1.5)
        assert not top.exists()
    finally:
        for _ in range(30):  # the writers may still be at it (1.5 s) when an assertion failed
            subprocess.run(["rm", "-rf", parent], check=False, capture_output=True)
            if not os.path.exists(parent):
                break
            time.sleep(0.1)


# ---- kill_uid waits without holding the agent's event loop (fake sweeps: no processes, no root) --------------------


class Ticker:
    """A coroutine that counts its turns on the event loop while `async with` lasts."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.ensure_future(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)


def test_kill_uid_lets_the_event_loop_run_between_its_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """kill_uid slept on the event loop (time.sleep) between sweeps, for up to 5 s against a fork bomb: every other
    job and session of the sandbox stood still meanwhile. Here a process takes three sweeps to go: another
    coroutine must have run between each two."""
    ticker = Ticker()
    ticks_at_sweep: list[int] = []
    survives = [3]

    def sweep(uid: int, **_: Any) -> set[int]:
        ticks_at_sweep.append(ticker.ticks)
        if survives[0]:
            survives[0] -= 1
            return {4242}
        return set()

    monkeypatch.setattr(cleanup, "sigkill_uid", sweep)
    monkeypatch.setattr(cleanup, "_kill_all_as", lambda uid: pytest.fail("one process, signalled again: no escalation"))

    async def scenario() -> None:
        async with ticker:
            await cleanup.kill_uid(QUIET_UID, lambda: None)

    asyncio.run(scenario())
    assert len(ticks_at_sweep) == 4
    assert all(before < after for before, after in itertools.pairwise(ticks_at_sweep)), (
        "another coroutine did not run between two sweeps", ticks_at_sweep)


def test_processes_that_survive_sigkill_still_damage_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    sweeps = 0

    def sweep(uid: int, **_: Any) -> set[int]:
        nonlocal sweeps
        sweeps += 1
        return {4242}

    monkeypatch.setattr(cleanup, "sigkill_uid", sweep)
    monkeypatch.setattr(cleanup, "KILL_GRACE_SECONDS", 0.05)

    async def scenario() -> int:
        async with Ticker() as ticker:
            with pytest.raises(errors.SandboxDamaged, match=f"uid {QUIET_UID} survive SIGKILL"):
                await cleanup.kill_uid(QUIET_UID, lambda: None)
        return ticker.ticks

    ticks = asyncio.run(scenario())
    assert sweeps >= 2 and ticks >= sweeps - 1, "the wait held the loop"


def test_peak_memory_over_the_limit_is_a_memory_limit() -> None:
    # Go, Java and Node run without RLIMIT_AS: their exit report's peak RSS is what holds them to the limit.
    spec = RunSpec(mode="exec", uid=1, cwd="/", timeout=1.0, output_limit=1, rlimits={},
                   peak_memory_limit=256 << 20)
    outcome = RunOutcome(wait_status=0, stdout=b"3\n", stderr=b"", stdout_truncated=False, stderr_truncated=False,
                         killed_for="", wall_seconds=0.1, cpu_seconds=0.1, max_rss_bytes=(256 << 20) + 4096)
    assert classify(outcome, spec)[:2] == ("memory_limit", "memory")
    outcome.max_rss_bytes = 256 << 20
    assert classify(outcome, spec)[0] == "ok"
    spec.peak_memory_limit = 0  # a run under RLIMIT_AS: its peak is not looked at
    outcome.max_rss_bytes = 1 << 40
    assert classify(outcome, spec)[0] == "ok"
