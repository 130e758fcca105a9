"""Warm pools of sandboxes, one per image.

The pool speaks in sandboxes. It keeps `target` of them ready, restores
new ones from the image's snapshot in the background (cold start when no
snapshot is usable), retires a sandbox after `recycle_after_jobs` or at the
first sign of damage, follows the trainer's batch hint and its own queue,
and shrinks back when idle. Nothing here blocks a job on Docker: acquire()
only ever waits for a sandbox that is already warm.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import hashlib
import itertools
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import sandboxd
from sandboxd import metrics
from sandboxd.agent.protocol import LANDLOCK_SCOPE_ABI
from sandboxd.backend import (
    LABEL_IMAGE,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_OWNER,
    LABEL_POOL,
    DockerBackend,
    SandboxSpec,
)
from sandboxd.config import Config
from sandboxd.errors import NoSandbox, PoolFailing, SandboxLost
from sandboxd.sandbox import Sandbox
from sandboxd.snapshots import CHECKPOINT_NAME, SnapshotStore, StartChooser

log = logging.getLogger("sandboxd.pool")
# A cold math sandbox imports sympy and friends; a restore replays pages.
# Both take seconds on the 2-core machine (bench/ready.py measures them).
READY_TIMEOUT_SECONDS = 120.0
MAINTAIN_INTERVAL_SECONDS = 0.5
# A sandbox whose /tmp other runs filled (mark_full) is asked this often
# whether its space is back; its filler's files go once that job ends. One
# still full after FULL_RECYCLE_SECONDS (a filler that holds it to its
# deadline) is replaced instead: a start costs less than a slot held idle.
ROOM_POLL_SECONDS = 0.25
FULL_RECYCLE_SECONDS = 10.0
# A removal the engine refused (a hiccup, a busy containerd) is tried again after these pauses
# rather than left to the daemon's orphan sweep, 5 minutes away: until it goes, a sandbox keeps
# its memory, its processes and whatever a job left running in it.
REMOVE_RETRY_SECONDS = (1.0, 4.0, 15.0, 60.0)
_control_serial = itertools.count()
# How long a failed start waits for the engine to see a container whose agent hung up stop (Docker's exit
# event trails PID 1's death), so that its exit report says why.
EXIT_REPORT_WAIT_SECONDS = 5.0
# Consecutive failed restores before a pool gives up on its snapshot.
RESTORE_FAILURES_BEFORE_COLD = 3
# Sandbox starts that fail in a row, with no sandbox ready, before the pool
# counts as failing: the jobs waiting for it are answered (NoSandbox) instead
# of waiting for a sandbox that may never come, new ones are answered at
# once, and the daemon reports SERVING without it. A math pool under a 64 MiB
# sandbox memory limit (its agent imports sympy) never starts one; it held
# every job and kept the whole daemon NOT_SERVING.
FAILING_AFTER_STARTS = 3
# The pause after a failed start, doubled with each failure in a row up to
# the cap: such a pool created and started a container every second, for ever.
START_RETRY_SECONDS = 1.0
START_RETRY_MAX_SECONDS = 60.0
# Modules the agent imports before the snapshot, so every worker forks warm.
WARM_MODULES = {
    "python": "sandboxd.verifiers.code,sandboxd.verifiers.python.harness",
    "langs": "sandboxd.verifiers.code,sandboxd.verifiers.python.harness",
    # Math jobs have sandboxes of their own (on the python image), whose one
    # zygote holds sympy and Math-Verify (about 60 MB) for the long-lived
    # math servers. Code sandboxes stay lean: a worker's fork and exit cost
    # grows with its zygote's memory, and an idle code sandbox needs about
    # 25 MB instead of the 80 MB a math sandbox needs. The math servers'
    # own module is warmed too, so that a server's start imports nothing.
    "math": "sandboxd.verifiers.math,sandboxd.agent.forked.mathserver",
    # Sessions fork from a lean zygote: every page it holds is shared by up
    # to sessions.per_sandbox live interpreters, and a cell imports what it uses.
    "sessions": "sandboxd.agent.forked.repl",
}
# The pool that runs math jobs; it runs the python image.
MATH_POOL = "math"


def stage_agent_code(state_dir: str) -> tuple[str, str]:
    """Copy the agent and verifier modules to a folder the sandboxes mount read-only.

    Only what runs inside a sandbox is exposed there (not the daemon, not
    the host's site-packages), and its digest keys the snapshot, so a code
    change rebuilds the snapshot instead of restoring stale code.

    The copies are byte-compiled here: a sandbox cannot write `__pycache__`
    to a read-only mount, so every cold start compiled them again (36 ms of
    a code sandbox's 0.4 s cold start here). The image's interpreter uses
    them when its version matches ours (cpython-311 files for 3.11.x) and
    compiles as before when it does not.
    """
    package = Path(sandboxd.__file__).parent
    # With their subpackages: the agent's host/ and forked/, sandboxd.verifiers.math, .code and .python.
    files = sorted([package / "__init__.py", *(package / "agent").rglob("*.py"),
                    *(package / "verifiers").rglob("*.py")])
    digest = hashlib.sha256()
    digest.update(f"bytecode {sys.implementation.cache_tag}".encode())
    for file in files:
        digest.update(str(file.relative_to(package)).encode())
        digest.update(file.read_bytes())
    key = digest.hexdigest()[:16]
    target = Path(state_dir) / "agent-code" / key
    marker = target / "sandboxd" / "agent" / "__main__.py"
    if marker.exists():
        return str(target), key
    # Daemons sharing a state dir (several on one node) may stage the same code at once: each stages in a
    # folder of its own and renames it into place, so none removes another's work or the folder another
    # has just staged and is mounting.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".tmp", dir=target.parent))
    try:
        for file in files:
            destination = staging / "sandboxd" / file.relative_to(package)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, destination)
        # Timestamp-checked pycs: copy2 kept each source's mtime, which they record.
        if not compileall.compile_dir(str(staging), quiet=2):
            raise RuntimeError(f"could not byte-compile the agent code in {staging}")
        os.chmod(staging, 0o755)  # mkdtemp's 0700; the sandboxes' users read it
        try:
            staging.rename(target)
        except OSError:
            if marker.exists():
                return str(target), key  # another daemon's staging won
            # A folder without the agent (an older daemon's staging that died half-way; stagings are now
            # renamed into place whole): replaced.
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target), key


class Pool:
    """Sandboxes of one image, each with `capacity` slots.

    A slot is a running job for a `jobs` pool and an open session for a
    `sessions` pool (held from Open to Close, so open sessions count as demand).
    """

    # Whether the daemon waits for this pool to be warm before it reports SERVING.
    gates_health = True

    def __init__(self, name: str, image: str, backend: DockerBackend, config: Config, *, instance: str,
                 node: str, code_dir: str, code_key: str, on_change: Callable[[], None] = lambda: None,
                 kind: str = "jobs") -> None:
        if kind not in ("jobs", "sessions"):
            raise ValueError(f"unknown pool kind {kind!r}")
        self.name = name
        self.kind = kind
        self.image = image
        self.backend = backend
        self.config = config
        self.instance = instance
        self.node = node
        self.code_dir = code_dir
        self.snapshots = SnapshotStore(backend, config.sandbox.state_dir, config.pool.snapshots,
                                       config.docker.temp_dir, pool=name,
                                       retry_seconds=config.pool.snapshot_retry_seconds,
                                       check_criu=config.pool.criu_check)
        self.start_chooser = StartChooser(config.pool.restore)
        self.agent_args = ["--private-tmp", "--warm", WARM_MODULES.get(name, ""), *self._math_args(name, config)]
        self.snapshot_key = SnapshotStore.key({
            "image": image, "code": code_key, "memory": config.sandbox.memory_bytes, "cpus": config.sandbox.cpus,
            "pids": config.sandbox.pids, "tmpfs": config.sandbox.tmpfs_bytes,
            "tmpfs_inodes": config.sandbox.tmpfs_inodes, "agent": self.agent_args,
            "loopback": config.sandbox.loopback,
        })
        # Subclasses whose sandboxes load more at start (a reward model) allow longer,
        # and those that run no job code need no recycling (0: never).
        self.ready_timeout = READY_TIMEOUT_SECONDS
        self.recycle_after_jobs = config.pool.recycle_after_jobs
        self.sandboxes: list[Sandbox] = []
        self.starting = 0
        self.batch_hint = 0
        self.waiting = 0
        # Of `waiting`, those asleep on `_available` (a newcomer queues behind them).
        self._sleepers = 0
        # fail_waiters() calls so far, and the last one's reason and error: a waiter woken by one gives up.
        self._outages = 0
        self._outage_reason = ""
        self._outage_error: type[NoSandbox] = NoSandbox
        self.jobs_total = 0
        self.recycled_total = 0
        self.languages: list[str] = []
        self.last_busy = time.monotonic()
        self._changed = asyncio.Event()
        self._available = asyncio.Condition()
        self._on_change = on_change
        self._start_slots = asyncio.Semaphore(config.pool.start_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._watched_full: set[Sandbox] = set()
        self._restore_failures = 0
        self._template_dir = ""
        self._snapshot_build: asyncio.Task[None] | None = None  # a failed snapshot's rebuild, while it runs
        # Sandbox starts failed in a row (0 after a success), and the last one's error.
        self.start_failures = 0
        self.start_error = ""
        self._told_landlock = False

    # ---- sizing --------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Slots per sandbox."""
        if self.kind == "sessions":
            return self.config.sessions.per_sandbox
        return self.config.pool.jobs_per_sandbox

    @property
    def target(self) -> int:
        pool = self.config.pool
        if self.kind == "sessions":
            sessions = self.config.sessions
            held = sum(s.in_flight for s in self.sandboxes)
            demand = max(self.batch_hint, held + self.waiting)
            wanted = math.ceil(demand * (1 + sessions.headroom) / self.capacity)
            return max(sessions.min_sandboxes, min(sessions.max_sandboxes, wanted))
        idle_for = time.monotonic() - self.last_busy
        floor = pool.min_size
        if pool.scale_to_zero and idle_for > pool.idle_seconds and not self.waiting:
            floor = 0
        wanted = math.ceil((self.batch_hint + self.waiting) / self.capacity)
        if idle_for > pool.idle_seconds and not self.waiting:
            wanted = 0
        return max(floor, min(pool.size_limit, wanted))

    @property
    def most_sandboxes(self) -> int:
        """The most sandboxes the pool may hold, starting ones included."""
        if self.kind == "sessions":
            return self.config.sessions.max_sandboxes
        return self.config.pool.size_limit

    @property
    def min_ready(self) -> int:
        """Sandboxes that must be warm before the daemon reports SERVING."""
        return min(1, self.config.sessions.min_sandboxes if self.kind == "sessions" else self.config.pool.min_size)

    @property
    def failing(self) -> bool:
        """Whether the pool cannot start sandboxes: FAILING_AFTER_STARTS failed in a row, none ready."""
        return self.start_failures >= FAILING_AFTER_STARTS and not self.ready

    @property
    def failing_reason(self) -> str:
        return (f"pool {self.name} cannot start sandboxes ({self.start_failures} starts failed in a row; "
                f"the last: {self.start_error})")

    @property
    def ready(self) -> list[Sandbox]:
        return [s for s in self.sandboxes if not s.damaged and not s.retiring]

    def busy_count(self) -> int:
        return sum(1 for s in self.sandboxes if s.in_flight)

    def set_batch_hint(self, batch_size: int) -> None:
        self.batch_hint = batch_size
        self.last_busy = time.monotonic()
        self._changed.set()

    # ---- acquiring ------------------------------------------------------------
    def _pick(self) -> Sandbox | None:
        candidates = [s for s in self.ready if s.in_flight < self.capacity and not s.full]
        if not candidates:
            return None
        # Least loaded first, then the longest-warm: spreads jobs over CPUs.
        return min(candidates, key=lambda s: (s.in_flight, s.serial))

    async def acquire(self) -> Sandbox:
        """A slot in the least loaded ready sandbox; jobs that find none wait their turn, first come first served.

        A freed slot wakes one waiter (release), not all of them: a
        score_batch queues its whole batch here, and waking every waiter had
        each of up to a thousand look for a slot after every job (100 looks
        per job in a 1,024-job batch). So that the one woken is not
        overtaken, a job that arrives while others sleep queues behind them,
        and a job that takes a slot while another is still free wakes the
        next sleeper.
        """
        self.waiting += 1
        self.last_busy = time.monotonic()
        self._changed.set()
        outages = self._outages
        try:
            async with self._available:
                if self.failing:
                    raise PoolFailing(self.failing_reason)
                try:
                    sandbox = None if self._sleepers else self._pick()
                    while sandbox is None:
                        self._sleepers += 1
                        try:
                            await self._available.wait()
                        finally:
                            self._sleepers -= 1
                        sandbox = self._pick()
                        if sandbox is None and self._outages != outages:
                            raise self._outage_error(self._outage_reason)
                except BaseException:
                    # A waiter cancelled just after it was woken takes the wake-up
                    # with it (asyncio.Condition before 3.13): pass it on, or a free
                    # slot could sit unused while others wait. Extra wake-ups are harmless.
                    self._available.notify(1)
                    raise
                sandbox.in_flight += 1
                if self._sleepers and self._pick() is not None:
                    self._available.notify(1)
                return sandbox
        finally:
            self.waiting -= 1

    async def fail_waiters(self, reason: str, error: type[NoSandbox] = NoSandbox) -> int:
        """Answer every job now waiting for a sandbox with `error`(reason); how many there were.

        For an engine outage, or a pool whose starts keep failing (PoolFailing):
        no sandbox can start, so a waiter could wait for ever. Jobs that come
        to wait after this call wait as usual (but see `failing`).
        """
        async with self._available:
            waiters = self._sleepers
            if waiters:
                self._outages += 1
                self._outage_reason = reason
                self._outage_error = error
                self._available.notify_all()
        return waiters

    async def release(self, sandbox: Sandbox) -> None:
        sandbox.in_flight -= 1
        sandbox.jobs_done += 1
        self.last_busy = time.monotonic()
        self.jobs_total += 1
        if self.recycle_after_jobs and sandbox.jobs_done >= self.recycle_after_jobs:
            sandbox.retiring = True
        if sandbox.damaged or sandbox.retiring:
            self._changed.set()
        # One slot freed: one waiter (see acquire).
        async with self._available:
            self._available.notify(1)

    # ---- the background loop ---------------------------------------------------
    def start(self) -> None:
        self._spawn(self._maintain())

    def _spawn(self, coroutine) -> asyncio.Task[None]:  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _prepare_snapshot(self) -> None:
        await self.snapshots.prepare(self.snapshot_key, self._start_template)
        if self._template_dir:
            shutil.rmtree(self._template_dir, ignore_errors=True)
            self._template_dir = ""
        self._on_change()

    async def _maintain(self) -> None:
        await self._prepare_snapshot()
        while not self._closed:
            # A failed snapshot is built again once its pause is over, beside
            # the refill: the pool keeps starting cold meanwhile.
            if self.snapshots.retry_due and (self._snapshot_build is None or self._snapshot_build.done()):
                self._snapshot_build = self._spawn(self._prepare_snapshot())
            try:
                await self._reconcile()
            except Exception:
                log.exception("pool %s: reconcile failed", self.name)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), MAINTAIN_INTERVAL_SECONDS)

    async def _reconcile(self) -> None:
        for sandbox in list(self.sandboxes):
            if (sandbox.damaged or sandbox.retiring) and sandbox.in_flight == 0:
                self.sandboxes.remove(sandbox)
                self.recycled_total += 1
                self._spawn(self._remove(sandbox))
        target = self.target
        # A full sandbox (mark_full) takes no job until its space is back: it
        # does not count towards the target, but does towards the ceiling.
        live = sum(1 for s in self.ready if not s.full) + self.starting
        room = self.most_sandboxes - len(self.ready) - self.starting
        for _ in range(min(target - live, room)):
            self.starting += 1
            self._spawn(self._add_one())
        # Shrink: retire idle sandboxes beyond the target, full ones first, then newest first.
        extra = len(self.ready) - target
        for sandbox in sorted(self.ready, key=lambda s: (not s.full, -s.serial)):
            if extra <= 0:
                break
            if sandbox.in_flight == 0:
                sandbox.retiring = True
                extra -= 1
        self._on_change()

    @staticmethod
    def _math_args(name: str, config: Config) -> list[str]:
        if name != MATH_POOL:
            return []
        # One warm math server per CPU of the sandbox, started at `prepare`
        # (after the snapshot) for the default memory limit, which most jobs use.
        return ["--math-servers", str(max(1, math.ceil(config.sandbox.cpus))),
                "--math-memory", str(config.limits.default_memory_bytes)]

    def _spec(self, name: str, control_dir: str) -> SandboxSpec:
        sandbox = self.config.sandbox
        return SandboxSpec(
            name=name,
            image=self.image,
            command=["python3", "-m", "sandboxd.agent", *self.agent_args],
            control_dir=control_dir,
            code_dir=self.code_dir,
            labels={LABEL_MANAGED: "1", LABEL_INSTANCE: self.instance, LABEL_NODE: self.node,
                    LABEL_OWNER: owner_token(), LABEL_POOL: self.name, LABEL_IMAGE: self.image},
            memory_bytes=sandbox.memory_bytes,
            nano_cpus=int(sandbox.cpus * 1e9),
            pids=sandbox.pids,
            tmpfs_bytes=sandbox.tmpfs_bytes,
            tmpfs_inodes=sandbox.tmpfs_inodes,
            loopback=sandbox.loopback,
        )

    def _new_name(self, suffix: str) -> tuple[str, str]:
        name = f"sandboxd-{self.instance}-{self.name}-{suffix}"
        # The agent's socket path must fit AF_UNIX's 108 bytes: keep the
        # folder name short (instance + a counter), not the container name.
        control_dir = os.path.join(self.config.sandbox.run_dir, f"{self.instance}-{next(_control_serial)}")
        shutil.rmtree(control_dir, ignore_errors=True)
        os.makedirs(control_dir, mode=0o700)
        return name, control_dir

    async def _start_template(self) -> str:
        template, _ready = await self._boot("template", restore=False, prepare=False)
        # CRIU cannot dump a socket connected to a process outside the
        # container: the agent must hold no connection of ours at the checkpoint.
        await template.close_connections(wait=True)
        # The snapshot store removes the container once it is checkpointed; its folder is ours to remove.
        self._template_dir = template.control_dir
        return template.container_id

    async def _add_one(self) -> None:
        try:
            async with self._start_slots:
                sandbox = await self._start_sandbox()
        except Exception as exc:
            metrics.SANDBOX_START_FAILURES.labels(self.name).inc()
            # A start that failed while the engine does not answer is the engine's
            # outage, which the daemon's watch handles (its waiting jobs wait up to
            # scheduler.engine_outage_seconds), not a sign that this pool is broken.
            if await asyncio.to_thread(self.backend.answers):
                self.start_failures += 1
                self.start_error = str(exc)
                log.warning("pool %s: sandbox failed to start (%d in a row): %s", self.name, self.start_failures, exc)
            else:
                log.warning("pool %s: sandbox failed to start, the engine not answering: %s", self.name, exc)
            if self.failing:
                await self.fail_waiters(self.failing_reason, PoolFailing)
            self._on_change()
            # Counted as starting while it waits: the pool starts no other sandbox meanwhile.
            await asyncio.sleep(start_retry_pause(max(1, self.start_failures)))
            return
        finally:
            self.starting -= 1
        self.start_failures = 0
        self.start_error = ""
        if self._closed:
            await self._remove(sandbox)
            return
        self.sandboxes.append(sandbox)
        self.languages = sandbox.languages
        async with self._available:
            self._available.notify(self.capacity)
        self._on_change()

    async def _start_sandbox(self) -> Sandbox:
        started = time.monotonic()
        # Cold starts made while the snapshot is still building compete with
        # the template's warm-up: they are not what a cold start costs.
        measured = self.snapshots.usable
        method = self.start_chooser.choose(measured)
        sandbox, ready = await self._boot(f"{int(time.time() * 1000) % 10**9:09d}{os.urandom(2).hex()}",
                                          restore=method == "restore")
        self._on_ready(sandbox, ready)
        sandbox.ready_seconds = time.monotonic() - started
        if measured:
            before = self.start_method
            # Without the wait for the node's restore turn: at a daemon's start every
            # pool restores at once, and that queue says nothing of a restore's cost.
            self.start_chooser.record(method, sandbox.ready_seconds - sandbox.restore_wait_seconds)
            if self.start_method != before:
                log.info("pool %s: starting sandboxes by %s now (recent medians: %s)",
                         self.name, self.start_method, self.start_chooser.summary())
        metrics.SANDBOX_STARTS.labels(self.name, sandbox.started_by).inc()
        metrics.SANDBOX_READY_SECONDS.labels(self.name, sandbox.started_by).set(sandbox.ready_seconds)
        return sandbox

    @property
    def start_method(self) -> str:
        """How this pool starts sandboxes now: "restore" or "cold" (StartChooser)."""
        return self.start_chooser.method(self.snapshots.usable)

    def _on_ready(self, sandbox: Sandbox, ready: dict[str, Any]) -> None:
        """Learn from the agent's `hello` and `prepare` replies (subclasses learn more)."""
        sandbox.languages = ready.get("languages", [])
        abi = int(ready.get("landlock_abi", 0))
        if abi < LANDLOCK_SCOPE_ABI and not self._told_landlock:
            self._told_landlock = True
            log.warning("pool %s: the kernel's Landlock ABI is %d (6, Linux 6.12, scopes abstract Unix sockets): "
                        "runs in one sandbox can reach each other's abstract Unix sockets", self.name, abi)

    async def _boot(self, suffix: str, *, restore: bool, prepare: bool = True) -> tuple[Sandbox, dict[str, Any]]:
        """Create a sandbox and start it, restored from the snapshot or cold, until its agent answers.

        `prepare` then has the agent start what a snapshot cannot hold (warm
        math servers), so a pool sandbox is ready for jobs at full speed.
        """
        name, control_dir = self._new_name(suffix)
        container_id = await asyncio.to_thread(self.backend.create, self._spec(name, control_dir))
        sandbox = Sandbox(name=name, pool=self.name, container_id=container_id, control_dir=control_dir,
                          started_by="restore" if restore else "cold")
        try:
            if restore:
                assert self.snapshots.path is not None
                try:
                    # Counted as a failed restore too: a checkpoint deleted from the store
                    # fails every start, and uncounted the pool would never fall back to cold.
                    await asyncio.to_thread(self.backend.install_checkpoint, container_id, self.snapshots.path,
                                            CHECKPOINT_NAME)
                    waiting_since = time.monotonic()
                    async with self.snapshots.restoring():
                        sandbox.restore_wait_seconds = time.monotonic() - waiting_since
                        await asyncio.to_thread(self.backend.start, container_id, CHECKPOINT_NAME)
                    self._restore_failures = 0
                except Exception as exc:
                    self._restore_failures += 1
                    # Once: restores already under way fail after it, and must not count as the rebuild's failures.
                    if self._restore_failures >= RESTORE_FAILURES_BEFORE_COLD and self.snapshots.usable:
                        self.snapshots.fail(f"restore failed {self._restore_failures} times: {exc}")
                        self._restore_failures = 0
                    raise
            else:
                await asyncio.to_thread(self.backend.start, container_id)
            uid_slot = await asyncio.to_thread(self.backend.init_pid, container_id)
            if not uid_slot:
                raise RuntimeError(f"sandbox {name} stopped as it started")
            ready = await sandbox.wait_ready(self.ready_timeout, self._alive(container_id), uid_slot,
                                             self.config.sandbox.memory_bytes, self.config.sandbox.pids,
                                             self.config.sandbox.cpus)
            if prepare:
                ready.update(await sandbox.request({"op": "prepare"}, timeout=self.ready_timeout))
        except Exception as exc:
            # An agent that died before it answered (an image that cannot run
            # it, a memory limit too small for its warm-up) said why in the
            # container's output; the error at hand only says nothing listens.
            # An agent that hung up (SandboxLost) has most likely died: wait a little for the engine to see its
            # container stop, or the report is "" (a 64 MiB math sandbox's agent, killed at the memory limit
            # as it prepares, would often be reported as a bare "EOFError").
            report = await asyncio.to_thread(self.backend.exit_report, container_id,
                                             EXIT_REPORT_WAIT_SECONDS if isinstance(exc, SandboxLost) else 0.0)
            await self._remove(sandbox)
            if report:
                raise RuntimeError(f"sandbox {name} stopped before its agent answered: {report}") from exc
            raise
        except BaseException:
            await self._remove(sandbox)
            raise
        return sandbox, ready

    def _alive(self, container_id: str) -> Callable[[], Awaitable[bool]]:
        async def alive() -> bool:
            return await asyncio.to_thread(self.backend.is_running, container_id)

        return alive

    async def _remove(self, sandbox: Sandbox) -> None:
        await sandbox.close_connections()
        if await self._try_remove(sandbox) or self._closed:
            self._removed(sandbox)
        else:
            self._spawn(self._remove_again(sandbox))
        shutil.rmtree(sandbox.control_dir, ignore_errors=True)

    def _removed(self, sandbox: Sandbox) -> None:
        """`sandbox`'s container is gone (or given up on): what it held (a GPU) may go to another."""

    async def _try_remove(self, sandbox: Sandbox) -> bool:
        try:
            await asyncio.to_thread(self.backend.remove, sandbox.container_id)
        except Exception as exc:
            log.warning("pool %s: could not remove %s: %s", self.name, sandbox.name, exc)
            return False
        return True

    async def _remove_again(self, sandbox: Sandbox) -> None:
        try:
            for pause in REMOVE_RETRY_SECONDS:
                await asyncio.sleep(pause)
                if self._closed:
                    return  # the next daemon's start-up reaps it
                if await self._try_remove(sandbox):
                    log.info("pool %s: removed %s on a later try", self.name, sandbox.name)
                    return
            log.warning("pool %s: gave up removing %s; the orphan sweep will", self.name, sandbox.name)
        finally:
            self._removed(sandbox)

    def check_alive(self, running: set[str], watched: list[Sandbox]) -> None:
        """The engine's list of running containers (taken after `watched`, the pool's sandboxes then) came in:
        a sandbox whose container stopped, vanished or is paused is lost now, not when a job finds out.

        Otherwise dead sandboxes count as ready (in the status too) until a
        job hits them, and are not replaced, and a job spends its attempts on
        them: after the engine restarts, or every container is removed, a job
        on a pool of 4 would be answered SANDBOX_LOST in 12 ms by a healthy
        engine.
        """
        for sandbox in watched:
            if sandbox.container_id not in running and not sandbox.damaged and sandbox in self.sandboxes:
                log.warning("pool %s: %s is no longer running; replacing it", self.name, sandbox.name)
                sandbox.abort()
                self.mark_lost(sandbox)

    def mark_lost(self, sandbox: Sandbox) -> None:
        sandbox.damaged = True
        self._changed.set()

    def mark_full(self, sandbox: Sandbox) -> None:
        """Give `sandbox` no job until it has room again (`Sandbox.has_room`), or replace it past a bound.

        A job that finds the /tmp space, the pids, the memory or the CPU
        taken by other runs there is not at fault (SandboxFull): it runs
        elsewhere.
        Handed new jobs, the sandbox would only send each of them elsewhere
        too, an attempt spent per job.
        """
        sandbox.full = True
        self._changed.set()  # a replacement may start meanwhile (_reconcile)
        if sandbox not in self._watched_full:
            self._watched_full.add(sandbox)
            self._spawn(self._until_room(sandbox))

    async def _until_room(self, sandbox: Sandbox) -> None:
        give_up_at = time.monotonic() + FULL_RECYCLE_SECONDS
        try:
            while True:
                await asyncio.sleep(ROOM_POLL_SECONDS)
                # Retired, lost or closed meanwhile: the sandbox may be gone, its connections closed.
                if sandbox.damaged or sandbox.retiring or self._closed:
                    return
                reports = sandbox.full_reports
                try:
                    room = await sandbox.has_room()
                except SandboxLost as exc:
                    log.warning("pool %s: %s", self.name, exc)
                    self.mark_lost(sandbox)
                    return
                # A job that found it full while `room` was asked: that answer is stale.
                if room and sandbox.full_reports == reports:
                    sandbox.full = False
                    self._changed.set()  # the replacement started meanwhile is extra now
                    async with self._available:
                        self._available.notify(self.capacity)
                    return
                if time.monotonic() >= give_up_at:
                    log.warning("pool %s: %s is still full after %g s; replacing it", self.name, sandbox.name,
                                FULL_RECYCLE_SECONDS)
                    sandbox.retiring = True
                    self._changed.set()
                    return
        finally:
            self._watched_full.discard(sandbox)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._remove(s) for s in self.sandboxes), return_exceptions=True)
        self.sandboxes.clear()


