"""Chaos against a real daemon and engine: sandboxes removed or frozen, the snapshot store broken, the engine
restarted, the daemon stopped in the middle of its work. Each test restores what it breaks."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess, docker_available
from tests.integration import helpers
from tests.integration.test_runtime import containers, instance_of

pytestmark = [pytest.mark.docker, pytest.mark.skipif(not docker_available(), reason="no Docker engine")]

REPO = Path(__file__).resolve().parents[2]
# One python pool, nothing else: every container of the daemon is a job sandbox.
PYTHON_ONLY = {"SANDBOXD_POOL_MATH": "false", "SANDBOXD_POOL_IMAGES": "python", "SANDBOXD_SESSIONS_ENABLED": "false"}


def health(channel: grpc.Channel) -> int:
    request = health_pb2.HealthCheckRequest()
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def python_pool(channel: grpc.Channel) -> pb.PoolState:
    status = pb_grpc.PoolStub(channel).GetStatus(pb.GetPoolStatusRequest(), timeout=5)
    return next(p for p in status.pools if p.name == "python")


def running(instance: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=io.sandboxd.instance={instance}"],
                         capture_output=True, text=True)
    return out.stdout.split()


def remove_all(instance: str) -> None:
    subprocess.run(["docker", "rm", "-f", *containers(f"io.sandboxd.instance={instance}")], capture_output=True)


def batch_in_background(channel: grpc.Channel, count: int, *, sleep: float,
                        ) -> tuple[threading.Thread, list[pb.JobResult]]:
    """A RunBatch of `count` jobs that sleep, then print their index, read by a thread (results fill the list)."""
    jobs = [helpers.execute(f"import time; time.sleep({sleep}); print({i})") for i in range(count)]
    for i, job in enumerate(jobs):
        job.index = i
    results: list[pb.JobResult] = []
    reader = threading.Thread(target=lambda: results.extend(
        pb_grpc.JobsStub(channel).RunBatch(pb.RunBatchRequest(jobs=jobs), timeout=120)))
    reader.start()
    return reader, results


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon with 4 warm python sandboxes (2 slots each), for the tests that kill or freeze them."""
    daemon = DaemonProcess(tmp_path_factory.mktemp("chaos"), "four",
                           extra_env={**PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "4"})
    try:
        daemon.wait_serving()
        yield daemon
    finally:
        assert daemon.stop() == 0
    assert containers(f"io.sandboxd.instance={instance_of(daemon)}") == []


def test_job_right_after_every_sandbox_is_removed_is_not_lost(four: DaemonProcess) -> None:
    """Sandboxes that died idle cost a job no attempt: with 4 of them dead, a job spent its 3 attempts on
    them in milliseconds and was answered SANDBOX_LOST by a healthy engine."""
    instance = instance_of(four)
    with grpc.insecure_channel(four.address) as channel:
        helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 4)
        remove_all(instance)
        result = helpers.run(channel, helpers.execute("print(6 * 7)"), timeout=60)
        assert result.status == pb.STATUS_OK, result
        assert result.execute.stdout == b"42\n"


def test_status_stops_counting_removed_sandboxes_and_the_pool_refills(four: DaemonProcess) -> None:
    """The pool finds out by itself (not at the next job) that its idle sandboxes are gone: the status
    stops counting them as ready and new ones start."""
    instance = instance_of(four)
    with grpc.insecure_channel(four.address) as channel:
        recycled = helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 4).recycled_total
        before = set(running(instance))
        remove_all(instance)
        deadline = time.monotonic() + 10
        while python_pool(channel).recycled_total < recycled + 4:
            assert time.monotonic() < deadline, f"the pool still counts its removed sandboxes: {python_pool(channel)}"
            time.sleep(0.2)
        helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 4)
        live = set(running(instance))
        assert len(live) >= 4 and not live & before


