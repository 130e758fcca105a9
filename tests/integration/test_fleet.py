"""A fleet: three real daemons, each in a network namespace the test makes, one client over TLS and tokens.

The client balances a batch of 1,000 code jobs over the three (round_robin, health checked). Mid-batch one
daemon is SIGKILLed and another drained with SIGTERM, then both are started again; meanwhile strangers knock
at the third (no token, a wrong token, a `jobs` token asking for SetBatchHint, a certificate of another CA,
plaintext). Every job must be answered once with its right score, the restarted daemons must take work again,
and every stranger must be refused with its own status. Traffic goes only to the namespaces' own addresses
(tests/integration/netns.py) and to loopback.

Run with -s to see the figures: per-daemon counts, retries, and each restarted daemon's time from SERVING to
the first job it answered.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd_client import AsyncSandboxClient, Result, SandboxClient, code_job, execute_job
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess, docker_available
from tests.integration import netns
from tests.integration.helpers import assert_strangers_refused, refusal, write_leaf
from tests.integration.test_runtime import containers, instance_of

pytestmark = [pytest.mark.docker, pytest.mark.slow]

JOBS_TOKEN = "trainer-" + "4" * 32
ADMIN_TOKEN = "ops-" + "5" * 32
PORT = 50051
# The name every daemon's certificate carries beside its address: gRPC checks a list's certificates
# against one name (the client's tls_server_name), as a fleet behind one DNS name has.
FLEET_NAME = "sandboxd.fleet.test"
NODES = ("a", "b", "c")
JOB_COUNT = 1000
# Each job sleeps this long: with 4 job slots a daemon (2 sandboxes of 2) the three answer about 48 jobs a
# second, and the batch outlasts a kill, a drain and two restarts (about 25 s, half of it with one daemon),
# while the jobs take little CPU on a 2-core machine.
JOB_SECONDS = 0.25
# Restarted daemons must take work again within 2 s of serving (issue #48); this test's bound is generous
# for a loaded CI machine, and the figure is printed.
RESTART_BOUND_SECONDS = 10.0
SERVING = health_pb2.HealthCheckResponse.SERVING


def job(i: int) -> pb.Job:
    """A program that reads i and prints 7 i (right), or 8 i for every third i, from 1 (wrong: reward 0)."""
    factor = 8 if i % 3 == 1 else 7
    program = f"import time\ntime.sleep({JOB_SECONDS})\nprint(int(input()) * {factor})\n"
    return code_job(program, [(f"{i}\n", f"{7 * i}\n")], extraction="whole", timeout=10, failure_value=0.0)


def expected_reward(i: int) -> float:
    return 0.0 if i % 3 == 1 else 1.0


@dataclass
class Fleet:
    """The namespaces, certificates, tokens, and the daemons running in them (by node letter)."""

    folder: Path
    spaces: dict[str, netns.Namespace]
    daemons: dict[str, DaemonProcess] = field(default_factory=dict)
    stopped: list[DaemonProcess] = field(default_factory=list)

    def address(self, node: str) -> str:
        return f"{self.spaces[node].address}:{PORT}"

    def start(self, node: str, incarnation: str = "") -> DaemonProcess:
        """Start the daemon of `node` in its namespace (not waiting for it to serve)."""
        space = self.spaces[node]
        self.daemons[node] = DaemonProcess(self.folder, f"{node}{incarnation}", tcp=self.address(node),
                                           prefix=space.exec_prefix(), extra_env={
            "SANDBOXD_SERVER_NODE_NAME": f"fleet-{node}",
            "SANDBOXD_SERVER_TLS_CERT": str(self.folder / f"{node}.pem"),
            "SANDBOXD_SERVER_TLS_KEY": str(self.folder / f"{node}.key"),
            "SANDBOXD_SERVER_TLS_CLIENT_CA": str(self.folder / "ca.pem"),
            "SANDBOXD_SERVER_TOKENS_FILE": str(self.folder / "tokens"),
            "SANDBOXD_POOL_IMAGES": "python",
            "SANDBOXD_POOL_MATH": "false",
            "SANDBOXD_SESSIONS_ENABLED": "false",
            "SANDBOXD_POOL_MIN_SIZE": "2",
            "SANDBOXD_POOL_MAX_SIZE": "2",
        })
        return self.daemons[node]

    def client(self, nodes: tuple[str, ...], token: str | None, *, cert: str = "client",
               **options: Any) -> SandboxClient:
        addresses = [self.address(node) for node in nodes]
        return SandboxClient(addresses if len(addresses) > 1 else addresses[0], token=token,
                             tls_ca=str(self.folder / "ca.pem"), tls_cert=str(self.folder / f"{cert}.pem"),
                             tls_key=str(self.folder / f"{cert}.key"),
                             tls_server_name=FLEET_NAME if len(addresses) > 1 else None, **options)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    if why := netns.unavailable():
        pytest.skip(f"no network namespaces here: {why}")
    folder = tmp_path_factory.mktemp("fleet")
    with netns.namespaces(len(NODES), "fleet") as made:
        spaces = dict(zip(NODES, made, strict=True))
        ca = trustme.CA()
        ca.cert_pem.write_to_path(folder / "ca.pem")
        for node, space in spaces.items():
            write_leaf(folder, node, ca.issue_cert(FLEET_NAME, space.address))
        write_leaf(folder, "client", ca.issue_cert("trainer@sandboxd.test"))
        write_leaf(folder, "stranger", trustme.CA().issue_cert("trainer@sandboxd.test"))
        tokens = folder / "tokens"
        tokens.write_text(f"trainer jobs {JOBS_TOKEN}\nops admin {ADMIN_TOKEN}\n")
        os.chmod(tokens, 0o600)
        fleet = Fleet(folder, spaces)
        try:
            for node in NODES:
                fleet.start(node)
            for daemon in fleet.daemons.values():
                daemon.wait_serving()
            yield fleet
        finally:
            everyone = [*fleet.daemons.values(), *fleet.stopped]
            for daemon in everyone:
                daemon.stop()
    # The killed daemon's sandboxes too: its successor reaped them at its start.
    left = {daemon.log_path.name: containers(f"io.sandboxd.instance={instance_of(daemon)}") for daemon in everyone}
    assert not any(left.values()), left


def strangers_knock(fleet: Fleet, node: str) -> dict[str, tuple[grpc.StatusCode, str]]:
    """Every kind of refused caller, at `node`'s TLS port."""
    refusals = {}
    once: dict[str, Any] = {"max_retries": 0}
    with fleet.client((node,), None, **once) as anonymous:
        refusals["no token"] = refusal(anonymous.info)
    with fleet.client((node,), "wrong-" + "6" * 32, **once) as wrong:
        refusals["wrong token"] = refusal(wrong.info)
    with fleet.client((node,), JOBS_TOKEN, **once) as trainer:
        refusals["jobs token, batch hint"] = refusal(lambda: trainer.set_batch_hint(64))
    with fleet.client((node,), JOBS_TOKEN, cert="stranger", **once) as stranger:
        refusals["certificate of another CA"] = refusal(stranger.info)
    with grpc.insecure_channel(fleet.address(node)) as plaintext:
        refusals["plaintext"] = refusal(lambda: pb_grpc.DaemonStub(plaintext).GetInfo(
            pb.GetInfoRequest(), timeout=5, metadata=(("authorization", f"Bearer {JOBS_TOKEN}"),)))
    return refusals


