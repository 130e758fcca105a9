"""Fixtures that run FakeSandboxd (the daemon's test double) on real sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_daemon import FakeSandboxd, FakeServer, Script


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short path: a unix socket path must fit in 108 bytes, pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="sbd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


StartFake = Callable[..., FakeServer]


@pytest.fixture
def start_fake(socket_dir: Path) -> Iterator[StartFake]:
    """start_fake(name, script=None, tcp=False) -> a running FakeServer; all closed at teardown."""
    servers: list[FakeServer] = []

    def start(name: str = "fake", script: Script | None = None, tcp: bool = False) -> FakeServer:
        address = "127.0.0.1:0" if tcp else f"unix://{socket_dir / name}.sock"
        server = FakeServer(FakeSandboxd(name, script), address).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def fake(start_fake: StartFake) -> FakeServer:
    """One FakeSandboxd on a unix socket, answering with default verdicts."""
    return start_fake("solo")
