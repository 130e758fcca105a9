"""A uid made clean: its processes killed, its files removed, its System V IPC objects gone."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable

from sandboxd.agent.host import usage
from sandboxd.agent.host.errors import SandboxDamaged

# After SIGKILL the kernel needs a moment to tear processes down; past this
# the sandbox is considered damaged.
KILL_GRACE_SECONDS = 5.0
# Between two sweeps of kill_uid.
KILL_SWEEP_SECONDS = 0.001
# The kernel's flag for a task in its exit (include/linux/sched.h), field 9 of /proc/<pid>/stat.
PF_EXITING = 0x4
# Each command of remove_tree's slow path (a tree of millions of files on a
# tmpfs takes seconds); past this the folder counts as not removable.
REMOVE_SECONDS = 60.0


async def kill_uid(uid: int, reap: Callable[[], None]) -> None:
    """SIGKILL every process of `uid`, wherever it moved, until none is left.

    Process groups are not enough: a job can setsid() a daemon out of its
    group. Each run has a uid of its own, so the uid names exactly the run's
    processes, and without capabilities they cannot change it. SandboxDamaged
    when some survive KILL_GRACE_SECONDS.

    The waits between sweeps yield to the event loop: a fork bomb (or a
    process slow to tear down its memory) kept it for up to 5 s, and every
    other job and session of the sandbox with it. The usual uid, empty at
    the first sweep, returns without yielding. A caller that cannot await
    (a callback) sends the first sweep with `sigkill_uid` and leaves the
    wait to an async path that comes after it.
    """
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    signalled: set[int] = set()
    while True:
        alive = sigkill_uid(uid)
        reap()
        if not alive:
            return
        if signalled and not alive <= signalled:
            # New processes since the last sweep: something forks as fast as
            # we kill (a fork bomb refills its process limit). kill(-1) as
            # the uid signals all of them at once, and the kernel aborts a
            # fork that races with it. Only those already signalled, still
            # tearing down their memory (about 1 ms for a worker here), need
            # nothing but time: forking the controller for them cost more
            # than the job. With no pid to fork (the runs hold them all), the
            # next sweep tries again.
            with contextlib.suppress(BlockingIOError):
                _kill_all_as(uid)
        signalled |= alive
        if time.monotonic() > deadline:
            raise SandboxDamaged(f"processes of uid {uid} survive SIGKILL")
        await asyncio.sleep(KILL_SWEEP_SECONDS)


def sigkill_uid(uid: int, *, count_exiting: bool = True, listed: set[int] | None = None) -> set[int]:
    """One sweep: SIGKILL each live process of `uid`; returns their pids.

    A zombie is left out, unless threads of it still run: its main thread
    can end alone while the others go on. With `count_exiting` false, a
    process in its exit is left out too (a single thread past that point
    makes no system call of its own: it can no longer create a file or a
    process). `listed` receives every process of `uid` seen, whatever its
    state.
    """
    alive: set[int] = set()
    for pid in usage.processes_of({uid}).get(uid, []):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
            state, flags, threads = fields[0], int(fields[6]), int(fields[17])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if listed is not None:
            listed.add(pid)
        if threads <= 1 and (state in (b"Z", b"X") or (not count_exiting and flags & PF_EXITING)):
            continue
        alive.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


def _as_uid(uid: int, action: Callable[[], object]) -> None:
    """Run `action` in a child of the controller that has become `uid`, and wait for it.

    For what the kernel allows only a process of that uid (or a capability
    the sandbox lacks) to do. BlockingIOError when the runs hold every pid
    of the sandbox (EAGAIN; sessions can hold them all): the callers try
    again after yielding to the loop, as killed processes give theirs back.
    """
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            action()
        finally:
            os._exit(0)
    with contextlib.suppress(ChildProcessError):  # the SIGCHLD handler may reap it first
        os.waitpid(pid, 0)


def _kill_all_as(uid: int) -> None:
    _as_uid(uid, lambda: os.kill(-1, signal.SIGKILL))  # every process of uid but the child itself


def remove_tree(path: str) -> None:
    """Remove the folder `path` and everything in it, whoever made what inside; SandboxDamaged if it stays.

    shutil.rmtree is the quick way, and usually enough. It can leave the
    folder behind: a run may make a folder of its own world-writable, and
    another run's uid then keeps adding files to it during the removal
    (ENOTEMPTY), and Python 3.11's rmtree recurses, so a folder nested 1,000
    deep raises RecursionError. Then every folder in it is made root's, mode
    000, so that no other uid can add an entry any more, and `rm -rf`
    removes the rest at any depth; twice, for entries made while the first
    round sealed their folder. Files someone still has open keep their space
    until that run ends.
    """
    with contextlib.suppress(OSError, RecursionError):
        shutil.rmtree(path)
    for _ in range(2):
        if not os.path.lexists(path):
            return
        for argv in (["chown", "-R", "-h", "0:0", path], ["chmod", "-R", "000", path],
                     ["rm", "-rf", "--one-file-system", path]):
            with contextlib.suppress(subprocess.TimeoutExpired):  # then the folder stays: damaged
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=REMOVE_SECONDS, check=False)
    if os.path.lexists(path):
        raise SandboxDamaged(f"cannot remove {path}")


def remove_files_of(uid: int, folder: str) -> None:
    """Delete what a run left in a shared writable folder such as /dev/shm."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
            if info.st_uid != uid:
                continue
            if stat.S_ISDIR(info.st_mode):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:
            continue


