"""The real daemon over its real Unix socket: health, reflection, info, errors."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.integration import helpers

pytestmark = pytest.mark.docker


def test_health_serving(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "sandboxd.v1.Jobs"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_services(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                        timeout=5)
    names = {service.name for reply in replies for service in reply.list_services_response.service}
    assert {"sandboxd.v1.Jobs", "sandboxd.v1.Sessions", "sandboxd.v1.Pool", "sandboxd.v1.Daemon",
            "grpc.health.v1.Health"} <= names


def test_info(channel: grpc.Channel) -> None:
    info = pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5)
    assert info.version
    assert "python" in info.languages
    assert {"execute", "code", "math"} <= set(info.job_kinds)
    assert info.snapshot_state
    assert info.max_timeout_seconds > 0


def test_pool_status_and_batch_hint(channel: grpc.Channel) -> None:
    stub = pb_grpc.PoolStub(channel)
    status = stub.GetStatus(pb.GetPoolStatusRequest(), timeout=5)
    python = next(p for p in status.pools if p.name == "python")
    assert python.ready >= 1
    hinted = stub.SetBatchHint(pb.BatchHint(batch_size=6), timeout=5)
    assert next(p for p in hinted.pools if p.name == "python").target >= 3
    stub.SetBatchHint(pb.BatchHint(batch_size=0), timeout=5)


def test_batch_hint_sizes_only_the_named_pools(channel: grpc.Channel) -> None:
    stub = pb_grpc.PoolStub(channel)
    before = {p.name: p.target for p in stub.SetBatchHint(pb.BatchHint(batch_size=0), timeout=5).pools}
    try:
        hinted = {p.name: p.target for p in stub.SetBatchHint(pb.BatchHint(batch_size=6, pools=["math"]),
                                                               timeout=5).pools}
        assert hinted["math"] >= 3 > before["math"]
        assert hinted["python"] == before["python"]
    finally:
        stub.SetBatchHint(pb.BatchHint(batch_size=0), timeout=5)
    with pytest.raises(grpc.RpcError) as caught:
        stub.SetBatchHint(pb.BatchHint(batch_size=6, pools=["math", "cobol"]), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'cobol'" in caught.value.details() and "python" in caught.value.details()
    assert next(p for p in stub.GetStatus(pb.GetPoolStatusRequest(), timeout=5).pools if p.name == "math").target < 3


@pytest.mark.parametrize(
    ("job", "fragment"),
    [
        (pb.Job(), "set one of"),
        (helpers.execute("print(1)", timeout=10_000), "exceeds the daemon's maximum"),
        (helpers.execute("print(1)", language="cobol"), "language"),
        (pb.Job(failure_value=float("nan"), execute=pb.ExecuteJob(code="1")), "finite"),
        (pb.Job(failure_value=2.0, math=pb.MathJob(completion="4", ground_truth="4")), "below 1.0"),
        (pb.Job(execute=pb.ExecuteJob(code="1", files=[pb.File(path="a/" * 2047 + "bc", content=b"x")])),
         "longer than 4095 bytes"),
        (pb.Job(execute=pb.ExecuteJob(code="1", files=[pb.File(path="../escape", content=b"x")])), "relative"),
        (helpers.math("x", ""), "ground_truth is empty"),
        (pb.Job(code=pb.CodeJob(completion="x", tests=pb.CodeTests(dataset_json="{not json"))), "tests"),
    ],
)
def test_invalid_argument(channel: grpc.Channel, job: pb.Job, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        helpers.run(channel, job, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.details()


def test_empty_batch_is_invalid(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(pb_grpc.JobsStub(channel).RunBatch(pb.RunBatchRequest(), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("request_fields", "code", "fragment"), [
    ({"language": "cobol"}, grpc.StatusCode.INVALID_ARGUMENT, "sessions speak python and bash"),
    ({"files": [pb.File(path="../x", content=b"")]}, grpc.StatusCode.INVALID_ARGUMENT, "relative path"),
    ({"idle_timeout_seconds": -1}, grpc.StatusCode.INVALID_ARGUMENT, "idle_timeout_seconds"),
    ({"idle_timeout_seconds": 1e9}, grpc.StatusCode.INVALID_ARGUMENT, "exceeds"),
    ({"limits": pb.Limits(timeout_seconds=1e6)}, grpc.StatusCode.INVALID_ARGUMENT, "limits.timeout_seconds"),
])
def test_malformed_session_open_is_refused(channel: grpc.Channel, request_fields: dict, code: grpc.StatusCode,
                                           fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.SessionsStub(channel).Open(pb.OpenSessionRequest(**request_fields), timeout=10)
    assert caught.value.code() == code
    assert fragment in caught.value.details()


def test_unknown_session_is_not_found(channel: grpc.Channel) -> None:
    stub = pb_grpc.SessionsStub(channel)
    for call, request in ((stub.RunCell, pb.RunCellRequest(session_id="nope", code="1")),
                          (stub.Close, pb.CloseSessionRequest(session_id="nope"))):
        with pytest.raises(grpc.RpcError) as caught:
            call(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_batch_streams_every_index_once(channel: grpc.Channel) -> None:
    jobs = [helpers.execute(f"import time; time.sleep({(7 - i) * 0.02}); print({i})") for i in range(8)]
    for index, job in enumerate(jobs):
        job.index = 100 + index
    results = list(pb_grpc.JobsStub(channel).RunBatch(pb.RunBatchRequest(jobs=jobs), timeout=120))
    assert sorted(r.index for r in results) == [100 + i for i in range(8)]
    for result in results:
        assert result.status == pb.STATUS_OK
        assert result.execute.stdout.decode().strip() == str(result.index - 100)
        assert result.reward == 1.0


def _in_flight(pool: pb_grpc.PoolStub) -> tuple[int, int]:
    status = pool.GetStatus(pb.GetPoolStatusRequest(), timeout=5)
    return status.in_flight, next(p.busy for p in status.pools if p.name == "python")


# Forks children of its own too, which the kill of the job's uid takes with it.
SPIN = "import os\nfor _ in range(3):\n    if os.fork() == 0: break\nwhile True: pass"


@pytest.mark.parametrize(("batch", "job"), [
    (False, helpers.execute(SPIN, timeout=60.0)),
    (True, helpers.execute(SPIN, timeout=60.0)),
    # The candidate beside a resident judge, which must let go of it.
    (False, helpers.code(f"```python\ndef f(x):\n    {SPIN.replace(chr(10), chr(10) + '    ')}\n```",
                         {"fn_name": "f", "inputs": [[1]], "outputs": [1]}, timeout=60.0)),
], ids=["run", "batch", "code"])
def test_a_job_abandoned_by_its_caller_is_withdrawn_from_its_sandbox(channel: grpc.Channel, batch: bool,
                                                                    job: pb.Job) -> None:
    """A client deadline cancelled the RPC, not the job: its slot came back at once while the agent ran it on to
    its own deadline, so a trainer with short deadlines piled endless loops into sandboxes counted as idle. The
    daemon now withdraws the job (the agent kills it) and frees the slot when the agent answers."""
    pool = pb_grpc.PoolStub(channel)
    helpers.pool_settled(pool, "python", 1)
    assert _in_flight(pool) == (0, 0)
    stub = pb_grpc.JobsStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        if batch:
            list(stub.RunBatch(pb.RunBatchRequest(jobs=[job]), timeout=1.0))
        else:
            stub.Run(job, timeout=1.0)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    gave_up = time.monotonic()
    while _in_flight(pool) != (0, 0) and time.monotonic() < gave_up + 30:
        time.sleep(0.05)
    # The job's own deadline is 60 s: a slot back within 30 s was freed by the withdrawal.
    assert _in_flight(pool) == (0, 0), "the withdrawn job still holds its slot"
    assert helpers.run(channel, helpers.execute("print(1)")).execute.stdout == b"1\n"
