"""Session request validation and the sessions pool's sizing (pure logic; the real thing is in integration)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import types
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client.trl import _died_of_its_program

from sandboxd.config import Config
from sandboxd.errors import (
    InvalidRequest,
    NoSandbox,
    SandboxdError,
    SandboxFull,
    SandboxLost,
    SessionBusy,
    SessionNotFound,
    Unsupported,
)
from sandboxd.pool import Pool
from sandboxd.sandbox import Sandbox
from sandboxd.sessions import SessionManager
from tests.test_daemon import until


def _pool(config: Config, kind: str) -> Pool:
    backend = types.SimpleNamespace(experimental=False)
    return Pool(kind, "sandboxd/python:test", backend, config, instance="i", node="n",  # type: ignore[arg-type]
                code_dir="/x", code_key="k", kind=kind)


def test_sessions_pool_follows_the_session_hint_with_headroom() -> None:
    config = Config()
    config.sessions.per_sandbox, config.sessions.headroom = 64, 0.1
    pool = _pool(config, "sessions")
    assert pool.capacity == 64
    assert pool.target == config.sessions.min_sandboxes
    pool.set_batch_hint(256)
    assert pool.target == 5  # 256 * 1.1 / 64 = 4.4
    pool.set_batch_hint(100_000)
    assert pool.target == config.sessions.max_sandboxes


def test_open_sessions_count_as_demand() -> None:
    config = Config()
    config.sessions.per_sandbox, config.sessions.headroom, config.sessions.min_sandboxes = 4, 0.0, 0
    pool = _pool(config, "sessions")
    sandboxes = [Sandbox(name=f"s{i}", pool="sessions", container_id=str(i), control_dir="/x", started_by="cold")
                 for i in range(3)]
    for sandbox in sandboxes:
        sandbox.in_flight = 4
    pool.sandboxes = sandboxes
    assert pool.target == 3  # 12 sessions held, no hint: keep all three
    pool.waiting = 1
    assert pool.target == 4


def test_jobs_pool_keeps_its_own_sizing() -> None:
    config = Config()
    pool = _pool(config, "jobs")
    assert pool.capacity == config.pool.jobs_per_sandbox
    pool.set_batch_hint(64)
    assert pool.target == min(config.pool.size_limit, math.ceil(64 / config.pool.jobs_per_sandbox))


def test_unknown_pool_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pool kind"):
        _pool(Config(), "gpu")


@pytest.mark.parametrize(("request_fields", "fragment"), [
    ({"language": "ruby"}, "sessions speak python and bash"),
    ({"idle_timeout_seconds": float("nan")}, "idle_timeout_seconds must be positive"),
    ({"idle_timeout_seconds": 7200}, "exceeds the daemon's maximum 3600"),
    ({"files": [pb.File(path="/etc/passwd")]}, "relative path"),
    ({"files": [pb.File(path="a"), pb.File(path="a")]}, "a path appears twice"),
    ({"files": [pb.File(path="big", content=b"x" * (17 << 20))]}, "at most"),
    ({"files": [pb.File(path="big", content=b"x" * (9 << 20))]}, r"share of its sandbox's /tmp is 8388608"),
    ({"files": [pb.File(path=f"d{i}/" + "a/" * 2040 + "f") for i in range(33)]}, "more than the 65536"),
    ({"limits": pb.Limits(memory_bytes=1 << 40)}, "limits.memory_bytes"),
    ({"request_id": "k" * 129}, "request_id has 129 characters; at most 128"),
])
async def test_malformed_open_requests(request_fields: dict, fragment: str) -> None:
    manager = SessionManager(None, Config())
    with pytest.raises(InvalidRequest, match=fragment):
        await manager.open(pb.OpenSessionRequest(**request_fields))


async def test_open_without_a_sessions_pool_is_unsupported() -> None:
    with pytest.raises(Unsupported, match="sessions are disabled"):
        await SessionManager(None, Config()).open(pb.OpenSessionRequest())


async def test_unknown_ids_are_not_found() -> None:
    manager = SessionManager(None, Config())
    with pytest.raises(SessionNotFound, match="no session 'x'"):
        await manager.run_cell(pb.RunCellRequest(session_id="x", code="1"))
    with pytest.raises(SessionNotFound):
        await manager.close("x")
    assert manager.list() == []


class ScriptedSandbox(Sandbox):
    """Answers each request with the next of `replies`; a reply with "full" raises as Sandbox.request does."""

    replies: list[dict]

    async def request(self, message: Any, timeout: float, withdrawal: object = None) -> dict:
        reply = self.replies.pop(0) if message["op"] in ("session_open", "session_cell") else {"room": False}
        if reply.get("full"):
            self.full = True
            raise SandboxFull(f"sandbox {self.name}: {reply['error']}")
        return reply


async def test_an_open_that_finds_tmp_full_goes_to_another_sandbox_and_ends_no_session() -> None:
    """A sandbox whose /tmp its sessions filled is not lost: its sessions live on, and it takes no new one."""
    config = Config()
    pool = _pool(config, "sessions")
    crowded, spare = (ScriptedSandbox(name=f"s{i}", pool="sessions", container_id=str(i), control_dir="/x",
                                      started_by="cold") for i in range(2))
    crowded.replies = [{"error": "/tmp of the sandbox is full (making a work dir)", "full": True}]
    spare.replies = [{"session": 7}]
    pool.sandboxes = [crowded, spare]
    manager = SessionManager(pool, config)
    try:
        session = await manager.open(pb.OpenSessionRequest())
        assert session.sandbox is spare and session.handle == 7
        assert crowded.full and not crowded.damaged and crowded.in_flight == 0
        assert pool._pick() is spare
    finally:
        await pool.close()


class GatedSandbox(Sandbox):
    """Opens sessions 7, 8, 9... once `gate` is set; refuses the opens listed in `refuse` (1 = the first); notes
    the sessions it was asked to close in `closed`."""

    gate: asyncio.Event
    opens: int
    closed: list[int]
    refuse: tuple[int, ...] = ()

    async def request(self, message: Any, timeout: float, withdrawal: object = None) -> dict:
        if message["op"] == "session_close":
            self.closed.append(message["session"])
        if message["op"] != "session_open":
            return {"ok": True}
        self.opens += 1
        number = self.opens
        await self.gate.wait()
        return {"error": "refused"} if number in self.refuse else {"session": 6 + number}


@contextlib.asynccontextmanager
async def gated_manager(refuse: tuple[int, ...] = (), *, opened: bool = True) -> AsyncIterator[tuple[SessionManager,
                                                                                                      GatedSandbox]]:
    """A manager whose one sandbox answers each session_open once its gate is set (set at once if `opened`)."""
    config = Config()
    pool = _pool(config, "sessions")
    sandbox = GatedSandbox(name="s0", pool="sessions", container_id="0", control_dir="/x", started_by="cold")
    sandbox.gate, sandbox.opens, sandbox.closed, sandbox.refuse = asyncio.Event(), 0, [], refuse
    if opened:
        sandbox.gate.set()
    pool.sandboxes = [sandbox]
    manager = SessionManager(pool, config)
    try:
        yield manager, sandbox
    finally:
        await manager.close_all()
        await pool.close()


async def test_an_open_cancelled_mid_way_closes_what_the_agent_opened_and_keeps_the_sandbox() -> None:
    """A cancelled Open (a caller's deadline, a dropped connection) retired its sandbox, which was
    replaced once its other sessions ended: up to sessions.per_sandbox (64) live sessions' sandbox
    per cancel. The agent's open now finishes, and the session nobody will use is closed."""
    async with gated_manager(opened=False) as (manager, sandbox):
        opening = asyncio.create_task(manager.open(pb.OpenSessionRequest()))
        await until(lambda: sandbox.opens == 1)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert sandbox.in_flight == 1 and sandbox.closed == [], "the slot is held while the agent still opens"
        sandbox.gate.set()
        await until(lambda: sandbox.in_flight == 0)
        assert sandbox.closed == [7] and manager.list() == []
        assert not (sandbox.retiring or sandbox.damaged or sandbox.full)
        assert (await manager.open(pb.OpenSessionRequest())).handle == 8, "the sandbox takes the next session"


async def test_a_cancel_that_lands_as_the_open_finishes_is_the_callers_and_costs_no_sandbox() -> None:
    """The agent's reply and the caller's cancel in one step of the loop: the open was taken for the daemon's own
    failure and its sandbox retired (a loaded CI run's race test saw one sandbox replaced), and the session the
    agent had opened was never closed. It is the caller's cancel: the session is closed, the sandbox kept."""
    async with gated_manager(opened=False) as (manager, sandbox):
        opening = asyncio.create_task(manager.open(pb.OpenSessionRequest()))
        await until(lambda: sandbox.opens == 1)
        # No await between: the agent's reply is in when the cancel reaches the open.
        sandbox.gate.set()
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        await until(lambda: sandbox.in_flight == 0)
        assert sandbox.closed == [7] and manager.list() == []
        assert not (sandbox.retiring or sandbox.damaged or sandbox.full)


async def test_a_repeated_request_id_gets_the_session_its_first_open_opened() -> None:
    """A client retries an Open that got UNAVAILABLE after the daemon had opened it: the retry opened a second
    session, which held a slot until its idle timeout and was never closed."""
    async with gated_manager() as (manager, sandbox):
        first = await manager.open(pb.OpenSessionRequest(language="bash", request_id="a" * 32))
        again = await manager.open(pb.OpenSessionRequest(language="bash", request_id="a" * 32))
        assert again is first and sandbox.opens == 1 and sandbox.in_flight == 1
        assert [info.session_id for info in manager.list()] == [first.id]
        other = await manager.open(pb.OpenSessionRequest(language="bash", request_id="b" * 32))
        unkeyed = [await manager.open(pb.OpenSessionRequest(language="bash")) for _ in range(2)]
        assert len({first.id, other.id, *(s.id for s in unkeyed)}) == 4 and sandbox.opens == 4
        # A late repeat gets the session it opened, ended or not: it opens no other.
        await manager.close(first.id)
        late = await manager.open(pb.OpenSessionRequest(language="bash", request_id="a" * 32))
        assert late is first and not first.info(3600).alive and sandbox.opens == 4


async def test_concurrent_opens_with_one_request_id_end_with_one_session() -> None:
    """A retry can reach the daemon while the first attempt is still opening: it waits for that one."""
    async with gated_manager(opened=False) as (manager, sandbox):
        request = pb.OpenSessionRequest(request_id="k" * 32)
        opening = [asyncio.create_task(manager.open(request)) for _ in range(3)]
        await until(lambda: sandbox.opens >= 1)
        await asyncio.sleep(0.05)  # time for the repeats to open sessions of their own, as they did
        sandbox.gate.set()
        first, *repeats = await asyncio.wait_for(asyncio.gather(*opening), timeout=10)
        assert all(session is first for session in repeats)
        assert sandbox.opens == 1 and [info.session_id for info in manager.list()] == [first.id]


async def test_a_repeat_of_a_request_id_whose_open_failed_opens_anew_once() -> None:
    async with gated_manager(refuse=(1,), opened=False) as (manager, sandbox):
        request = pb.OpenSessionRequest(request_id="k" * 32)
        failing, waiting = asyncio.create_task(manager.open(request)), asyncio.create_task(manager.open(request))
        await until(lambda: sandbox.opens >= 1)
        sandbox.gate.set()
        with pytest.raises(SandboxdError, match="refused to open a session"):
            await failing
        session = await asyncio.wait_for(waiting, timeout=10)  # the waiter tried again, and opened
        assert session.handle == 8 and await manager.open(request) is session and sandbox.opens == 2


async def test_a_request_id_sent_with_another_request_is_refused() -> None:
    async with gated_manager() as (manager, sandbox):
        await manager.open(pb.OpenSessionRequest(language="python", request_id="k" * 32))
        with pytest.raises(InvalidRequest, match=r"request_id 'k{32}' was sent before with another request"):
            await manager.open(pb.OpenSessionRequest(language="bash", request_id="k" * 32))
        assert sandbox.opens == 1


async def test_request_ids_are_forgotten_after_their_time_and_beyond_their_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd import sessions as sessions_module

    monkeypatch.setattr(sessions_module, "REMEMBERED_REQUEST_IDS", 2)
    monkeypatch.setattr(sessions_module, "REQUEST_ID_SECONDS", 0.2)
    async with gated_manager() as (manager, sandbox):
        a, _, c = [await manager.open(pb.OpenSessionRequest(request_id=key)) for key in "abc"]
        assert list(manager._keys_opened) == ["b", "c"]
        assert await manager.open(pb.OpenSessionRequest(request_id="c")) is c and sandbox.opens == 3
        assert await manager.open(pb.OpenSessionRequest(request_id="a")) is not a and sandbox.opens == 4
        await asyncio.sleep(0.3)
        assert await manager.open(pb.OpenSessionRequest(request_id="c")) is not c and sandbox.opens == 5
        assert list(manager._keys_opened) == ["c"]


async def test_a_cell_the_agent_refuses_as_busy_is_not_counted_against_max_cells() -> None:
    config = Config()
    config.sessions.max_cells = 1
    pool = _pool(config, "sessions")
    sandbox = ScriptedSandbox(name="s0", pool="sessions", container_id="0", control_dir="/x", started_by="cold")
    sandbox.replies = [{"session": 7},
                       {"result": {"status": "busy", "message": "a cell is already running", "alive": True}},
                       {"result": {"status": "ok", "value": "1", "alive": True}}]
    pool.sandboxes = [sandbox]
    manager = SessionManager(pool, config)
    try:
        session = await manager.open(pb.OpenSessionRequest())
        with pytest.raises(SessionBusy):
            await manager.run_cell(pb.RunCellRequest(session_id=session.id, code="1"))
        assert manager.list()[0].cells_run == 0
        # Its one cell is still its own to run; the session ends with it.
        result = await manager.run_cell(pb.RunCellRequest(session_id=session.id, code="1"))
        assert (result.status, result.value, result.session_alive) == (pb.STATUS_OK, "1", False)
    finally:
        await pool.close()


class RecordingSandbox(ScriptedSandbox):
    """A ScriptedSandbox that keeps the requests it was sent."""

    sent: list[dict]

    async def request(self, message: Any, timeout: float, withdrawal: object = None) -> dict:
        self.sent.append(message)
        return await super().request(message, timeout, withdrawal)


async def test_a_final_cell_is_asked_of_the_agent_said_in_its_result_and_ends_the_session() -> None:
    """RunCellRequest.final reaches the agent (which kills the session's processes and runs the cell in a fresh
    one); the answer says it ran as final, and the session is over whatever the agent said of it."""
    pool = _pool(Config(), "sessions")
    sandbox = RecordingSandbox(name="s0", pool="sessions", container_id="0", control_dir="/x", started_by="cold")
    sandbox.sent = []
    sandbox.replies = [{"session": 7}, {"result": {"status": "ok", "value": "2", "alive": True}},
                       {"result": {"status": "ok", "value": "1", "alive": True}}]
    pool.sandboxes = [sandbox]
    manager = SessionManager(pool, Config())
    try:
        session = await manager.open(pb.OpenSessionRequest())
        plain = await manager.run_cell(pb.RunCellRequest(session_id=session.id, code="1 + 1"))
        assert (plain.value, plain.session_alive, plain.final) == ("2", True, False)
        final = await manager.run_cell(pb.RunCellRequest(session_id=session.id, code="1", final=True))
        assert (final.status, final.value, final.session_alive, final.final) == (pb.STATUS_OK, "1", False, True)
        cells = [message for message in sandbox.sent if message["op"] == "session_cell"]
        assert [message["final"] for message in cells] == [False, True]
        assert manager.list() == []
        with pytest.raises(SessionNotFound, match="closed by its final cell"):
            await manager.run_cell(pb.RunCellRequest(session_id=session.id, code="1"))
    finally:
        await pool.close()


async def test_a_cell_that_finds_the_sandbox_full_ends_its_session_only() -> None:
    config = Config()
    pool = _pool(config, "sessions")
    sandbox = ScriptedSandbox(name="s0", pool="sessions", container_id="0", control_dir="/x", started_by="cold")
    sandbox.replies = [{"session": 7}, {"session": 8}, {"error": "no room for another process", "full": True}]
    pool.sandboxes = [sandbox]
    manager = SessionManager(pool, config)
    try:
        crowded = await manager.open(pb.OpenSessionRequest())
        neighbour = await manager.open(pb.OpenSessionRequest())
        result = await manager.run_cell(pb.RunCellRequest(session_id=crowded.id, code="1"))
        assert (result.status, result.session_alive) == (pb.STATUS_INTERNAL, False)
        assert "no room for another process" in result.message
        assert [info.session_id for info in manager.list()] == [neighbour.id]
        assert sandbox.full and not sandbox.damaged
    finally:
        await pool.close()


async def test_an_open_waiting_out_an_engine_outage_is_answered_unavailable() -> None:
    """The daemon's engine watch fails every pool's waiters after scheduler.engine_outage_seconds, the sessions
    pool's included: an open waiting for a slot that no engine can start gets UNAVAILABLE, not a 30 s wait."""
    config = Config()
    pool = _pool(config, "sessions")
    manager = SessionManager(pool, config)
    try:
        opening = asyncio.create_task(manager.open(pb.OpenSessionRequest()))
        await until(lambda: pool.waiting == 1)
        assert await pool.fail_waiters("the Docker engine has not answered for 30 s") == 1
        with pytest.raises(NoSandbox, match="has not answered") as raised:
            await asyncio.wait_for(opening, timeout=10)
        assert raised.value.code == grpc.StatusCode.UNAVAILABLE
        assert manager._opening == 0 and manager.list() == []
    finally:
        await pool.close()


class DyingSandbox(Sandbox):
    """Opens sessions 7, 8, 9 in turn; says session 7 ended on its own; records what it is asked."""

    asked: list[dict]

    async def request(self, message: Any, timeout: float, withdrawal: object = None) -> dict:
        self.asked.append(message)
        if message["op"] == "session_open":
            return {"session": 7 + sum(m["op"] == "session_open" for m in self.asked) - 1}
        if message["op"] == "sessions_ended":
            return {"ended": {"7": "its interpreter exited with status 3 between cells"}}
        return {"ok": True}


@contextlib.asynccontextmanager
async def checked_for_deaths(monkeypatch: pytest.MonkeyPatch,
                             sandbox: DyingSandbox) -> AsyncIterator[SessionManager]:
    """A manager of `sandbox`'s sessions that asks it which ended every 0.02 s once started."""
    from sandboxd import sessions as sessions_module

    monkeypatch.setattr(sessions_module, "EXPIRY_TICK_SECONDS", 0.01)
    monkeypatch.setattr(sessions_module, "DEATH_CHECK_SECONDS", 0.02)
    config = Config()
    pool = _pool(config, "sessions")
    sandbox.asked = []
    pool.sandboxes = [sandbox]
    manager = SessionManager(pool, config)
    try:
        yield manager
    finally:
        await manager.close_all()
        await pool.close()


async def test_a_session_whose_interpreter_ended_between_cells_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer the session left running ended its interpreter: List showed it alive and it held its slot until
    its next cell or its idle timeout. The agent is asked which idle Python sessions ended; those end now."""
    sandbox = DyingSandbox(name="s0", pool="sessions", container_id="0", control_dir="/x", started_by="cold")
    async with checked_for_deaths(monkeypatch, sandbox) as manager:
        dead = await manager.open(pb.OpenSessionRequest(language="python"))
        alive = await manager.open(pb.OpenSessionRequest(language="python"))
        shell = await manager.open(pb.OpenSessionRequest(language="bash"))
        assert sandbox.in_flight == 3
        manager.start()
        await asyncio.wait_for(until(lambda: len(manager.list()) == 2), timeout=10)
        assert {info.session_id for info in manager.list()} == {alive.id, shell.id}
        with pytest.raises(SessionNotFound, match="the session died: its interpreter exited with status 3 between"
                           ) as ended:
            await manager.run_cell(pb.RunCellRequest(session_id=dead.id, code="1"))
        # The TRL check environment reads this ending as the program's own doing (a failing reward, not None).
        assert _died_of_its_program(str(ended.value))
        questions = [m for m in sandbox.asked if m["op"] == "sessions_ended"]
        assert questions[0]["sessions"] == [7, 8]  # a bash session keeps no process between cells
        assert {"op": "session_close", "session": 7} in sandbox.asked and sandbox.in_flight == 2


class UnansweringSandbox(DyingSandbox):
    async def request(self, message: Any, timeout: float, withdrawal: object = None) -> dict:
        if message["op"] == "sessions_ended":
            self.damaged = True
            raise SandboxLost(f"sandbox {self.name}: TimeoutError: ")
        return await super().request(message, timeout, withdrawal)


async def test_a_sandbox_that_does_not_answer_which_sessions_ended_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = UnansweringSandbox(name="s0", pool="sessions", container_id="0", control_dir="/x", started_by="cold")
    async with checked_for_deaths(monkeypatch, sandbox) as manager:
        session = await manager.open(pb.OpenSessionRequest(language="python"))
        manager.start()
        await asyncio.wait_for(until(lambda: manager.list() == []), timeout=10)
        with pytest.raises(SessionNotFound, match="its sandbox was lost"):
            await manager.run_cell(pb.RunCellRequest(session_id=session.id, code="1"))
