"""Fixtures that run FakeSandboxd (the daemon's test double) on real sockets, and the sync/async ``Twin``."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from fake_daemon import FakeSandboxd, FakeServer, Script
from sandboxd_client import AsyncSandboxClient, Result, RetryPolicy, SandboxClient
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

#: Quick retries, so that tests that exhaust them stay fast.
FAST = RetryPolicy(max_retries=3, initial_backoff=0.01, max_backoff=0.05)


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


class Twin:
    """Runs a scenario with the sync or the async client, same arguments, same answers.

    ``client`` holds the client's options (``retry_policy`` defaults to FAST);
    other keyword arguments go to the method called.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def call(
        self, address: Any, method: str, *args: Any, client: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """``client.method(*args, **kwargs)`` on a fresh client of this kind."""
        options = {"retry_policy": FAST, **(client or {})}
        if self.kind == "sync":
            with SandboxClient(address, **options) as c:
                return getattr(c, method)(*args, **kwargs)

        async def go() -> Any:
            async with AsyncSandboxClient(address, **options) as c:
                return await getattr(c, method)(*args, **kwargs)

        return asyncio.run(go())

    def stream(
        self,
        address: Any,
        jobs: list[pb.Job],
        on_result: Callable[[int], None] = lambda n: None,
        *,
        client: Mapping[str, Any] | None = None,
    ) -> list[Result]:
        """run_batch, calling on_result(count so far) after each result."""
        options = {"retry_policy": FAST, **(client or {})}
        out: list[Result] = []
        if self.kind == "sync":
            with SandboxClient(address, **options) as c:
                for result in c.run_batch(jobs):
                    out.append(result)
                    on_result(len(out))
            return out

        async def go() -> None:
            async with AsyncSandboxClient(address, **options) as c:
                async for result in c.run_batch(jobs):
                    out.append(result)
                    await asyncio.to_thread(on_result, len(out))

        asyncio.run(go())
        return out


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> Twin:
    """Each test using it runs once with SandboxClient and once with AsyncSandboxClient."""
    return Twin(request.param)
