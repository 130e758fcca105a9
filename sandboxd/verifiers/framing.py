"""The frame every socket of sandboxd carries: a 4-byte big-endian length, then that many bytes of JSON.

One format for all of them: the daemon and a sandbox's agent, the agent and
its workers and resident servers (sandboxd.agent.protocol: fds on the
header, asyncio readers), and a candidate and its judge
(sandboxd.verifiers.python.wire: deadlines, strict ASCII JSON). Each of
those keeps its own JSON dialect; the length, its cap and the reading of
exactly one frame's bytes are here. Stdlib only: it runs in the sandbox
images too.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

# Bound once: a test may patch time.monotonic in the program's process, whose frames this module reads.
_monotonic = time.monotonic

HEADER = struct.Struct(">I")

# A moment of time.monotonic(), or a function that answers the moment as it stands when asked (a deadline that
# moves), or none.
Deadline = float | Callable[[], float] | None


class ProtocolError(Exception):
    """A malformed frame, or a frame that breaks the request/reply protocol."""


class FrameTooLarge(ProtocolError):
    """A frame longer than the size cap."""


def too_large(size: int, max_bytes: int) -> FrameTooLarge:
    return FrameTooLarge(f"frame of {size} bytes exceeds the limit of {max_bytes}")


def frame(body: bytes, max_bytes: int) -> bytes:
    """``body`` framed; FrameTooLarge (before anything is sent) when it is longer than ``max_bytes``."""
    if len(body) > max_bytes:
        raise too_large(len(body), max_bytes)
    return HEADER.pack(len(body)) + body


def body_length(header: bytes, max_bytes: int) -> int:
    """The length a frame's header announces; FrameTooLarge past ``max_bytes`` (nothing of the body is read)."""
    (size,) = HEADER.unpack(header)
    if size > max_bytes:
        raise too_large(size, max_bytes)
    return int(size)


def recv_exactly(sock: socket.socket, size: int, deadline: Deadline = None) -> bytes:
    """Exactly ``size`` bytes from a blocking socket, read into one buffer.

    With a ``deadline``, the socket's timeout is set before each read, and a
    deadline that moves is asked again when a read times out. Raises
    ``EOFError`` when the peer closed, ``TimeoutError`` past the deadline.
    """
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        if deadline is not None:
            remaining = (deadline() if callable(deadline) else deadline) - _monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete frame before the deadline")
            sock.settimeout(remaining)
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            if callable(deadline):
                continue  # asked again: it may have moved meanwhile
            raise
        if n == 0:
            raise EOFError("connection closed" if got == 0 else "connection closed in the middle of a frame")
        got += n
    return bytes(buffer)
