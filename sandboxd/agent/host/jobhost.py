"""What a job kind, a session or a resident server needs from the controller: uids, work dirs, environment, limits.

A JobHost hands out the sandbox's job uids and their work dirs, writes a
job's files, builds a run's environment and rlimits, and gives a uid back
once everything of it is gone (its processes, its files, its IPC objects).
The controller holds one; the job kinds (jobs.py), sessions and resident
servers get it instead of the controller.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from sandboxd.agent.host.cleanup import kill_uid, remove_files_of, remove_ipc_objects_of, remove_tree
from sandboxd.agent.host.errors import SandboxDamaged
from sandboxd.agent.host.offloop import off_loop
from sandboxd.agent.host.runner import Runner, RunOutcome
from sandboxd.agent.host.tmpspace import neighbours_hold
from sandboxd.agent.host.tree import write_tree
from sandboxd.agent.host.zygoteclient import Zygote
from sandboxd.agent.messages import SandboxFull
from sandboxd.agent.protocol import UIDS_PER_SANDBOX, UNSLOTTED_FIRST_UID
from sandboxd.verifiers.code import expand_env

WORK_ROOT = "/tmp/sandboxd"
# Writable folders every uid shares; scrubbed of a run's files after it.
SHARED_WRITABLE = ("/dev/shm", "/dev/mqueue", "/var/tmp", "/run/lock")
DEFAULT_RLIMITS = {"fsize": 64 << 20, "nproc": 256, "nofile": 512, "core": 0}
# A job's files up to this size (paths and contents) are written on the loop: a thread's hand-off costs more.
INLINE_WRITE_BYTES = 256 << 10
# Tries of a uid's System V IPC sweep when no pid is left to fork its helper with, 20 ms apart.
IPC_SWEEP_ATTEMPTS = 50
# The mtime of a work dir that holds nothing yet, by python.remote's rule (its UNTOUCHED_FOLDER_MTIME_NS).
UNTOUCHED_FOLDER_MTIME_NS = 0


class UidPool:
    """The sandbox's block of job uids (protocol.UIDS_PER_SANDBOX), one per run, server or session."""

    def __init__(self, first: int = UNSLOTTED_FIRST_UID) -> None:
        self._reset(first)

    def _reset(self, first: int) -> None:
        self.first = first
        # Taken from the end, lowest first; a given-back uid goes to the front, to be reused last.
        self._free = list(range(first + UIDS_PER_SANDBOX - 1, first - 1, -1))

    def place(self, first: int) -> None:
        """Move the block, which only a sandbox with no uid taken can do (hello comes before any run)."""
        if first == self.first:
            return
        if len(self._free) != UIDS_PER_SANDBOX:
            raise SandboxDamaged(f"uid block moved to {first} while {UIDS_PER_SANDBOX - len(self._free)} are taken")
        self._reset(first)

    def take(self) -> int:
        if not self._free:
            raise SandboxDamaged("no free job uid")
        return self._free.pop()

    def give_back(self, uid: int) -> None:
        self._free.insert(0, uid)