# System V IPC: the tables of the sandbox's IPC namespace, and the libc call
# that removes an object of each (IPC_RMID is 0 for all three).
SYSV_IPC_TABLES = ("shm", "msg", "sem")
IPC_RMID = 0
SHM_DEST = 0o1000  # a segment removed, kept until its last process detaches
# Looked up here, in the controller: a child forked to remove objects only calls.
_libc = ctypes.CDLL(None, use_errno=True)
_REMOVE_IPC = {
    "shm": lambda ident: _libc.shmctl(ident, IPC_RMID, None),
    "msg": lambda ident: _libc.msgctl(ident, IPC_RMID, None),
    "sem": lambda ident: _libc.semctl(ident, 0, IPC_RMID),
}


def _read_proc(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # a kernel built without System V IPC
        return b""
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def ipc_objects_of(uid: int, *, created_only: bool = False) -> list[tuple[str, int]]:
    """The System V IPC objects `uid` created or owns (or only created), as (table, id); removed segments left out."""
    found: list[tuple[str, int]] = []
    for table in SYSV_IPC_TABLES:
        header, _, rows = _read_proc(f"/proc/sysvipc/{table}").partition(b"\n")
        if not rows:
            continue  # the usual case: the header alone
        columns = header.split()
        perms, owner, creator = columns.index(b"perms"), columns.index(b"uid"), columns.index(b"cuid")
        for row in rows.splitlines():
            fields = row.split()
            if int(fields[creator]) != uid and (created_only or int(fields[owner]) != uid):
                continue
            if table == "shm" and int(fields[perms], 8) & SHM_DEST:
                continue
            found.append((table, int(fields[1])))
    return found


def remove_ipc_objects_of(uid: int) -> None:
    """Remove the System V IPC objects (message queues, shared memory, semaphores) of `uid`.

    They outlive the processes that made them: left alone, a later job of
    the sandbox could read what an earlier one put there (msgget with the
    same key), and a job could keep memory after its end. Only an object's
    creator or owner may remove it (or CAP_SYS_ADMIN, which a sandbox does
    not have), so a child of the controller becomes `uid` to do it
    (_as_uid). The table is read on every call (about
    20 us here); the fork happens only when the uid has objects.
    """
    objects = ipc_objects_of(uid)
    if not objects:
        return

    def remove() -> None:
        for table, ident in objects:
            _REMOVE_IPC[table](ident)

    _as_uid(uid, remove)
    # An object its uid cannot remove would be there for the next job. Only
    # those it created count: an object's creator may give it to any uid
    # (IPC_SET), so a neighbour that keeps making objects owned by this uid
    # would make every removal look failed, and the sandbox retired; such an
    # object goes at its creator's end.
    left = ipc_objects_of(uid, created_only=True)
    if left:
        raise SandboxDamaged(f"System V IPC objects of uid {uid} survive removal: {left}")
