"""The daemon's own logic, without an engine: the periodic orphan sweep."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from sandboxd.daemon import Daemon
from tests.test_pool import one_slot_pool


def test_the_orphan_sweep_removes_only_old_containers_no_pool_knows() -> None:
    """Ours (the engine watch lists only the instance's containers), but in no pool: a crash between create and
    ready left it. Young ones may still be starting, and a snapshot template is the snapshot store's."""
    pool, sandbox = one_slot_pool()
    removed: list[str] = []
    daemon = object.__new__(Daemon)  # no engine: only what the sweep reads
    daemon.pools = {"python": pool}
    daemon.backend = types.SimpleNamespace(remove=removed.append)  # type: ignore[assignment]
    hour_ago, now = time.time() - 3600, time.time()
    containers = [
        {"Id": sandbox.container_id, "Created": hour_ago, "Names": ["/sandboxd-i-python-1"]},
        {"Id": "orphan", "Created": hour_ago, "Names": ["/sandboxd-i-python-2"]},
        {"Id": "starting", "Created": now - 10, "Names": ["/sandboxd-i-python-3"]},
        {"Id": "snapshot", "Created": hour_ago, "Names": ["/sandboxd-i-python-template"]},
    ]
    asyncio.run(daemon._sweep_orphans(containers))
    assert removed == ["orphan"]


def test_an_orphan_sweep_that_fails_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    daemon = object.__new__(Daemon)
    daemon.pools = {}

    def refuse(container_id: str) -> None:
        raise RuntimeError("engine gone")

    daemon.backend = types.SimpleNamespace(remove=refuse)  # type: ignore[assignment]
    asyncio.run(daemon._sweep_orphans([{"Id": "x", "Created": 0, "Names": ["/sandboxd-i-python-1"]}]))
    assert "orphan sweep failed" in caplog.text
