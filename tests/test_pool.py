"""Handing out sandbox slots (pure logic: no engine; starting sandboxes is in integration)."""

from __future__ import annotations

import asyncio
import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest

import sandboxd
from sandboxd import pool as pool_module
from sandboxd.config import Config
from sandboxd.errors import NoSandbox, PoolFailing, SandboxLost
from sandboxd.pool import Pool, stage_agent_code
from sandboxd.sandbox import Sandbox


def one_slot_pool(slots: int = 1) -> tuple[Pool, Sandbox]:
    config = Config()
    config.pool.jobs_per_sandbox = slots
    backend = types.SimpleNamespace(experimental=False)
    pool = Pool("python", "sandboxd/python:test", backend, config, instance="i", node="n",  # type: ignore[arg-type]
                code_dir="/x", code_key="k")
    sandbox = Sandbox(name="s", pool="python", container_id="c", control_dir="/x", started_by="cold")
    pool.sandboxes = [sandbox]
    return pool, sandbox


def test_a_freed_slot_wakes_one_waiter_not_the_whole_batch() -> None:
    async def scenario() -> int:
        pool, sandbox = one_slot_pool()
        held = await pool.acquire()
        waiters = [asyncio.create_task(pool.acquire()) for _ in range(50)]
        await asyncio.sleep(0)
        picks = 0
        pick = pool._pick

        def counting_pick() -> Sandbox | None:
            nonlocal picks
            picks += 1
            return pick()

        pool._pick = counting_pick  # type: ignore[method-assign]
        await pool.release(held)
        done, _pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        assert [task.result() for task in done] == [sandbox]
        for _ in range(5):
            await asyncio.sleep(0)
        assert pool.waiting == 49
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        return picks

    # Waking all 50 had each look for a slot: 50 picks for one freed slot. Now
    # the one woken looks, and looks again for a second free slot to pass on.
    assert asyncio.run(scenario()) == 2


def test_a_waiter_cancelled_after_its_wake_up_passes_it_on() -> None:
    """A client cancels (deadline, disconnect) just as its job was handed the free slot.

    asyncio.Condition drops such a wake-up before Python 3.13 (3.13 passes it
    on itself, so there the test passes either way)."""
    async def scenario() -> None:
        pool, sandbox = one_slot_pool()
        held = await pool.acquire()
        first = asyncio.create_task(pool.acquire())
        second = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        await pool.release(held)  # wakes `first`...
        first.cancel()  # ...which goes before it can take the slot
        # A hang detector, not a timing: the slot is free, `second` must get it.
        assert await asyncio.wait_for(second, timeout=10) is sandbox
        assert first.cancelled()
        assert pool.waiting == 0

    asyncio.run(scenario())


def test_a_newcomer_does_not_overtake_the_waiter_that_was_woken() -> None:
    async def scenario() -> None:
        pool, sandbox = one_slot_pool()
        held = await pool.acquire()
        first = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        newcomer = asyncio.create_task(pool.acquire())  # its first step runs before `first` resumes...
        await pool.release(held)  # ...which this wakes
        assert await asyncio.wait_for(first, timeout=10) is sandbox
        await asyncio.sleep(0)
        assert not newcomer.done()
        await pool.release(sandbox)
        assert await asyncio.wait_for(newcomer, timeout=10) is sandbox

    asyncio.run(scenario())


def test_a_waiter_that_takes_a_slot_wakes_the_next_when_another_is_free() -> None:
    """Two slots appear at once but one wake-up reaches the sleepers: the taker passes the other on."""
    async def scenario() -> None:
        pool, sandbox = one_slot_pool(slots=2)
        pool.sandboxes = []
        first = asyncio.create_task(pool.acquire())
        second = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)  # both asleep: no sandbox yet
        pool.sandboxes = [sandbox]
        async with pool._available:
            pool._available.notify(1)
        # Hang detectors, not timings: both slots are free.
        assert await asyncio.wait_for(first, timeout=10) is sandbox
        assert await asyncio.wait_for(second, timeout=10) is sandbox
        assert sandbox.in_flight == 2

    asyncio.run(scenario())