class JobHost:
    def __init__(self, zygote: Zygote) -> None:
        self.zygote = zygote
        self.runner = Runner(zygote, self.reap)
        self.uids = UidPool()
        # Checked again at every hello (controller.lock_sticky_folders and _writable_by_all).
        self.shared_writable = list(SHARED_WRITABLE)
        self._releasing: set[asyncio.Future[None]] = set()
        # The folder of the work dirs, on /tmp.
        self.work_root = WORK_ROOT

    # ---- process housekeeping ------------------------------------------
    def reap(self) -> None:
        """Collect orphans re-parented to us; the zygote's death is fatal."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.zygote.pid:
                print("sandboxd-agent: zygote exited; sandbox is damaged", file=sys.stderr, flush=True)
                os._exit(70)

    # ---- work dirs ------------------------------------------------------
    async def make_workdir(self, uid: int) -> str:
        """A fresh 0700 folder of `uid`'s, its mtime UNTOUCHED_FOLDER_MTIME_NS; SandboxFull when other runs took /tmp's
        space (NEIGHBOURS_SHARE)."""
        path = f"{self.work_root}/{uid}"
        if os.path.lexists(path):
            # Not expected: a uid comes back only once its folder is gone (release).
            await off_loop(remove_tree, path)
        try:
            os.mkdir(path, 0o700)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                await self.charge_neighbours(None, f"making a work dir: {exc.strerror}")
            raise
        os.chown(path, uid, uid)
        # Marked as made empty: an entry made or removed there sets its mtime to the present, so a Python harness's
        # candidate and judge read it for files to share only from then on, not before each frame.
        os.utime(path, ns=(UNTOUCHED_FOLDER_MTIME_NS, UNTOUCHED_FOLDER_MTIME_NS))
        return path

    async def write_files(self, workdir: str, uid: int, files: Iterable[tuple[str, bytes]]) -> None:
        """`write_tree` of `files`, before any process of `uid` runs; SandboxFull as in `make_workdir`.

        In a thread past INLINE_WRITE_BYTES: a job's files are up to 32 MiB
        and 1,024 paths of 4 KB, seconds of system calls at worst, which
        held up the other jobs of the sandbox when made on the loop.
        """
        files = list(files)
        try:
            if sum(len(path) + len(content) for path, content in files) <= INLINE_WRITE_BYTES:
                write_tree(workdir, uid, files)
            else:
                await off_loop(write_tree, workdir, uid, files)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                await self.charge_neighbours(workdir, f"writing {exc.filename!r}: {exc.strerror}")
            raise

    async def charge_neighbours(self, workdir: str | None, what: str) -> None:
        """Raise SandboxFull if other runs than the one in `workdir` hold /tmp (NEIGHBOURS_SHARE); else return.

        For a job that ran out of space in /tmp (`what`): the caller raises
        its own error when this returns. The look at `workdir` runs in a
        thread: a run can fill it with tmpfs_inodes entries.
        """
        if await off_loop(neighbours_hold, self.work_root, workdir):
            raise SandboxFull(f"/tmp of the sandbox is full ({what}); other runs hold its space")

    async def release(self, uid: int, *, shared_files_removed: bool = False) -> None:
        """Make `uid` free for another run: its processes gone (already, when the end of its last run swept it empty:
        Runner.take_emptied), its files removed, then the uid given back.

        `shared_files_removed`: remove_shared_files ran once nothing of the
        uid could add a file any more. The files are removed in a thread:
        a run can leave as many entries as the tmpfs holds (hard links cost
        no space), and removing them on the event loop held up every other
        job and session of the sandbox (2.5 million links: a concurrent 1 s
        job timed out and the sandbox was lost). The uid is given back only
        once they are gone, so no later run of it can find them. SandboxDamaged
        when they cannot be removed (remove_tree's bound).
        """
        if not self.runner.take_emptied(uid):
            await kill_uid(uid, self.reap)
        if not shared_files_removed:
            await self.remove_shared_files(uid)
        workdir = f"{self.work_root}/{uid}"
        try:
            # What most runs leave (every Python-harness candidate): an empty
            # folder, gone in one call on the loop. Nothing of the uid is left
            # to add to it, and a full one fails at once (ENOTEMPTY). The
            # thread's round trip cost more than the removal.
            os.rmdir(workdir)
        except FileNotFoundError:
            pass
        except OSError:
            await off_loop(remove_tree, workdir)
        self.uids.give_back(uid)

    async def remove_shared_files(self, uid: int) -> None:
        """Delete what `uid` left where other uids can look: /dev/shm and the like, System V IPC objects.

        Done before a job's reply, once its runs are over (Runner.run): a
        later job must not find a file an earlier one left there, such as
        an expected output that it read. The files go in a thread, as in
        `release`, unless a look on the loop finds the folders empty (the
        usual case; a thread's round trip costs about 0.1 ms): no
        process of the uid is left to add one. The IPC objects go on the
        loop (a table read, and a fork only when the uid has some); a fork
        refused for want of pids (other runs hold them all) is tried again
        for up to a second, yielding to the loop in between.
        """
        if any(map(_has_entries, self.shared_writable)):
            await off_loop(self._remove_files_in_shared_folders, uid)
        for attempt in range(IPC_SWEEP_ATTEMPTS):
            try:
                remove_ipc_objects_of(uid)
                return
            except BlockingIOError:
                if attempt == IPC_SWEEP_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.02)

    def _remove_files_in_shared_folders(self, uid: int) -> None:
        for folder in self.shared_writable:
            remove_files_of(uid, folder)

    def release_later(self, uid: int, runs: list[RunOutcome] | None = None, *,
                      shared_files_removed: bool = False) -> asyncio.Future[None]:
        """`release(uid)` in the background once `runs` have exited: off the job's path, or a caller's that cannot wait.

        The reply goes out first: a run answered before its exit (Runner.run,
        settle=False) takes 1-2 ms more to end, and the uid sweep (0.14 ms
        here) and the work dir's removal follow it. No process of the job
        can act meanwhile (each is in its exit), its work dir is its uid's
        alone, and the uid is not handed out again until this is done. A
        release that fails ends the agent: the sandbox is damaged.
        """

        async def release() -> None:
            try:
                for outcome in runs or ():
                    await self.runner.settle(outcome)
                await self.release(uid, shared_files_removed=shared_files_removed)
            except Exception as exc:
                # A uid that could not be made clean must never be handed out
                # again; the daemon retires the sandbox when the agent exits.
                if not isinstance(exc, SandboxDamaged):
                    traceback.print_exc()
                self.damaged(f"releasing uid {uid} failed ({exc})")

        task = asyncio.ensure_future(release())
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    @staticmethod
    def damaged(why: str) -> None:
        """End the agent: the sandbox can no longer run jobs safely, and the daemon retires it when we exit."""
        print(f"sandboxd-agent: {why}; sandbox is damaged", file=sys.stderr, flush=True)
        os._exit(71)

    # ---- building runs -----------------------------------------------------
    @staticmethod
    def rlimits(limits: Mapping[str, Any], *, address_space: bool) -> dict[str, int]:
        rlimits = dict(DEFAULT_RLIMITS)
        rlimits["cpu"] = max(1, int(limits["timeout"] + 0.999))
        if address_space and limits.get("memory"):
            rlimits["as_extra"] = int(limits["memory"])
        return rlimits

    @staticmethod
    def env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
        }
        # Language settings name paths inside the run's own work dir.
        env.update(expand_env(extra or {}, workdir))
        return env


def _has_entries(folder: str) -> bool:
    """Whether `folder` holds anything, from its first entry alone."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except FileNotFoundError:
        return False
