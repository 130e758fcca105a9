"""Shared fixtures: a real sandboxd daemon, started as a subprocess on a temp socket."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import grpc
import pytest

from sandboxd import testing

# Snapshots and staged agent code persist here between runs, as on a real
# node (a checkpoint is rebuilt only when the image or agent code changes).
STATE_DIR = os.environ.get("SANDBOXD_TEST_STATE_DIR", "/var/lib/sandboxd-test")


def skip_or_fail(why: str, *, module: bool = False) -> NoReturn:
    """Skip where this machine lacks a part; fail under CI, where scripts/setup.sh installs every part."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=module)


@functools.cache
def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


class DaemonProcess(testing.DaemonProcess):
    """A daemon with the tests' settings: shared snapshot state, no metrics port, 2 warm sandboxes."""

    def __init__(self, tmp: Path, name: str = "d", *, extra_env: dict[str, str] | None = None,
                 tcp: str = "", args: list[str] | None = None, prefix: Sequence[str] = ()) -> None:
        env = {
            "SANDBOXD_SERVER_METRICS": "",
            "SANDBOXD_SANDBOX_STATE_DIR": STATE_DIR,
            "SANDBOXD_POOL_MIN_SIZE": "2",
            # Restores are what the snapshot tests test; pool.restore = auto would
            # cold-start on an engine where restores are slower (Docker 20.10 here).
            "SANDBOXD_POOL_RESTORE": "always",
            # DaemonProcess.stop SIGKILLs a daemon still draining after 60 s, the default grace: a test that stops
            # its daemon with a call in flight gets its exit status, not the SIGKILL.
            "SANDBOXD_SERVER_GRACE_SECONDS": "10",
            **(extra_env or {}),
        }
        super().__init__(tmp, name, env=env, args=[*(args or []), *(["--tcp", tcp] if tcp else [])], prefix=prefix)


@contextlib.contextmanager
def serving_daemon(folder: Path, name: str = "d", *,
                   extra_env: dict[str, str] | None = None) -> Iterator[DaemonProcess]:
    """A daemon of the tests' settings, serving, stopped on exit; the test is skipped without a Docker engine."""
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    process = DaemonProcess(folder, name, extra_env=extra_env)
    try:
        process.wait_serving()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving_daemon(tmp_path_factory.mktemp("daemon")) as process:
        yield process


@pytest.fixture(scope="session")
def channel(daemon: DaemonProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield channel