def test_staged_agent_code_is_byte_compiled(tmp_path: Path) -> None:
    """Sandboxes mount the agent code read-only and cannot write __pycache__: it comes compiled."""
    folder, key = stage_agent_code(str(tmp_path))
    sources = sorted(Path(folder).rglob("*.py"))
    assert sources
    for source in sources:
        compiled = Path(importlib.util.cache_from_source(str(source)))
        assert compiled.is_file(), f"no bytecode for {source}"
        # Valid for the source as staged: the pyc records the source's mtime and size.
        header = compiled.read_bytes()[:16]
        assert int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime)
        assert int.from_bytes(header[12:16], "little") == source.stat().st_size
    # Staged once per code (and interpreter) version.
    assert stage_agent_code(str(tmp_path)) == (folder, key)


def test_staged_agent_code_holds_every_module_of_the_agent_and_the_verifiers(tmp_path: Path) -> None:
    """Subpackages included: a sandbox whose agent cannot import one (host/, forked/, verifiers/math/,
    verifiers/code/, verifiers/python/) never starts."""
    folder, _key = stage_agent_code(str(tmp_path))
    package = Path(sandboxd.__file__).parent
    wanted = {path.relative_to(package.parent) for folder_name in ("agent", "verifiers")
              for path in (package / folder_name).rglob("*.py")}
    staged = {path.relative_to(folder) for path in Path(folder).rglob("*.py")}
    assert {Path("sandboxd/agent/forked/zygote.py"), Path("sandboxd/agent/host/controller.py"),
            Path("sandboxd/verifiers/math/judge.py"), Path("sandboxd/verifiers/python/harness.py"),
            Path("sandboxd/verifiers/code/assembly.py"), Path("sandboxd/verifiers/code/checkers.py")} <= wanted
    assert wanted <= staged, sorted(wanted - staged)