def test_batch_survives_every_sandbox_removed(four: DaemonProcess) -> None:
    instance = instance_of(four)
    with grpc.insecure_channel(four.address) as channel:
        helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 4)
        reader, results = batch_in_background(channel, 40, sleep=0.3)
        time.sleep(1.0)
        remove_all(instance)
        reader.join(120)
    assert sorted(r.index for r in results) == list(range(40))
    assert all(r.status == pb.STATUS_OK and r.execute.stdout == f"{r.index}\n".encode() for r in results), [
        (r.index, pb.Status.Name(r.status), r.message) for r in results if r.status != pb.STATUS_OK]


def test_paused_sandboxes_are_replaced_and_their_job_retried_at_once(four: DaemonProcess) -> None:
    """A frozen agent (`docker pause`) never answers: its job ran into the budget plus 10 s of slack per
    attempt (27.6 s for a 3 s job), and idle paused sandboxes still took jobs."""
    instance = instance_of(four)
    with grpc.insecure_channel(four.address) as channel:
        helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 4)
        results: list[pb.JobResult] = []
        job = helpers.execute("import time; time.sleep(1); print('done')", timeout=3)
        worker = threading.Thread(target=lambda: results.append(helpers.run(channel, job, timeout=60)))
        started = time.monotonic()
        worker.start()
        time.sleep(0.5)
        paused = running(instance)
        subprocess.run(["docker", "pause", *paused], capture_output=True)
        try:
            worker.join(60)
            elapsed = time.monotonic() - started
        finally:
            # The daemon removes them; those it has not removed yet must not stay frozen.
            subprocess.run(["docker", "unpause", *paused], capture_output=True)
    assert len(results) == 1
    assert results[0].status == pb.STATUS_OK and results[0].execute.stdout == b"done\n", results[0]
    assert elapsed < 10, f"the job took {elapsed:.1f} s"


def test_deleted_snapshot_falls_back_to_cold_starts(tmp_path: Path) -> None:
    """A checkpoint deleted from the store between restores failed every start, uncounted as a failed
    restore, so the pool never fell back to cold starts and never grew."""
    state = tmp_path / "state"  # a store of its own: the shared one stays intact
    daemon = DaemonProcess(tmp_path, "nosnap", extra_env={**PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "1",
                                                           "SANDBOXD_SANDBOX_STATE_DIR": str(state)})
    try:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.address) as channel:
            helpers.require_snapshots(pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5))
            checkpoints = list((state / "snapshots").glob("*/warm"))
            assert checkpoints
            for checkpoint in checkpoints:
                shutil.rmtree(checkpoint)
            pool = pb_grpc.PoolStub(channel)
            pool.SetBatchHint(pb.BatchHint(batch_size=6, pools=["python"]), timeout=5)
            deadline = time.monotonic() + 30
            while (pool_state := python_pool(channel)).ready < 3 and time.monotonic() < deadline:
                time.sleep(0.3)
            assert pool_state.ready >= 3, pool_state
            assert pool_state.snapshot.startswith("failed") and pool_state.start_method == "cold", pool_state
            assert helpers.run(channel, helpers.execute("print(6 * 7)")).execute.stdout == b"42\n"
    finally:
        assert daemon.stop() == 0


