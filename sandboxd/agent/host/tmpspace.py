"""/tmp accounting: whether a job that ran out of space was crowded out by the others, and whether jobs can come back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sandboxd.agent.host import usage
from sandboxd.agent.host.tree import usage_of

# Concurrent runs share /tmp (sandbox.tmpfs_bytes and tmpfs_inodes). A job
# that gets ENOSPC where the agent writes for it (its work dir, its input
# files, before any process of it runs) or where its compiler writes, while
# the other runs hold at least this share of /tmp's bytes or entries, was
# crowded out: it is retried elsewhere (SandboxFull) rather than answered
# INTERNAL or compile_error. Its own files do not count, so a job whose
# own compile fills /tmp keeps its compile_error. The sandbox takes jobs
# again once less than this share is used (`room`).
NEIGHBOURS_SHARE = 0.5
# A run starved of CPU by the others (runner.starved_out) is retried
# elsewhere; the sandbox takes jobs again once at most this many job threads
# per CPU are ready to run: two single-threaded busy runs on one CPU are
# room, a run of three busy processes beside them is not.
RUNNABLE_PER_CPU = 2
# A compile's "no space left on device" counts only when the space within its
# reach (free, plus what its own folder holds) is under this share of /tmp.
STARVED_SHARE = 0.1


@dataclass(frozen=True)
class TmpUsage:
    """One look at a file system (/tmp): its size and entries, what is used, and what the folder `own` holds of it.

    A file system with no cap on bytes or entries (size or nr_inodes 0) is
    never counted full on that one.
    """

    size: int
    used_bytes: int
    entries: int
    used_entries: int
    own_bytes: int = 0
    own_entries: int = 0

    @classmethod
    def read(cls, root: str, own: str | None = None) -> TmpUsage:
        """The usage of `root`'s file system; `own` is walked (a thread's work: up to tmpfs_inodes entries)."""
        fs = os.statvfs(root)
        own_bytes, own_entries = usage_of(own) if own else (0, 0)
        return cls(fs.f_blocks * fs.f_frsize, (fs.f_blocks - fs.f_bfree) * fs.f_frsize, fs.f_files,
                   fs.f_files - fs.f_ffree, own_bytes, own_entries)

    def _reaches(self, nbytes: int, entries: int, share: float) -> bool:
        return (self.size > 0 and nbytes >= share * self.size) or (self.entries > 0 and entries >= share * self.entries)

    def others_hold(self) -> bool:
        """Whether what is outside `own` takes NEIGHBOURS_SHARE of the bytes or the entries."""
        return self._reaches(self.used_bytes - self.own_bytes, self.used_entries - self.own_entries, NEIGHBOURS_SHARE)

    def filled_alone(self) -> bool:
        """Whether `own` takes NEIGHBOURS_SHARE of the bytes or entries, and the rest does not."""
        return self._reaches(self.own_bytes, self.own_entries, NEIGHBOURS_SHARE) and not self.others_hold()

    def starved(self) -> bool:
        """Whether what is free plus what `own` holds is under STARVED_SHARE (bytes or entries).

        A compile that got ENOSPC with more than that within reach ran out of
        its own accord, or only says it did.
        """
        free_bytes, free_entries = self.size - self.used_bytes, self.entries - self.used_entries
        return ((self.size > 0 and free_bytes + self.own_bytes < STARVED_SHARE * self.size)
                or (self.entries > 0 and free_entries + self.own_entries < STARVED_SHARE * self.entries))


def neighbours_hold(root: str, own: str | None) -> bool:
    """Whether what is on `root`'s file system outside the folder `own` takes NEIGHBOURS_SHARE of it."""
    return TmpUsage.read(root, own).others_hold()


def has_room(root: str, memory_bytes: int = 0, pids: int = 0, cpus: float = 0.0) -> bool:
    """Whether jobs can come back: less than NEIGHBOURS_SHARE of `root`'s file system's bytes and entries, and of
    the sandbox's `memory_bytes` (a run the OOM killer took: runner.crowded_out) and `pids`, is used, and at most
    RUNNABLE_PER_CPU job threads per CPU of `cpus` wait to run (a run starved: runner.starved_out). 0: unknown."""
    if neighbours_hold(root, None):
        return False
    if cpus and usage.runnable_job_tasks() > RUNNABLE_PER_CPU * max(1.0, cpus):
        return False
    if not memory_bytes and not pids:
        return True
    held, tasks = usage.sandbox_usage()
    return not ((memory_bytes and held >= NEIGHBOURS_SHARE * memory_bytes)
                or (pids and tasks >= NEIGHBOURS_SHARE * pids))