def test_daemons_staging_the_agent_code_at_once_each_get_it_whole(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Daemons sharing a state dir (several on one node, the fleet test's three) start together: another one
    staging the same code meanwhile removed this one's staging folder, or the folder this one had just staged,
    and the start failed."""
    compile_dir = pool_module.compileall.compile_dir
    others: list[tuple[str, str]] = []
    calls = []

    def another_daemon_stages_meanwhile(folder: str, **options: Any) -> bool:
        calls.append(folder)
        if len(calls) == 1:
            others.append(stage_agent_code(str(tmp_path)))  # runs to its end while this one is half-way
        return bool(compile_dir(folder, **options))

    monkeypatch.setattr(pool_module.compileall, "compile_dir", another_daemon_stages_meanwhile)
    folder, key = stage_agent_code(str(tmp_path))
    assert others == [(folder, key)]
    assert (Path(folder) / "sandboxd" / "agent" / "__main__.py").is_file()
    assert sorted(path.name for path in (tmp_path / "agent-code").iterdir()) == [key]  # no staging left


def pool_with_stand_in_starts(sandboxes: list[Sandbox], **settings: int) -> tuple[Pool, list[int]]:
    """A pool holding `sandboxes` whose starts only count themselves (in the list returned)."""
    pool, _ = one_slot_pool(slots=2)
    for name, value in settings.items():
        setattr(pool.config.pool, name, value)
    pool.sandboxes = sandboxes
    started: list[int] = []

    async def add_one() -> None:
        started.append(1)
        pool.starting -= 1

    pool._add_one = add_one  # type: ignore[method-assign]
    return pool, started


def full_sandbox(name: str, in_flight: int = 0) -> Sandbox:
    sandbox = Sandbox(name=name, pool="python", container_id=name, control_dir="/x", started_by="cold")
    sandbox.full, sandbox.in_flight = True, in_flight
    return sandbox


@pytest.mark.parametrize(("max_size", "starts"), [(0, 1), (1, 0)], ids=["below-the-ceiling", "at-the-ceiling"])
def test_a_waiting_job_gets_a_start_when_the_only_sandbox_is_full(max_size: int, starts: int) -> None:
    """A full sandbox takes no job: counted as live, it left a waiting job without a sandbox for up to 10 s. It still
    counts towards the pool's ceiling (max_size; 0 = twice the host's CPUs)."""

    async def scenario() -> int:
        pool, started = pool_with_stand_in_starts([full_sandbox("a", in_flight=1)], min_size=1, max_size=max_size)
        waiter = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        await pool._reconcile()
        await asyncio.sleep(0)
        waiter.cancel()
        return len(started)

    assert asyncio.run(scenario()) == starts


def test_the_shrink_retires_an_idle_full_sandbox_before_a_healthy_one() -> None:
    async def scenario() -> tuple[bool, bool]:
        full = full_sandbox("f")  # the older one: newest first alone would keep it
        healthy = Sandbox(name="h", pool="python", container_id="h", control_dir="/x", started_by="cold")
        pool, _ = pool_with_stand_in_starts([full, healthy], min_size=1)
        await pool._reconcile()
        return full.retiring, healthy.retiring

    assert asyncio.run(scenario()) == (True, False)


def test_a_room_answer_given_while_another_job_found_it_full_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch asked `room`; meanwhile a job came back "full". The room answer must not put the sandbox back."""
    monkeypatch.setattr(pool_module, "ROOM_POLL_SECONDS", 0.001)

    class Flapping(Sandbox):
        asks = 0

        async def has_room(self) -> bool:
            self.asks += 1
            if self.asks == 1:
                self.full_reports += 1  # a job's "full" reply arrived while this request was out
            return True

    async def scenario() -> tuple[bool, int]:
        pool, _ = one_slot_pool(slots=2)
        sandbox = Flapping(name="s", pool="python", container_id="c", control_dir="/x", started_by="cold")
        pool.sandboxes = [sandbox]
        pool.mark_full(sandbox)
        async with asyncio.timeout(5):
            while sandbox.full:
                await asyncio.sleep(0.001)
        await pool.close()
        return sandbox.full, sandbox.asks

    assert asyncio.run(scenario()) == (False, 2)


def test_sandboxes_the_engine_no_longer_runs_are_lost_at_once() -> None:
    """Dead idle sandboxes counted as ready until a job hit them (chaos pass). One started after the engine
    was asked (not in `watched`) is left alone: it was not in the list because it did not exist yet."""
    pool, sandbox = one_slot_pool()
    paused = Sandbox(name="p", pool="python", container_id="p", control_dir="/x", started_by="cold")
    newer = Sandbox(name="n", pool="python", container_id="n", control_dir="/x", started_by="cold")
    pool.sandboxes = [sandbox, paused]
    watched = list(pool.sandboxes)
    pool.sandboxes.append(newer)
    pool.check_alive({"c"}, watched)  # "p" is paused or gone: not among the running containers
    assert not sandbox.damaged and paused.damaged and not newer.damaged
    assert pool.ready == [sandbox, newer]


def test_fail_waiters_answers_the_jobs_waiting_then_and_no_later_ones() -> None:
    """An engine outage: no sandbox can start, so the jobs waiting are answered instead of waiting for ever."""
    async def scenario() -> None:
        pool, sandbox = one_slot_pool()
        held = await pool.acquire()
        waiting = [asyncio.create_task(pool.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        assert await pool.fail_waiters("engine gone") == 3
        for task in waiting:
            with pytest.raises(NoSandbox, match="engine gone") as raised:
                await asyncio.wait_for(task, timeout=10)
            assert raised.type is NoSandbox  # not PoolFailing: the client retries an outage's jobs
        assert await pool.fail_waiters("engine gone") == 0  # nobody waits: nothing to answer
        later = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        await pool.release(held)
        assert await asyncio.wait_for(later, timeout=10) is sandbox
        assert pool.waiting == 0

    asyncio.run(scenario())


class RefusingRemovals:
    """A backend whose engine refuses the first `refusals` removals (a hiccup), then removes."""

    experimental = False

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.tries: list[str] = []

    def remove(self, container_id: str) -> None:
        self.tries.append(container_id)
        if len(self.tries) <= self.refusals:
            raise RuntimeError("500 Server Error: containerd is busy")


@pytest.mark.parametrize(("refusals", "tries"), [(0, 1), (2, 3), (10, 5)])
def test_a_refused_removal_is_tried_again_off_the_callers_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture, refusals: int,
                                                                tries: int) -> None:
    """A sandbox the engine would not remove waited for the 5-minute orphan sweep, holding its memory."""
    monkeypatch.setattr(pool_module, "REMOVE_RETRY_SECONDS", (0.0, 0.0, 0.0, 0.0))

    async def scenario() -> list[str]:
        pool, sandbox = one_slot_pool()
        backend = RefusingRemovals(refusals)
        pool.backend = backend  # type: ignore[assignment]
        sandbox.control_dir = str(tmp_path / "control")
        (tmp_path / "control").mkdir()
        await pool._remove(sandbox)
        assert backend.tries == ["c"]  # one try on the caller's path; the rest in the background
        assert not (tmp_path / "control").exists()
        await asyncio.gather(*pool._tasks)
        return backend.tries

    assert asyncio.run(scenario()) == ["c"] * tries
    assert ("gave up removing s" in caplog.text) == (refusals >= tries)


def test_a_closed_pool_does_not_retry_removals(monkeypatch: pytest.MonkeyPatch) -> None:
    """At shutdown a leftover is the next daemon's to reap (reap_orphans), not a task left pending."""
    monkeypatch.setattr(pool_module, "REMOVE_RETRY_SECONDS", (0.0,))

    async def scenario() -> tuple[list[str], int]:
        pool, _sandbox = one_slot_pool()
        backend = RefusingRemovals(10)
        pool.backend = backend  # type: ignore[assignment]
        await pool.close()
        return backend.tries, len(pool._tasks)

    assert asyncio.run(scenario()) == (["c"], 0)


def test_the_pause_after_failed_starts_doubles_up_to_a_minute() -> None:
    assert [pool_module.start_retry_pause(n) for n in (1, 2, 3, 6, 7, 8, 10_000)] == [1, 2, 4, 32, 60, 60, 60]


def test_a_pool_whose_starts_keep_failing_answers_its_jobs_until_one_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A math pool under a 64 MiB sandbox limit never started a sandbox: its jobs waited for ever,
    and the pool tried again every second. After FAILING_AFTER_STARTS failures in a row the jobs
    waiting are answered, new ones at once, until a start succeeds."""
    monkeypatch.setattr(pool_module, "START_RETRY_SECONDS", 0.0)

    async def scenario() -> None:
        pool, sandbox = one_slot_pool()
        pool.backend = types.SimpleNamespace(answers=lambda: True)  # type: ignore[assignment]
        pool.sandboxes = []
        changes: list[bool] = []
        pool._on_change = lambda: changes.append(pool.failing)
        outcome: list[Any] = [RuntimeError("exit status 70, out of memory")]

        async def start_sandbox() -> Sandbox:
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            return outcome[0]

        pool._start_sandbox = start_sandbox  # type: ignore[method-assign]
        waiting = asyncio.create_task(pool.acquire())
        for failures in range(1, pool_module.FAILING_AFTER_STARTS + 1):
            assert not waiting.done()
            pool.starting += 1
            await pool._add_one()
            assert (pool.start_failures, pool.starting) == (failures, 0)
        assert changes == [False] * (pool_module.FAILING_AFTER_STARTS - 1) + [True]
        with pytest.raises(PoolFailing, match=r"pool python cannot start sandboxes \(3 starts failed in a row; "
                                              r"the last: exit status 70, out of memory\)"):
            await asyncio.wait_for(waiting, timeout=10)
        with pytest.raises(PoolFailing, match="cannot start sandboxes"):
            await asyncio.wait_for(pool.acquire(), timeout=10)  # no wait for a sandbox that may never come
        outcome[0] = sandbox
        pool.starting += 1
        await pool._add_one()
        assert (pool.start_failures, pool.start_error, pool.failing) == (0, "", False)
        assert await asyncio.wait_for(pool.acquire(), timeout=10) is sandbox

    asyncio.run(scenario())


class DyingAgentEngine:
    """An engine that counts a container as running until a wait for it: its agent just died at the memory limit."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def create(self, spec: object) -> str:
        return "c"

    def start(self, container_id: str, checkpoint: str = "") -> None:
        pass

    def init_pid(self, container_id: str) -> int:
        return 1

    def exit_report(self, container_id: str, wait_seconds: float = 0.0) -> str:
        self.waits.append(wait_seconds)
        return "exit status 137, out of memory (the sandbox's memory limit)" if wait_seconds > 0 else ""


@pytest.mark.parametrize(("lost", "waited"), [(True, True), (False, False)])
def test_a_start_whose_agent_hung_up_waits_for_its_exit_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lost: bool, waited: bool) -> None:
    """A 64 MiB math sandbox's agent killed at the memory limit as it prepared was reported as a bare
    "EOFError": the engine had not yet seen its container stop. An agent that hung up (SandboxLost) gets a
    few seconds for the report; any other failure (a live agent that refused) none."""
    async def scenario() -> str:
        pool, _ = one_slot_pool()
        engine = DyingAgentEngine()
        pool.backend = engine  # type: ignore[assignment]
        pool.config.sandbox.run_dir = str(tmp_path)

        async def wait_ready(self: Sandbox, *args: object) -> dict[str, Any]:
            raise SandboxLost("sandbox s: EOFError: ") if lost else RuntimeError("sandbox s refused hello: no")

        async def remove(sandbox: Sandbox) -> None:
            pass

        monkeypatch.setattr(Sandbox, "wait_ready", wait_ready)
        monkeypatch.setattr(pool, "_remove", remove)
        with pytest.raises(Exception) as raised:
            await pool._boot("x", restore=False, prepare=False)
        assert (engine.waits[-1] == pool_module.EXIT_REPORT_WAIT_SECONDS) is waited
        return str(raised.value)

    message = asyncio.run(scenario())
    assert ("stopped before its agent answered: exit status 137, out of memory" in message) is waited, message


def test_a_pool_with_a_ready_sandbox_is_not_failing() -> None:
    """Starts that fail while sandboxes serve (a busy engine) leave its jobs waiting for those."""
    pool, _sandbox = one_slot_pool()
    pool.start_failures = pool_module.FAILING_AFTER_STARTS + 5
    assert not pool.failing
    pool.sandboxes = []
    assert pool.failing


def test_starts_that_fail_while_the_engine_does_not_answer_are_the_outages_not_the_pools(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs waiting through an engine restart wait scheduler.engine_outage_seconds (the daemon's watch);
    counting those failures would have answered them after three quick failed starts."""
    monkeypatch.setattr(pool_module, "START_RETRY_SECONDS", 0.0)

    async def scenario() -> tuple[int, bool, bool]:
        pool, _sandbox = one_slot_pool()
        pool.backend = types.SimpleNamespace(answers=lambda: False)  # type: ignore[assignment]
        pool.sandboxes = []

        async def start_sandbox() -> Sandbox:
            raise ConnectionError("engine gone")

        pool._start_sandbox = start_sandbox  # type: ignore[method-assign]
        waiting = asyncio.create_task(pool.acquire())
        for _ in range(pool_module.FAILING_AFTER_STARTS + 2):
            pool.starting += 1
            await pool._add_one()
        done = waiting.done()
        waiting.cancel()
        return pool.start_failures, pool.failing, done

    assert asyncio.run(scenario()) == (0, False, False)


def test_an_owner_token_names_a_live_process_until_it_exits() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        token = pool_module.owner_token(child.pid)
        assert not pool_module.owner_is_dead(token)
        assert not pool_module.owner_is_dead(pool_module.owner_token())
    finally:
        child.kill()
        child.wait()
    assert pool_module.owner_is_dead(token)


def test_a_reused_pid_is_not_its_former_owner() -> None:
    # Same boot, same namespace, same pid, another start time: the owner died and its pid went to another process.
    identity, pid, started = pool_module.owner_token().rsplit("/", 2)
    assert pool_module.owner_is_dead(f"{identity}/{pid}/{int(started) - 1}")


@pytest.mark.parametrize("token", [
    "",  # a sandbox of a daemon from before owner labels
    "not-a-token",
    "other-boot/4026531836/1/1",  # another boot or host: cannot be judged from here
])
def test_an_owner_that_cannot_be_judged_is_not_dead(token: str) -> None:
    assert not pool_module.owner_is_dead(token)


def test_an_owner_in_another_pid_namespace_is_not_judged() -> None:
    boot_namespace, pid, started = pool_module.owner_token().rsplit("/", 2)
    boot = boot_namespace.rsplit("/", 1)[0]
    # pid 1 of another namespace (a daemon in a container) is not our pid 1, alive or not.
    assert not pool_module.owner_is_dead(f"{boot}/4026599999/{pid}/{int(started) + 1}")


def test_reap_orphans_removes_a_dead_owners_sandboxes_whatever_its_node() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead, alive = pool_module.owner_token(child.pid), pool_module.owner_token()
    child.kill()
    child.wait()
    containers = [
        {"Id": "same-node", "Labels": {"io.sandboxd.node": "n", "io.sandboxd.instance": "old"}},
        {"Id": "dead-owner", "Labels": {"io.sandboxd.node": "other", "io.sandboxd.instance": "x",
                                        "io.sandboxd.owner": dead}},
        {"Id": "live-owner", "Labels": {"io.sandboxd.node": "other", "io.sandboxd.instance": "y",
                                        "io.sandboxd.owner": alive}},
        {"Id": "no-owner", "Labels": {"io.sandboxd.node": "other", "io.sandboxd.instance": "z"}},
        {"Id": "mine", "Labels": {"io.sandboxd.node": "n", "io.sandboxd.instance": "i",
                                  "io.sandboxd.owner": dead}},
    ]
    removed: list[str] = []
    backend = types.SimpleNamespace(list_ours=lambda: containers, remove=removed.append)
    assert pool_module.reap_orphans(backend, "n", "i") == 2  # type: ignore[arg-type]
    assert removed == ["same-node", "dead-owner"]


def test_an_orphan_that_will_not_go_is_left_for_later_and_the_others_are_removed() -> None:
    """A removal that timed out on a busy engine (requests' ReadTimeout after 60 s) was raised out of the start-up
    reap and the daemon exited 1 (a loaded test run)."""
    import requests

    containers = [{"Id": f"old-{i}", "Labels": {"io.sandboxd.node": "n", "io.sandboxd.instance": "old"}}
                  for i in range(3)]
    removed: list[str] = []

    def remove(container_id: str) -> None:
        if container_id == "old-1":
            raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=60)")
        removed.append(container_id)

    backend = types.SimpleNamespace(list_ours=lambda: containers, remove=remove)
    assert pool_module.reap_orphans(backend, "n", "i") == 2  # type: ignore[arg-type]
    assert removed == ["old-0", "old-2"]


def test_every_sandbox_is_labelled_with_its_owner() -> None:
    pool, _sandbox = one_slot_pool()
    labels = pool._spec("s", "/x").labels
    assert labels["io.sandboxd.owner"] == pool_module.owner_token()


def test_an_owner_whose_stat_cannot_be_read_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under hidepid (or systemd's ProtectProc) another user's /proc/PID/stat cannot be read: a live daemon was
    judged dead, and its sandboxes were removed under its jobs (review)."""
    token = pool_module.owner_token()
    monkeypatch.setattr(pool_module, "_process_start", lambda pid: None)
    assert not pool_module.owner_is_dead(token)


def test_an_owner_label_without_a_start_time_is_never_judged() -> None:
    identity, pid, _started = pool_module.owner_token().rsplit("/", 2)
    assert not pool_module.owner_is_dead(f"{identity}/{pid}/")
    assert not pool_module.owner_is_dead(f"{identity}/{10**30}/5")


class SnapshottingEngine:
    """An engine with checkpoints whose containers' memory reads `memory` (bytes held, limit, a peak)."""

    experimental = True

    def __init__(self, memory: tuple[int, int, bool]) -> None:
        self.memory = memory
        self.created = 0
        self.starts: list[tuple[str, str]] = []
        self.checkpoints: list[str] = []
        self.removed: list[str] = []

    def create(self, spec: object) -> str:
        self.created += 1
        return f"c{self.created}"

    def start(self, container_id: str, checkpoint: str = "") -> None:
        self.starts.append((container_id, checkpoint))

    def init_pid(self, container_id: str) -> int:
        return 1

    def memory_peak(self, container_id: str) -> tuple[int, int, bool]:
        return self.memory

    def checkpoint(self, container_id: str, name: str, folder: str, *, exit_after: bool) -> None:
        self.checkpoints.append(container_id)
        (Path(folder) / name).mkdir()

    def remove(self, container_id: str) -> None:
        self.removed.append(container_id)


@pytest.mark.parametrize(("peak_mib", "snapshotted"), [(64, False), (40, True)], ids=["at-the-limit", "roomy"])
def test_a_pool_whose_template_nears_its_memory_limit_starts_cold(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, peak_mib: int, snapshotted: bool) -> None:
    """A 64 MiB math pool's template peaked at its limit and was snapshotted; its restores were OOM-killed inside
    CRIU or hung `criu restore` and the engine. No snapshot is taken of it now, and its sandboxes start cold."""
    async def scenario() -> tuple[Pool, SnapshottingEngine, Sandbox]:
        config = Config()
        config.sandbox.memory_bytes = 64 << 20
        config.sandbox.run_dir, config.sandbox.state_dir = str(tmp_path / "run"), str(tmp_path / "state")
        config.pool.criu_check = False
        engine = SnapshottingEngine((peak_mib << 20, 64 << 20, True))
        pool = Pool("math", "sandboxd/math:test", engine, config, instance="i", node="n",  # type: ignore[arg-type]
                    code_dir="/x", code_key="k")

        async def wait_ready(self: Sandbox, *args: object) -> dict[str, Any]:
            return {}

        async def request(self: Sandbox, message: dict[str, Any], timeout: float) -> dict[str, Any]:
            assert message == {"op": "prepare"}
            return {}

        monkeypatch.setattr(Sandbox, "wait_ready", wait_ready)
        monkeypatch.setattr(Sandbox, "request", request)
        await pool._prepare_snapshot()
        if snapshotted:
            return pool, engine, Sandbox(name="-", pool="math", container_id="-", control_dir="/x", started_by="-")
        sandbox = await pool._start_sandbox()
        return pool, engine, sandbox

    pool, engine, sandbox = asyncio.run(scenario())
    assert engine.removed[0] == "c1"  # the template
    if snapshotted:
        assert pool.snapshots.usable and engine.checkpoints == ["c1"]
        return
    assert pool.snapshots.disabled and "the template peaked at 64.0 MiB" in pool.snapshots.state
    assert engine.checkpoints == [] and pool.start_method == "cold"
    assert sandbox.started_by == "cold" and engine.starts[-1] == (sandbox.container_id, "")