def _restores(metrics_url: str) -> float:
    body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found = re.search(r'^sandboxd_sandbox_starts_total\{method="restore",pool="python"\} (\S+)$', body, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_failed_snapshot_is_built_again_and_restored_from(tmp_path: Path) -> None:
    """A snapshot that failed once (here: restores of a deleted checkpoint) left its pool starting cold for
    the daemon's life. After pool.snapshot_retry_seconds it is built again, and starts restore from it."""
    state = tmp_path / "state"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    daemon = DaemonProcess(tmp_path, "resnap", extra_env={
        **PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "1", "SANDBOXD_SANDBOX_STATE_DIR": str(state),
        "SANDBOXD_POOL_RESTORE": "always", "SANDBOXD_POOL_SNAPSHOT_RETRY_SECONDS": "3",
        "SANDBOXD_POOL_RECYCLE_AFTER_JOBS": "2",
        "SANDBOXD_SERVER_METRICS": f"127.0.0.1:{port}"})
    try:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.address) as channel:
            helpers.require_snapshots(pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5))
            for checkpoint in (state / "snapshots").glob("*/warm"):
                shutil.rmtree(checkpoint)
            pool = pb_grpc.PoolStub(channel)
            pool.SetBatchHint(pb.BatchHint(batch_size=6, pools=["python"]), timeout=5)
            deadline = time.monotonic() + 120
            while "snapshot failed: restore failed 3 times" not in daemon.log_path.read_text():
                assert time.monotonic() < deadline, python_pool(channel)
                time.sleep(0.3)
            assert "it is built again in 3 s" in daemon.log_path.read_text()
            while python_pool(channel).snapshot != "ready":
                assert time.monotonic() < deadline, python_pool(channel)
                time.sleep(0.3)
            assert list((state / "snapshots").glob("*/warm"))
            assert python_pool(channel).start_method == "restore"
            restored = _restores(metrics_url)
            # Sandboxes retire after 2 jobs here: their replacements restore from the rebuilt snapshot.
            results = [helpers.run(channel, helpers.execute(f"print({i} * 7)")) for i in range(24)]
            assert [r.execute.stdout for r in results] == [f"{i * 7}\n".encode() for i in range(24)]
            while _restores(metrics_url) <= restored:
                assert time.monotonic() < deadline, python_pool(channel)
                time.sleep(0.3)
    finally:
        assert daemon.stop() == 0


def test_shutdown_during_refill_leaves_no_container(tmp_path: Path) -> None:
    """SIGTERM while the pool starts sandboxes: a start cancelled while its create was still in the engine
    left a container nobody removed (until the next daemon on the node reaped it)."""
    for round_ in range(3):
        daemon = DaemonProcess(tmp_path, f"refill{round_}", extra_env={
            **PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "1", "SANDBOXD_POOL_SNAPSHOTS": "false",
            "SANDBOXD_POOL_START_CONCURRENCY": "4"})
        try:
            daemon.wait_serving()
            instance = instance_of(daemon)
            with grpc.insecure_channel(daemon.address) as channel:
                pb_grpc.PoolStub(channel).SetBatchHint(pb.BatchHint(batch_size=8, pools=["python"]), timeout=5)
                time.sleep(0.05 * round_)
        finally:
            assert daemon.stop() == 0
        assert containers(f"io.sandboxd.instance={instance}") == []


def test_sigterm_answers_every_accepted_job_within_the_grace(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, "drain", extra_env={**PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "2"})
    try:
        daemon.wait_serving()
        instance = instance_of(daemon)
        with grpc.insecure_channel(daemon.address) as channel:
            reader, results = batch_in_background(channel, 24, sleep=0.5)
            time.sleep(1.0)
            daemon.process.send_signal(signal.SIGTERM)
            reader.join(60)
            assert daemon.process.wait(30) == 0
    finally:
        daemon.stop()
    assert sorted(r.index for r in results) == list(range(24))
    assert all(r.status == pb.STATUS_OK for r in results)
    assert containers(f"io.sandboxd.instance={instance}") == []


# ---- the engine itself ------------------------------------------------------------------------------------
def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def start_engine() -> None:
    """scripts/setup.sh starts dockerd (removing the pid file a killed one leaves) and waits for it."""
    subprocess.run(["bash", "scripts/setup.sh", "--no-images", "--no-criu"], cwd=REPO, capture_output=True,
                   timeout=120)
    deadline = time.monotonic() + 60
    while not engine_answers():
        if time.monotonic() > deadline:
            pytest.fail("the Docker engine did not come back")
        time.sleep(0.5)


@pytest.fixture
def engine_restorer() -> Iterator[None]:
    """Whatever the test does to dockerd, the engine runs again after it."""
    if not (REPO / "scripts" / "setup.sh").exists() or os.geteuid() != 0:
        pytest.skip("restarting the Docker engine needs root and scripts/setup.sh")
    if subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode != 0:
        pytest.skip("dockerd does not run on this machine (a remote engine?)")
    try:
        yield
    finally:
        if not engine_answers():
            start_engine()


