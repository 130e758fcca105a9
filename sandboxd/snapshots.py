"""Memory snapshots: a warmed template checkpointed once, restored as clones.

A template sandbox is started cold, its agent imports and warms the
verifier libraries, and `docker checkpoint create` (CRIU) writes its memory
to a folder keyed by everything that shapes it: the image, the agent code
and the sandbox profile. A checkpoint on disk survives daemon restarts;
changing any input changes the key and builds a new one.

Why it pays (measured here, see README): Docker's own round trip is most of
a restore, so restores run in the pool's background refill, never on a
job's path. Restore failures fall back to cold starts, and `state` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from sandboxd.backend import DockerBackend

CHECKPOINT_NAME = "warm"
COMPLETE_MARKER = "complete"
# Node-wide, not per state dir: every daemon on the node restores through one engine.
RESTORE_LOCK = Path("/run/sandboxd/restore.lock")


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
    """Per-pool snapshot state: disabled, building, ready or failed."""

    def __init__(self, backend: DockerBackend, state_dir: str, enabled: bool, engine_temp_dir: str) -> None:
        self._backend = backend
        self._engine_temp_dir = engine_temp_dir
        self._root = Path(state_dir) / "snapshots"
        self.state = "building"
        self.problem = ""
        if not enabled:
            self.disable("disabled in configuration")
        elif not backend.experimental:
            self.disable("the Docker engine runs without experimental features (needed for checkpoints)")
        else:
            problem = criu_problem()
            if problem:
                self.disable(problem)
        self._lock = asyncio.Lock()
        self._restore_lock = asyncio.Lock()
        self.path: Path | None = None

    def disable(self, why: str) -> None:
        """Never snapshot this pool: CRIU cannot work here, or its sandboxes hold state CRIU cannot capture."""
        self.state = f"disabled: {why}"
        self.problem = why

    @property
    def disabled(self) -> bool:
        return self.state.startswith("disabled")

    @property
    def usable(self) -> bool:
        return self.state == "ready" and self.path is not None

    @staticmethod
    def key(parts: dict[str, object]) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    async def prepare(self, key: str, make_template: Callable[[], Awaitable[str]]) -> None:
        """Make the checkpoint for `key` exist, building it from a fresh template if needed.

        `make_template` starts a warmed template sandbox and returns its
        container id; the template is checkpointed, then removed.
        """
        if self.problem:
            return
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
            await asyncio.to_thread(self._backend.checkpoint, container_id, CHECKPOINT_NAME, str(folder),
                                    exit_after=True)
        except Exception as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self.fail(f"checkpoint failed: {exc}")
            return
        finally:
            if container_id:
                await asyncio.to_thread(self._backend.remove, container_id)
        # Written last: a dump interrupted half-way is rebuilt, never restored.
        (folder / COMPLETE_MARKER).touch()
        self.path, self.state = folder / CHECKPOINT_NAME, "ready"

    @contextlib.asynccontextmanager
    async def restoring(self) -> AsyncIterator[None]:
        """Held around `docker start --checkpoint`: one restore at a time on the node.

        containerd's client (Docker 20.10 here) copies the whole checkpoint
        into `<engine temp dir>/ctrd-checkpoint*` for each restore and never
        deletes it (67 MB a restore for the python image: 1,323 restores
        filled 68 GB of this machine's disk). Under the lock no restore of
        ours is in flight, so every such copy is a leftover. (Restores of one
        snapshot also raced on containerd's commit by digest, "content
        sha256:... already exists"; each clone's copy now carries a file of
        its own, see DockerBackend.install_checkpoint.)
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
        """A restore or checkpoint failed: fall back to cold starts for good."""
        if self.path is not None:
            shutil.rmtree(self.path.parent, ignore_errors=True)
        self.path = None
        self.state = f"failed: {why}"[:500]
        self.problem = why