def connect_every_daemon(client: SandboxClient) -> None:
    """Run one-job calls until each daemon has answered one: the client's channel is then connected to all.

    A batch sent by a client that has just been made lands on the first daemon its channel connects to
    (round_robin picks among the connected ones): here the first 12 chunks (96 jobs) all went to one daemon,
    whose jobs then finished last while the others idled. A trainer's client lives for the whole run.
    """
    seen: set[str] = set()
    for _ in range(100):
        seen.add(client.run(execute_job("print(1)", timeout=10)).node)
        if len(seen) == len(NODES):
            return
    raise AssertionError(f"only {sorted(seen)} answered 100 calls")


def serving_from(daemon: DaemonProcess, timeout: float = 180.0) -> float:
    """When `daemon` first said SERVING (time.monotonic, to 20 ms): its health, asked on its Unix socket."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(daemon.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert daemon.process.poll() is None, f"{daemon.log_path.name}: exited\n{daemon.log_tail()}"
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == SERVING:
                    return time.monotonic()
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.02)
    raise AssertionError(f"{daemon.log_path.name}: not serving after {timeout:.0f} s\n{daemon.log_tail()}")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.02)


def test_a_batch_survives_a_kill_a_drain_two_restarts_and_strangers(fleet: Fleet) -> None:
    with fleet.client(NODES, ADMIN_TOKEN) as ops:
        hinted = ops.set_batch_hint(JOB_COUNT)
    assert sorted(pool.name for pool in hinted.pools) == ["python"] * 3

    arrivals: list[tuple[float, Result]] = []
    failure: list[BaseException] = []
    # Chunks of 8 jobs, 12 at once: enough in flight to keep every daemon's 4 slots busy, and small enough
    # that a daemon coming back is given a new chunk soon.
    client = fleet.client(NODES, JOBS_TOKEN, batch_size=8, max_concurrent_batches=12)
    connect_every_daemon(client)

    def consume() -> None:
        try:
            for result in client.run_batch([job(i) for i in range(JOB_COUNT)]):
                arrivals.append((time.monotonic(), result))
        except BaseException as error:  # re-raised by the test's thread
            failure.append(error)

    def answered(node: str, after: float) -> tuple[float, Result] | None:
        """The first result that `node` answered after `after`, and when it arrived."""
        return next(((at, result) for at, result in list(arrivals) if result.node == f"fleet-{node}" and at > after),
                    None)

    with client:
        batch = threading.Thread(target=consume, name="fleet-batch")
        started = time.monotonic()
        batch.start()
        wait_for(lambda: len(arrivals) >= 150 or not batch.is_alive(), 120, "150 results")
        killed = fleet.daemons.pop("a")
        with grpc.insecure_channel(killed.address) as channel:
            held = pb_grpc.PoolStub(channel).GetStatus(pb.GetPoolStatusRequest(), timeout=10)
        killed.process.kill()
        killed_at = time.monotonic()
        # Reaped, as its supervisor (systemd, the kubelet) would: a zombie's pid still answers, and its
        # successor would take its sandboxes for those of a live daemon.
        killed.process.wait()
        fleet.stopped.append(killed)
        refusals = strangers_knock(fleet, "c")
        knocked_while_running = batch.is_alive()

        wait_for(lambda: len(arrivals) >= 300 or not batch.is_alive(), 120, "300 results")
        drained = fleet.daemons.pop("b")
        fleet.stopped.append(drained)
        drain_at = time.monotonic()
        drained_status = drained.stop()  # SIGTERM: it finishes what it holds, then exits
        drain_seconds = time.monotonic() - drain_at
        after_drain = sum(1 for at, result in list(arrivals) if result.node == "fleet-b" and at > drain_at)

        restarted_at = time.monotonic()
        for node in ("a", "b"):
            fleet.start(node, "-again")
        with ThreadPoolExecutor(2) as watchers:
            serving = dict(zip(("a", "b"), watchers.map(lambda node: serving_from(fleet.daemons[node]), ("a", "b")),
                               strict=True))
        # (seconds from SERVING to the daemon taking its first job, to its answer arriving)
        first: dict[str, tuple[float, float]] = {}
        for node in ("a", "b"):
            wait_for(lambda: answered(node, serving[node]) is not None or not batch.is_alive(),  # noqa: B023
                     120, f"a job answered by the restarted fleet-{node}")
            answer = answered(node, serving[node])
            assert answer is not None, f"the batch ended before the restarted fleet-{node} took work"
            at, result = answer
            first[node] = (at - result.timings.total_seconds - serving[node], at - serving[node])
        batch.join(timeout=300)
        elapsed = time.monotonic() - started
    assert not batch.is_alive() and not failure, failure

    results = [result for _, result in arrivals]
    by_index = Counter(result.index for result in results)
    assert len(results) == JOB_COUNT and set(by_index.values()) == {1}, "every job answered exactly once"
    wrong = [(r.index, r.reward, r.status.name, r.node, r.message[:200]) for r in results
             if r.reward != expected_reward(r.index) or r.is_infrastructure_failure]
    assert wrong == [], wrong[:10]
    counts = Counter(result.node for result in results)
    retried = [result for result in results if result.client_attempts > 1]
    print(f"\n{JOB_COUNT} jobs in {elapsed:.1f} s; answered by {dict(sorted(counts.items()))}; "
          f"{len(retried)} jobs retried by the client ({sum(r.client_attempts - 1 for r in retried)} retries), "
          f"{sum(1 for r in results if r.attempts > 1)} by a daemon on another sandbox")
    print(f"fleet-a SIGKILLed at {killed_at - started:.1f} s holding {held.in_flight} jobs running and "
          f"{held.queue_depth} queued; fleet-b drained from {drain_at - started:.1f} s "
          f"in {drain_seconds:.1f} s (exit {drained_status}), answering {after_drain} jobs meanwhile")
    for node in ("a", "b"):
        print(f"restarted fleet-{node}: serving {serving[node] - restarted_at:.1f} s after its start; its first job "
              f"taken {first[node][0]:.2f} s after it served, answered {first[node][1]:.2f} s after")
    assert set(counts) == {"fleet-a", "fleet-b", "fleet-c"}
    assert retried, "the jobs fleet-a held when it was killed were sent again"
    assert drained_status == 0
    assert all(answered_after < RESTART_BOUND_SECONDS for _, answered_after in first.values()), first

    assert knocked_while_running
    assert_strangers_refused(refusals)


def test_node_local_first_then_the_fleet(fleet: Fleet, tmp_path: Path) -> None:
    """A client on a node with its own daemon (the Unix socket) uses it, and sends the fleet what it refuses
    (a small scheduler.max_queued) and everything once it is stopped."""
    local = DaemonProcess(tmp_path, "local", extra_env={
        "SANDBOXD_SERVER_NODE_NAME": "local",
        "SANDBOXD_POOL_IMAGES": "python",
        "SANDBOXD_POOL_MATH": "false",
        "SANDBOXD_SESSIONS_ENABLED": "false",
        "SANDBOXD_POOL_MIN_SIZE": "1",
        "SANDBOXD_POOL_MAX_SIZE": "1",
        # 2 jobs on its one sandbox and 4 waiting: a batch of 48 does not fit.
        "SANDBOXD_SCHEDULER_MAX_QUEUED": "4",
    })
    fleet_addresses = [fleet.address(node) for node in NODES]
    tls: dict[str, Any] = {"tls_ca": str(fleet.folder / "ca.pem"), "tls_cert": str(fleet.folder / "client.pem"),
           "tls_key": str(fleet.folder / "client.key"), "tls_server_name": FLEET_NAME}
    try:
        local.wait_serving()
        with SandboxClient(local.address, fleet=fleet_addresses, token=ADMIN_TOKEN, **tls) as ops:
            hinted = ops.set_batch_hint(48)
        assert len(hinted.pools) == 4, "the local daemon and each of the fleet's were told"
        with SandboxClient(local.address, fleet=fleet_addresses, token=JOBS_TOKEN, batch_size=2,
                           max_concurrent_batches=12, **tls) as client:
            assert client.info().node == "local"
            results = client.score_batch([job(i) for i in range(48)])
        assert [(r.index, r.reward) for r in results] == [(i, expected_reward(i)) for i in range(48)]
        counts = Counter(r.node for r in results)
        spilled = [r for r in results if r.node != "local" and r.client_attempts > 1]
        print(f"\nlocal daemon full: answered by {dict(sorted(counts.items()))}; {len(spilled)} jobs refused by "
              "the local daemon and answered by the fleet")
        assert counts["local"] > 0 and spilled, counts
        assert local.stop() == 0

        async def stopped_local() -> list[Result]:
            async with AsyncSandboxClient(local.address, fleet=fleet_addresses, token=JOBS_TOKEN, batch_size=2,
                                          **tls) as client:
                return await client.score_batch([job(i) for i in range(12)])

        results = asyncio.run(stopped_local())
        assert [(r.index, r.reward) for r in results] == [(i, expected_reward(i)) for i in range(12)]
        assert {r.node for r in results} <= {f"fleet-{node}" for node in NODES}
    finally:
        local.stop()
