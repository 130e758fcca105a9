"""Fixtures the tests of the Python harness share."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()
