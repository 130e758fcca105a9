"""The TCP door of a real daemon: mutual TLS and bearer tokens on 127.0.0.1, refusals that leave a batch alone."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd_client import Result, SandboxClient, execute_job
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess, docker_available
from tests.integration.helpers import assert_strangers_refused, refusal, write_leaf

JOBS_TOKEN = "jobs-" + "1" * 32
ADMIN_TOKEN = "admin-" + "2" * 32


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str, Path]]:
    """A daemon on its Unix socket and on 127.0.0.1:<port> with mutual TLS and tokens; yields it, the TCP
    address and the folder of certificates (ca.pem, client.*, stranger.* from another CA)."""
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    folder = tmp_path_factory.mktemp("door")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(folder / "ca.pem")
    write_leaf(folder, "server", ca.issue_cert("127.0.0.1"))
    write_leaf(folder, "client", ca.issue_cert("trainer@sandboxd.test"))
    write_leaf(folder, "stranger", trustme.CA().issue_cert("trainer@sandboxd.test"))
    tokens = folder / "tokens"
    tokens.write_text(f"trainer jobs {JOBS_TOKEN}\nops admin {ADMIN_TOKEN}\n")
    os.chmod(tokens, 0o600)
    tcp = f"127.0.0.1:{_free_port()}"
    process = DaemonProcess(folder, "door", tcp=tcp, extra_env={
        "SANDBOXD_SERVER_TLS_CERT": str(folder / "server.pem"),
        "SANDBOXD_SERVER_TLS_KEY": str(folder / "server.key"),
        "SANDBOXD_SERVER_TLS_CLIENT_CA": str(folder / "ca.pem"),
        "SANDBOXD_SERVER_TOKENS_FILE": str(tokens),
        # One warm python sandbox is all these calls need.
        "SANDBOXD_POOL_IMAGES": "python",
        "SANDBOXD_POOL_MATH": "false",
        "SANDBOXD_SESSIONS_ENABLED": "false",
        "SANDBOXD_POOL_MIN_SIZE": "1",
    })
    try:
        process.wait_serving()
        yield process, tcp, folder
    finally:
        process.stop()


def _client(folder: Path, tcp: str, token: str | None, cert: str = "client") -> SandboxClient:
    return SandboxClient(tcp, token=token, tls_ca=str(folder / "ca.pem"), tls_cert=str(folder / f"{cert}.pem"),
                         tls_key=str(folder / f"{cert}.key"), max_retries=0)


def test_jobs_token_scores_and_refusals_leave_the_batch_alone(door: tuple[DaemonProcess, str, Path]) -> None:
    process, tcp, folder = door
    results: list[Result] = []
    with _client(folder, tcp, JOBS_TOKEN) as trainer:
        assert trainer.run(execute_job("print(6 * 7)", timeout=10)).ok
        # A batch that runs for 2 s, while every kind of stranger knocks.
        batch = threading.Thread(target=lambda: results.extend(trainer.score_batch(
            [execute_job("import time; time.sleep(2); print(1)", timeout=20) for _ in range(4)])))
        batch.start()
        refusals: dict[str, Any] = {}
        with _client(folder, tcp, None) as anonymous:
            refusals["no token"] = refusal(anonymous.info)
        with _client(folder, tcp, "wrong-" + "3" * 32) as wrong:
            refusals["wrong token"] = refusal(wrong.info)
        refusals["jobs token, batch hint"] = refusal(lambda: trainer.set_batch_hint(64))
        with _client(folder, tcp, JOBS_TOKEN, cert="stranger") as stranger:
            refusals["certificate of another CA"] = refusal(stranger.info)
        with grpc.insecure_channel(tcp) as plaintext:
            refusals["plaintext"] = refusal(lambda: pb_grpc.DaemonStub(plaintext).GetInfo(
                pb.GetInfoRequest(), timeout=5, metadata=(("authorization", f"Bearer {JOBS_TOKEN}"),)))
        knocked_while_running = batch.is_alive()
        batch.join(timeout=120)
    assert knocked_while_running
    assert_strangers_refused(refusals)
    assert [result.ok for result in results] == [True] * 4, results
    log = process.log_path.read_text()
    assert JOBS_TOKEN not in log and ADMIN_TOKEN not in log and "wrong-" not in log
    assert "refused /sandboxd.v1.Pool/SetBatchHint to token 'trainer' (role jobs)" in log
    with _client(folder, tcp, ADMIN_TOKEN) as ops:
        assert ops.set_batch_hint(2).pools


def test_health_needs_no_token_and_unix_socket_none(door: tuple[DaemonProcess, str, Path]) -> None:
    process, tcp, folder = door
    credentials = grpc.ssl_channel_credentials((folder / "ca.pem").read_bytes(), (folder / "client.key").read_bytes(),
                                               (folder / "client.pem").read_bytes())
    with grpc.secure_channel(tcp, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with SandboxClient(process.address) as local:
        assert local.info().version
        assert local.set_batch_hint(2).pools
