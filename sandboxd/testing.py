"""A real sandboxd daemon as a subprocess: what the tests and the benchmarks start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class DaemonProcess:
    """`python -m sandboxd serve` on a socket in `folder`, logging to `folder/<name>.log`.

    `prefix` is a command the daemon runs under, which must exec it in place (the
    process is the daemon's, for signals): ``("ip", "netns", "exec", NAME)``.

    The run dir (agent sockets) is a fresh short path under /tmp whatever
    `folder` is: a Unix socket path holds at most 108 bytes.
    """

    def __init__(self, folder: Path, name: str = "d", *, env: dict[str, str] | None = None,
                 args: Sequence[str] = (), prefix: Sequence[str] = ()) -> None:
        self.socket = str(folder / f"{name}.sock")
        self.address = f"unix://{self.socket}"
        self.log_path = folder / f"{name}.log"
        # Ours to remove at stop, unless the caller names one.
        self._run_dir = "" if "SANDBOXD_SANDBOX_RUN_DIR" in (env or {}) else tempfile.mkdtemp(prefix="sbd-")
        environment = {
            **os.environ,
            "SANDBOXD_SERVER_LOG_FORMAT": "text",
            **({"SANDBOXD_SANDBOX_RUN_DIR": self._run_dir} if self._run_dir else {}),
            **(env or {}),
        }
        self.log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen([*prefix, sys.executable, "-m", "sandboxd", "serve", "--socket", self.socket,
                                         *args],
                                        env=environment, stdout=self.log, stderr=subprocess.STDOUT)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_serving(self, timeout: float = 180.0) -> None:
        """Block until grpc.health.v1 says SERVING; RuntimeError with the log's tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited {self.process.returncode}:\n{self.log_tail()}")
            if os.path.exists(self.socket):
                with grpc.insecure_channel(self.address) as channel:
                    try:
                        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
                        if reply.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                    except grpc.RpcError:
                        pass
            time.sleep(0.2)
        raise RuntimeError(f"daemon not serving after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (the daemon drains and removes its sandboxes); SIGKILL if it hangs. Returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        if self._run_dir:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        return self.process.returncode