def start_retry_pause(failures: int) -> float:
    """Seconds to wait after the `failures`-th sandbox start in a row failed."""
    return min(START_RETRY_MAX_SECONDS, START_RETRY_SECONDS * 2.0 ** min(failures - 1, 32))


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    # After the command's closing parenthesis come field 3 (state) onwards: field 22 is the 20th.
    return fields[19].decode() if len(fields) > 19 else None


def _host_identity() -> str:
    """This boot and this PID namespace: where a pid and its start time name one process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    except OSError:
        return ""
    return f"{boot_id}/{namespace}"


def owner_token(pid: int | None = None) -> str:
    """The io.sandboxd.owner label of the sandboxes process `pid` (this one by default) starts.

    A pid alone is reused; with its start time, its boot and its PID namespace
    it names one process for good, so a later daemon can tell a dead owner
    from a live one without asking it.
    """
    pid = os.getpid() if pid is None else pid
    return f"{_host_identity()}/{pid}/{_process_start(pid) or ''}"


def owner_is_dead(token: str) -> bool:
    """Whether the process an owner label names is known to be gone.

    Only a process of this boot and this PID namespace can be judged: a
    daemon in another namespace (another container sharing the engine) or on
    another host (a remote engine) may be alive where /proc cannot see it.
    """
    where, _, started = token.rpartition("/")
    host, _, pid = where.rpartition("/")
    identity = _host_identity()
    if not identity or host != identity or not pid.isdigit() or not started:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it runs, as a user this one may not signal
    except OverflowError:
        return False
    # A process whose stat this one cannot read (/proc mounted hidepid, systemd's ProtectProc) is taken
    # for alive: only a start time read and found different says its pid went to another process.
    now = _process_start(int(pid))
    return now is not None and now != started


def reap_orphans(backend: DockerBackend, node: str, instance: str, *, by_node: bool = True) -> int:
    """Remove sandboxes left behind by a daemon that is gone; returns how many.

    Two marks make a container an orphan: the node label of this daemon's
    addresses (a daemon restarted on the same socket, whether the old one
    died or not; only with `by_node`, at start-up), or an owner label naming
    a process of this host that has died. The node label alone misses a
    daemon killed and restarted on another socket or TCP address: its
    sandboxes would run until someone removed them by hand.
    """
    removed = 0
    for container in backend.list_ours():
        labels = container.get("Labels") or {}
        if labels.get(LABEL_INSTANCE) == instance:
            continue
        if (by_node and labels.get(LABEL_NODE) == node) or owner_is_dead(labels.get(LABEL_OWNER, "")):
            # One that will not go (an engine so busy that the removal outlasts its 60 s read timeout) is
            # left to the periodic sweep: raised here, it would stop the daemon's start.
            try:
                backend.remove(container["Id"])
            except Exception as exc:
                log.warning("could not remove sandbox %s of a daemon that is gone (tried again later): %s",
                            container["Id"][:12], exc)
                continue
            removed += 1
    return removed
