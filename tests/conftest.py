"""Shared fixtures: a real sandboxd daemon, started as a subprocess on a temp socket."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

# Snapshots and staged agent code persist here between runs, as on a real
# node (a checkpoint is rebuilt only when the image or agent code changes).
STATE_DIR = os.environ.get("SANDBOXD_TEST_STATE_DIR", "/var/lib/sandboxd-test")


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


class DaemonProcess:
    def __init__(self, tmp: Path, name: str = "d", *, extra_env: dict[str, str] | None = None,
                 tcp: str = "", args: list[str] | None = None) -> None:
        self.socket = str(tmp / f"{name}.sock")
        self.address = f"unix://{self.socket}"
        self.log_path = tmp / f"{name}.log"
        env = dict(os.environ)
        env.update({
            "SANDBOXD_SERVER_METRICS": "",
            "SANDBOXD_SERVER_LOG_FORMAT": "text",
            "SANDBOXD_SANDBOX_STATE_DIR": STATE_DIR,
            # Short: agent sockets live under it, and sun_path holds 108 bytes.
            "SANDBOXD_SANDBOX_RUN_DIR": tempfile.mkdtemp(prefix="sbd-"),
            "SANDBOXD_POOL_MIN_SIZE": "2",
        })
        env.update(extra_env or {})
        command = [sys.executable, "-m", "sandboxd", "serve", "--socket", self.socket, *(args or [])]
        if tcp:
            command += ["--tcp", tcp]
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_serving(self, timeout: float = 180.0) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited {self.process.returncode}:\n{self.log_path.read_text()}")
            if os.path.exists(self.socket):
                with grpc.insecure_channel(self.address) as channel:
                    stub = health_pb2_grpc.HealthStub(channel)
                    try:
                        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                        if reply.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                    except grpc.RpcError:
                        pass
            time.sleep(0.2)
        raise RuntimeError(f"daemon not serving after {timeout} s:\n{self.log_path.read_text()}")

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    process = DaemonProcess(tmp_path_factory.mktemp("daemon"))
    try:
        process.wait_serving()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def channel(daemon: DaemonProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield channel