def test_engine_killed_and_restarted(tmp_path: Path, engine_restorer: None, daemon: DaemonProcess) -> None:
    """dockerd SIGKILLed: health goes NOT_SERVING and jobs are refused UNAVAILABLE (nothing can start a
    sandbox); once the engine is back (its restart kills the old containers), the pool replaces them by
    itself and health is SERVING again. The session's shared daemon (`daemon`) comes back too."""
    own = DaemonProcess(tmp_path, "engine", extra_env={**PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "2"})
    try:
        own.wait_serving()
        instance = instance_of(own)
        with grpc.insecure_channel(own.address) as channel:
            before = set(running(instance))
            pid = int(subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()[0])
            os.kill(pid, signal.SIGKILL)
            # No wait for its reaping: scripts/setup.sh took a dockerd not yet reaped (a zombie) for a live
            # one and started none; it now starts one whatever the dead one's state.
            deadline = time.monotonic() + 10
            while health(channel) != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, "still SERVING without an engine"
                time.sleep(0.2)
            with pytest.raises(grpc.RpcError) as refused:
                helpers.run(channel, helpers.execute("print(1)"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "Docker engine" in refused.value.details()
            start_engine()
            own.wait_serving(timeout=30)
            state = helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 2)
            live = set(running(instance))
            assert len(live) >= state.ready and not live & before, (before, live, state)
            result = helpers.run(channel, helpers.execute("print(6 * 7)"), timeout=30)
            assert result.status == pb.STATUS_OK and result.attempts == 1, result
        daemon.wait_serving(timeout=30)
    finally:
        assert own.stop() == 0
    assert containers(f"io.sandboxd.instance={instance}") == []


def test_jobs_waiting_out_an_engine_outage_are_answered(tmp_path: Path, engine_restorer: None,
                                                        daemon: DaemonProcess) -> None:
    """dockerd frozen (SIGSTOP) and the only sandbox's agent killed: the admitted jobs can get no sandbox, since
    none can start, and they waited for the engine without end. After scheduler.engine_outage_seconds each is
    answered SANDBOX_LOST with its failure value; once the engine is back the daemon serves again."""
    own = DaemonProcess(tmp_path, "outage", extra_env={
        **PYTHON_ONLY, "SANDBOXD_POOL_MIN_SIZE": "1", "SANDBOXD_POOL_MAX_SIZE": "1",
        "SANDBOXD_SCHEDULER_ENGINE_OUTAGE_SECONDS": "3", "SANDBOXD_DOCKER_TIMEOUT_SECONDS": "8"})
    dockerd = int(subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()[0])
    try:
        own.wait_serving()
        [container] = running(instance_of(own))
        agent = int(subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", container], capture_output=True,
                                   text=True, check=True).stdout)
        with grpc.insecure_channel(own.address) as channel:
            os.kill(dockerd, signal.SIGSTOP)
            try:
                os.kill(agent, signal.SIGKILL)
                # Sent at once: admitted before the engine watch finds the engine gone (it then refuses jobs).
                reader, results = batch_in_background(channel, 4, sleep=0)
                reader.join(timeout=90)  # a hang detector: without the outage limit it waited for ever
            finally:
                os.kill(dockerd, signal.SIGCONT)
            assert not reader.is_alive(), "jobs still waiting for a sandbox 90 s into the outage"
            assert sorted(r.index for r in results) == [0, 1, 2, 3]
            for result in results:
                assert (result.status, result.reward) == (pb.STATUS_SANDBOX_LOST, -1.0), result
                assert result.message.startswith("no sandbox: the Docker engine has not answered for 3 s"), result
            own.wait_serving(timeout=60)
            result = helpers.run(channel, helpers.execute("print(6 * 7)"), timeout=30)
            assert result.status == pb.STATUS_OK, result
        daemon.wait_serving(timeout=60)
    finally:
        os.kill(dockerd, signal.SIGCONT)
        assert own.stop() == 0
