"""Memory snapshots: a warmed template checkpointed once, restored as clones.

A template sandbox is started cold, its agent imports and warms the
verifier libraries, and `docker checkpoint create` (CRIU) writes its memory
to a folder keyed by everything that shapes it: the image, the agent code
and the sandbox profile. A checkpoint on disk survives daemon restarts;
changing any input changes the key and builds a new one.

Whether it pays depends on the engine and the warm-up, so pools measure it
(StartChooser). On Docker 20.10 most of a restore is the engine moving the
checkpoint, not CRIU: it tars the checkpoint into containerd's content
store and containerd unpacks it again (0.5 s of a code sandbox's 0.9 s
restore here, 1.3 s of a math sandbox's 2 s), and the restore itself
(runc, CRIU) takes 0.37 to 0.65 s. Restores run in the pool's background
refill, never on a job's path. Restore failures fall back to cold starts,
and `state` says why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import shutil
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from sandboxd.backend import DockerBackend, profile_key
from sandboxd.config import MIB

log = logging.getLogger("sandboxd.snapshots")
CHECKPOINT_NAME = "warm"
COMPLETE_MARKER = "complete"
# Node-wide, not per state dir: every daemon on the node restores through one engine.
RESTORE_LOCK = Path("/run/sandboxd/restore.lock")
# pool.restore values: restore while restores get sandboxes ready sooner, or whenever a snapshot is ready.
RESTORE_POLICIES = ("auto", "always")
START_METHODS = ("restore", "cold")
# StartChooser compares the median ready time of each method's last few
# starts, and every PROBE_EVERY-th start tries the slower method again, so a
# choice follows a node whose load or engine changes (one slow start in 16).
RECENT_STARTS = 3
PROBE_EVERY = 16
# A failed snapshot is built again after pool.snapshot_retry_seconds, doubled
# with each failure in a row up to this cap: one checkpoint that fails (CRIU,
# the engine or the disk at a bad moment) must not leave a pool starting cold
# for the daemon's life. A try costs a template's cold start and a dump, a few
# seconds of a core.
RETRY_MAX_SECONDS = 6 * 3600.0
# A template that held more than this share of its sandbox's memory limit is
# not snapshotted: its pool starts cold (memory_too_tight). A restore needs
# room beyond what the template dumped: CRIU maps the dump's private memory
# before moving it into place, and on cgroup v1 the page cache of the image
# files it reads is charged to the sandbox too. The math template (its zygote
# without asyncio) peaks at 66 MiB under a 2 GiB limit (its dump holds about
# 66 MiB of pages), so under a 64 MiB limit it fits only by reclaim, at the
# limit; its restores there are OOM-killed inside CRIU (a failed start) or
# hang `criu restore`, and the engine's calls on that container, for
# minutes. A quarter of the limit left free (16 MiB of the smallest sandbox,
# 64 MiB; 512 MiB of the default 2 GiB) is a margin on the safe side, not a
# measured bound: a skipped snapshot costs only start time (pool.restore =
# auto starts cold anyway where cold starts are quicker), a restore without
# room costs the engine.
SNAPSHOT_MEMORY_SHARE = 0.75


def memory_too_tight(held_bytes: int, limit_bytes: int, *, peak: bool = True) -> str:
    """Why a template that held `held_bytes` (its cgroup's peak, or what it holds now where `peak` is false) under a
    memory limit of `limit_bytes` is not snapshotted: its restores would not fit beside the limit
    (SNAPSHOT_MEMORY_SHARE). "" where they fit, or where there is no limit (0)."""
    if limit_bytes <= 0 or held_bytes <= SNAPSHOT_MEMORY_SHARE * limit_bytes:
        return ""
    held = "peaked at" if peak else "held"
    return (f"the template {held} {held_bytes / MIB:.1f} MiB of its {limit_bytes / MIB:.1f} MiB memory limit, over "
            f"{SNAPSHOT_MEMORY_SHARE:.0%} of it: a CRIU restore needs room beyond what it dumps (restores this close "
            "to the limit were OOM-killed inside CRIU, or hung `criu restore` and the engine)")


def retry_pause(failures: int, first: float) -> float:
    """Seconds from a snapshot's `failures`-th failure in a row to its next build; `first` after the first."""
    return min(max(RETRY_MAX_SECONDS, first), first * 2.0 ** min(max(0, failures - 1), 32))


class StartChooser:
    """Restore from the snapshot or cold start: whichever gets this pool's sandboxes ready sooner.

    A restore skips the agent's warm-up but pays the engine's checkpoint
    round trip: on Docker 20.10 here every pool's restores are slower than
    its cold starts (figures in docs/design.md); a pool with a longer
    warm-up, or an engine with a cheaper restore, comes out the other way.
    So under `pool.restore = "auto"` a pool tries each method once,
    then uses the one whose recent starts (create to agent ready, less any
    wait for the node's restore turn, which at a daemon's start is a queue
    of every pool's first restores) were quicker; "always" restores
    whenever the snapshot is ready. The choice compares one start with
    another: it leans towards restores where a restore is only a little
    quicker, since restores take turns on the node while a pool starts
    `pool.start_concurrency` cold sandboxes at once.
    """

    def __init__(self, policy: str, *, recent: int = RECENT_STARTS, probe_every: int = PROBE_EVERY) -> None:
        if policy not in RESTORE_POLICIES:
            raise ValueError(f"unknown restore policy {policy!r}")
        self.policy = policy
        self._probe_every = probe_every
        self._seconds: dict[str, collections.deque[float]] = {
            method: collections.deque(maxlen=recent) for method in START_METHODS}
        self._tried: set[str] = set()
        self._choices = 0

    def choose(self, snapshot_usable: bool) -> str:
        """The method for the next start ("restore" or "cold")."""
        if not snapshot_usable:
            return "cold"
        if self.policy == "always":
            return "restore"
        self._choices += 1
        for method in START_METHODS:
            if method not in self._tried:
                self._tried.add(method)
                return method
        preferred = self.preferred
        if self._choices % self._probe_every == 0:
            return "cold" if preferred == "restore" else "restore"
        return preferred

    def record(self, method: str, seconds: float) -> None:
        """A start by `method` was ready after `seconds` (failed starts are not recorded)."""
        self._seconds[method].append(seconds)

    def median(self, method: str) -> float:
        """Median ready seconds of the method's recent starts; 0.0 before any."""
        recent = self._seconds[method]
        return statistics.median(recent) if recent else 0.0

    def summary(self) -> str:
        """The recent medians, for a log line: a method with no start yet says so, not "0.00 s"."""
        return ", ".join(f"{method} {self.median(method):.2f} s" if self._seconds[method]
                         else f"{method} not measured yet" for method in START_METHODS)

    @property
    def preferred(self) -> str:
        """The method that was quicker recently.

        Before both have a time: restore, unless a restore was tried (it
        failed, or has not finished) and only cold starts have a time.
        """
        if not all(self._seconds.values()):
            return "cold" if self._seconds["cold"] and "restore" in self._tried else "restore"
        return "cold" if self.median("cold") < self.median("restore") else "restore"

    def method(self, snapshot_usable: bool) -> str:
        """What the pool's starts use now, for its status (probes aside)."""
        if not snapshot_usable:
            return "cold"
        return "restore" if self.policy == "always" else self.preferred


@functools.cache
def criu_problem() -> str:
    """'' when CRIU works on this kernel, otherwise why not (checked once per process)."""
    criu = shutil.which("criu")
    if criu is None:
        return "criu is not installed"
    try:
        check = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"criu check failed: {exc}"
    if check.returncode != 0:
        last = (check.stderr or check.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"criu check failed: {last[0]}"
    return ""


class SnapshotStore:
    """Per-pool snapshot state: disabled, building, ready or failed.

    Disabled is for good (CRIU cannot work here). Failed is until
    `retry_at`: the pool then calls `prepare` again (see `retry_due`).
    `check_criu` false skips `criu check` in this process: the engine runs
    CRIU on its host, which a daemon in a container does not see (it has
    no criu, nor the rights `criu check` needs); a checkpoint that fails
    there fails the snapshot as any other, and its pool starts cold.
    """

    def __init__(self, backend: DockerBackend, state_dir: str, enabled: bool, engine_temp_dir: str,
                 pool: str = "", retry_seconds: float = 300.0, check_criu: bool = True) -> None:
        self._backend = backend
        self._retry_seconds = retry_seconds
        self._pool = pool
        self._engine_temp_dir = engine_temp_dir
        self._root = Path(state_dir) / "snapshots"
        self.state = "building"
        self.problem = ""
        # Failures in a row, and when (time.monotonic) the snapshot is built again after the last.
        self.failures = 0
        self.retry_at: float | None = None
        if not enabled:
            self.disable("disabled in configuration")
        elif not backend.experimental:
            self.disable("the Docker engine runs without experimental features (needed for checkpoints)")
        elif check_criu:
            problem = criu_problem()
            if problem:
                self.disable(problem)
        self._lock = asyncio.Lock()
        self._restore_lock = asyncio.Lock()
        self.path: Path | None = None

    def disable(self, why: str) -> None:
        """Never snapshot this pool: CRIU cannot work here, its sandboxes hold state CRIU cannot capture, or its
        restores would not fit in its sandboxes' memory (memory_too_tight)."""
        self.state = f"disabled: {why}"
        self.problem = why

    @property
    def disabled(self) -> bool:
        return self.state.startswith("disabled")

    @property
    def usable(self) -> bool:
        return self.state == "ready" and self.path is not None

    @property
    def retry_due(self) -> bool:
        """Whether the snapshot failed and its pause (retry_pause) is over: time to build it again."""
        return self.retry_at is not None and time.monotonic() >= self.retry_at

    @staticmethod
    def key(parts: dict[str, object]) -> str:
        """The snapshot's name: a digest of `parts` and of the sandboxes' hardening profile.

        CRIU restores a template's seccomp filter, rlimits and tmpfs mounts
        into its clones whatever their containers ask for, so a profile
        change (sandboxd/backend.py) must build a new snapshot, as a code
        change does.
        """
        parts = {**parts, "profile": profile_key()}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    async def prepare(self, key: str, make_template: Callable[[], Awaitable[str]]) -> None:
        """Make the checkpoint for `key` exist, building it from a fresh template if needed.

        `make_template` starts a warmed template sandbox and returns its
        container id; the template is checkpointed, then removed. Never
        raises for the store's own files: a state dir that is full or cannot
        be written (ENOSPC on the lock file or the marker) fails the
        snapshot, and the pool starts cold. Raised, it ended the pool's
        upkeep, and the pool never started a sandbox.
        """
        if self.disabled or (self.problem and not self.retry_due):
            return
        self.retry_at = None
        try:
            await self._prepare(key, make_template)
        except OSError as exc:
            self.fail(f"the snapshot store {self._root} cannot be written: {exc}")
            return
        if self.usable:
            self.failures = 0
            self.problem = ""

    async def _prepare(self, key: str, make_template: Callable[[], Awaitable[str]]) -> None:
        async with self._lock:
            folder = self._root / key
            self._root.mkdir(parents=True, exist_ok=True)
            # Daemons sharing a state dir (two on one node, tests) must not
            # build one key at once: the second would delete the first's work.
            lock_file = open(self._root / f"{key}.lock", "w")  # noqa: SIM115 - held across awaits
            try:
                await asyncio.to_thread(fcntl.flock, lock_file, fcntl.LOCK_EX)
                await self._build(folder, make_template)
            finally:
                lock_file.close()

    async def _build(self, folder: Path, make_template: Callable[[], Awaitable[str]]) -> None:
        if (folder / COMPLETE_MARKER).exists():
            self.path, self.state = folder / CHECKPOINT_NAME, "ready"
            return
        self.state = "building"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        container_id = ""
        try:
            container_id = await make_template()
            reading = await asyncio.to_thread(self._backend.memory_peak, container_id)
            too_tight = "" if reading is None else memory_too_tight(reading[0], reading[1], peak=reading[2])
            if too_tight:
                shutil.rmtree(folder, ignore_errors=True)
                # For good, so logged once: the template's memory is the same at every try (the key holds the
                # limit and the code).
                self.disable(too_tight)
                log.warning("pool %s: no snapshot: %s; its sandboxes start cold", self._pool, too_tight)
                return
            await asyncio.to_thread(self._backend.checkpoint, container_id, CHECKPOINT_NAME, str(folder),
                                    exit_after=True)
        except Exception as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self.fail(f"checkpoint failed: {exc}")
            return
        finally:
            if container_id:
                try:
                    await asyncio.to_thread(self._backend.remove, container_id)
                except Exception as exc:
                    # An engine error here is no fault of the store's (prepare() takes OSError, which
                    # docker's errors are, for one); the checkpoint is made, the template is left over.
                    log.warning("pool %s: could not remove the snapshot template %s: %s", self._pool,
                                container_id[:12], exc)
        # Written last: a dump interrupted half-way is rebuilt, never restored.
        (folder / COMPLETE_MARKER).touch()
        self.path, self.state = folder / CHECKPOINT_NAME, "ready"

    @contextlib.asynccontextmanager
    async def restoring(self) -> AsyncIterator[None]:
        """Held around `docker start --checkpoint`: one restore at a time on the node.

        containerd's client (Docker 20.10) copies the whole checkpoint into
        `<engine temp dir>/ctrd-checkpoint*` for each restore and never
        deletes it (67 MB a restore for the python image: a thousand
        restores fill tens of GB of disk). Under the lock no restore of ours
        is in flight, so every such copy is a leftover. (Restores of one
        snapshot also race on containerd's commit by digest, "content
        sha256:... already exists"; each clone's copy carries a file of its
        own, see DockerBackend.install_checkpoint.)
        """
        async with self._restore_lock:
            RESTORE_LOCK.parent.mkdir(parents=True, exist_ok=True)
            with open(RESTORE_LOCK, "w") as lock_file:
                await asyncio.to_thread(fcntl.flock, lock_file, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    for leftover in Path(self._engine_temp_dir).glob("ctrd-checkpoint*"):
                        shutil.rmtree(leftover, ignore_errors=True)

    def fail(self, why: str) -> None:
        """A restore or checkpoint failed: fall back to cold starts until `retry_at`."""
        if self.path is not None:
            shutil.rmtree(self.path.parent, ignore_errors=True)
        self.path = None
        self.state = f"failed: {why}"[:500]
        self.problem = why
        self.failures += 1
        pause = retry_pause(self.failures, self._retry_seconds)
        self.retry_at = time.monotonic() + pause
        # Info and metrics show the state; the log says when, and why (a full disk, say).
        log.warning("pool %s: snapshot %s; its sandboxes start cold, and it is built again in %.0f s",
                    self._pool, self.state, pause)
