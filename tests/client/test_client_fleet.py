"""Node-local first, the fleet second: a client with a local daemon and a fleet, against FakeSandboxd.

Every behaviour is checked on both twins (``twin``). The real daemons' version
of this is tests/integration/test_fleet.py.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from conftest import FAST, StartFake, Twin
from fake_daemon import Abort
from sandboxd_client import RetryPolicy, SandboxClient, Status, Unavailable, math_job
from sandboxd_client._core import (
    LOCAL_SKIP_MAX_SECONDS,
    LOCAL_SKIP_SECONDS,
    ChunkState,
    LocalFirst,
    Route,
    resolve_fleet,
)
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client.errors import InvalidRequest, Overloaded

FULL = Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "12 jobs are queued (limit 12)", retry_after=0.5)


def refusing(fake: Any, job: pb.Job, attempt: int) -> Abort:
    return FULL


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the router and the chunk state (no I/O) --------------------------------


def test_the_local_daemon_is_skipped_for_a_while_after_it_refuses() -> None:
    clock = Clock()
    router = LocalFirst(clock)
    assert router.pick() is Route.LOCAL
    router.refused()
    assert router.pick() is Route.FLEET
    clock.now += LOCAL_SKIP_SECONDS
    assert router.pick() is Route.LOCAL
    router.refused(retry_after=3.0)  # the daemon's hint, when longer
    clock.now += 2.9
    assert router.pick() is Route.FLEET
    clock.now += 0.1
    assert router.pick() is Route.LOCAL
    router.refused(retry_after=3600.0)  # capped: the local daemon is the cheaper door
    clock.now += LOCAL_SKIP_MAX_SECONDS
    assert router.pick() is Route.LOCAL


def test_a_refused_chunk_goes_to_the_fleet_at_once_without_spending_a_retry() -> None:
    jobs = {i: math_job("1", "1") for i in range(3)}
    state = ChunkState(jobs, RetryPolicy(max_retries=0), LocalFirst())
    state.request()
    assert state.route is Route.LOCAL
    assert state.on_end(Overloaded("full", retry_after=0.5)) == []
    assert state.pending == [0, 1, 2] and state.next_delay() == 0.0
    state.request()
    assert state.route is Route.FLEET
    finals = [state.on_message(pb.JobResult(index=i, status=pb.STATUS_OK, reward=1.0, node="f")) for i in range(3)]
    assert [(r.client_attempts, r.node) for r in finals if r is not None] == [(2, "f")] * 3
    assert state.on_end(None) == [] and state.pending == []


def test_a_spilled_chunk_goes_to_the_fleet_even_when_the_skip_is_over() -> None:
    """A wait for a batch slot may outlast the skip: the refused jobs still go to the fleet, not back."""
    clock = Clock()
    state = ChunkState({0: math_job("1", "1")}, RetryPolicy(max_retries=0), LocalFirst(clock))
    state.request()
    state.on_end(Unavailable("gone"))
    clock.now += 60
    state.request()
    assert state.route is Route.FLEET


def test_the_fleet_refusing_is_retried_as_any_daemon_is() -> None:
    state = ChunkState({0: math_job("1", "1")}, RetryPolicy(max_retries=1, initial_backoff=0.2), LocalFirst())
    state.request()
    state.on_end(Unavailable("local gone"))
    state.request()
    assert state.route is Route.FLEET
    assert state.on_end(Unavailable("fleet gone")) == [] and state.next_delay() > 0
    state.request()
    (final,) = state.on_end(Unavailable("fleet gone"))
    assert final.status is Status.UNAVAILABLE and final.client_attempts == 3


def test_without_a_fleet_every_attempt_is_local() -> None:
    state = ChunkState({0: math_job("1", "1")}, RetryPolicy(max_retries=1, initial_backoff=0.01))
    state.request()
    state.on_end(Overloaded("full"))
    assert state.next_delay() > 0
    state.request()
    assert state.route is Route.LOCAL


def test_the_fleet_comes_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOXD_FLEET", "10.0.0.1:50051,10.0.0.2:50051")
    fleet = resolve_fleet(None)
    assert fleet is not None and fleet.addresses == ("ipv4:10.0.0.1:50051", "ipv4:10.0.0.2:50051")
    assert resolve_fleet("") is None and resolve_fleet([]) is None  # none, whatever the environment says
    dns = resolve_fleet("dns:///sandboxd.fleet.svc:50051")
    assert dns is not None and dns.grpc_target == "dns:///sandboxd.fleet.svc:50051"
    monkeypatch.delenv("SANDBOXD_FLEET")
    assert resolve_fleet(None) is None
    with pytest.raises(InvalidRequest, match="fleet must be"):
        resolve_fleet(5)  # type: ignore[arg-type]


# -- against daemons ------------------------------------------------------


def test_a_healthy_local_daemon_takes_all_the_work(twin: Twin, start_fake: StartFake) -> None:
    local, fleet = start_fake("local"), start_fake("fleet")
    results = twin.call(local.address, "score_batch", [math_job("1", "1") for _ in range(20)],
                        client={"fleet": fleet.address, "batch_size": 2})
    assert all(r.ok and r.node == "local" for r in results)
    assert fleet.fake.jobs_seen == 0


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_work_the_local_daemon_refuses_goes_to_the_fleet(twin: Twin, start_fake: StartFake, method: str) -> None:
    local, fleet = start_fake("local", refusing), start_fake("fleet")
    job = math_job("4", "4")
    answer = twin.call(local.address, method, job if method == "run" else [job],
                       client={"fleet": fleet.address, "retry_policy": RetryPolicy(max_retries=0)})
    result = answer if method == "run" else answer[0]
    assert result.ok and result.node == "fleet" and result.client_attempts == 2
    assert local.fake.attempts[0] == 1 and fleet.fake.attempts[0] == 1


def test_a_full_local_daemon_shares_a_batch_with_the_fleet(twin: Twin, start_fake: StartFake) -> None:
    """The local daemon takes what it can queue and refuses the rest, which the fleet answers; while the local
    one is skipped, chunks go straight to the fleet."""
    local = start_fake("local", lambda fake, job, attempt: FULL if job.index >= 8 else None)
    fleet = start_fake("fleet")
    # One chunk at a time: the first two fit, the third is refused and spills, the others are sent to the fleet.
    results = twin.call(local.address, "score_batch", [math_job("1", "1") for _ in range(40)],
                        client={"fleet": fleet.address, "batch_size": 4, "max_concurrent_batches": 1})
    assert [r.index for r in results] == list(range(40)) and all(r.ok for r in results)
    assert [r.node for r in results] == ["local"] * 8 + ["fleet"] * 32
    assert [r.client_attempts for r in results[:12]] == [1] * 8 + [2] * 4
    assert sorted(local.fake.attempts) == list(range(9))  # the refused chunk's first job, then no more
    assert all(r.client_attempts == 1 for r in results[12:])


def test_a_stopped_local_daemon_leaves_the_work_to_the_fleet(twin: Twin, start_fake: StartFake,
                                                             socket_dir: Any) -> None:
    fleet = start_fake("fleet")
    gone = f"unix://{socket_dir}/stopped.sock"
    results = twin.call(gone, "score_batch", [math_job("1", "1") for _ in range(12)],
                        client={"fleet": fleet.address, "batch_size": 3, "retry_policy": RetryPolicy(max_retries=0)})
    assert all(r.ok and r.node == "fleet" for r in results)


def test_the_local_daemon_takes_work_again_once_it_answers(start_fake: StartFake) -> None:
    refuse = [True]
    local = start_fake("local", lambda fake, job, attempt: FULL if refuse[0] else None)
    fleet = start_fake("fleet")
    clock = Clock()
    with SandboxClient(local.address, fleet=fleet.address, retry_policy=FAST) as client:
        client._router = LocalFirst(clock)
        assert client.run(math_job("1", "1")).node == "fleet"
        assert client.run(math_job("1", "1")).node == "fleet"  # skipped: not asked again at once
        assert local.fake.jobs_seen == 1
        refuse[0] = False
        clock.now += LOCAL_SKIP_SECONDS
        assert client.run(math_job("1", "1")).node == "local"


def test_the_batch_hint_reaches_the_local_daemon_and_the_fleet(twin: Twin, start_fake: StartFake) -> None:
    local, a, b = start_fake("local"), start_fake("a"), start_fake("b")
    merged = twin.call(local.address, "set_batch_hint", 101, 8, client={"fleet": [a.address, b.address]})
    # Each side sizes for all of it: the local daemon while it keeps up, the fleet once it does not.
    assert [(h.batch_size, h.sessions) for h in local.fake.hints] == [(101, 8)]
    assert [(h.batch_size, h.sessions) for h in a.fake.hints + b.fake.hints] == [(51, 4), (51, 4)]
    assert sorted(p.name for p in merged.pools) == ["a", "b", "local"]
    status = twin.call(local.address, "pool_status", client={"fleet": [a.address, b.address]})
    assert sorted(p.name for p in status.pools) == ["a", "b", "local"]


def test_info_asks_the_local_daemon_first(twin: Twin, start_fake: StartFake, socket_dir: Any) -> None:
    local, fleet = start_fake("local"), start_fake("fleet")
    assert twin.call(local.address, "info", client={"fleet": fleet.address}).version == "fake-local"
    gone = f"unix://{socket_dir}/stopped.sock"
    info = twin.call(gone, "info", client={"fleet": fleet.address, "retry_policy": RetryPolicy(max_retries=0)})
    assert info.version == "fake-fleet"


def test_a_session_the_local_daemon_cannot_hold_opens_on_the_fleet(start_fake: StartFake) -> None:
    local, fleet = start_fake("local"), start_fake("fleet")
    local.fake.open_failures.append(FULL)
    with SandboxClient(local.address, fleet=fleet.address, retry_policy=FAST) as client:
        with client.open_session() as session:
            assert session.id.startswith("fleet-")
            session.run("x = 1")
            assert session.run("x").value == "1"
        assert len(local.fake.open_requests) == 1  # asked once, not retried for its whole backoff
        with client.open_session() as session:
            assert session.id.startswith("local-")


async def test_an_async_session_the_local_daemon_cannot_hold_opens_on_the_fleet(start_fake: StartFake,
                                                                                socket_dir: Any) -> None:
    from sandboxd_client import AsyncSandboxClient

    fleet = start_fake("fleet")
    client = AsyncSandboxClient(f"unix://{socket_dir}/stopped.sock", fleet=fleet.address, retry_policy=FAST)
    async with client, await client.open_session() as session:
        assert session.id.startswith("fleet-")


def test_a_session_the_local_daemon_refuses_for_its_request_is_not_sent_to_the_fleet(start_fake: StartFake) -> None:
    local, fleet = start_fake("local"), start_fake("fleet")
    local.fake.open_failures.append(Abort(grpc.StatusCode.INVALID_ARGUMENT, "no such language"))
    with SandboxClient(local.address, fleet=fleet.address, retry_policy=FAST) as client, \
            pytest.raises(InvalidRequest, match="no such language"):
        client.open_session()
    assert fleet.fake.open_requests == []
