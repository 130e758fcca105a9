"""sandboxd.verifiers.framing: the one frame format of every socket, and its two dialects' use of it."""

from __future__ import annotations

import socket
import time

import pytest

from sandboxd.agent import protocol
from sandboxd.verifiers import framing
from sandboxd.verifiers.python import wire


def test_one_frame_format_and_one_error_for_the_agent_and_the_harness() -> None:
    assert protocol.HEADER is wire.HEADER is framing.HEADER
    assert protocol.ProtocolError is wire.ProtocolError is framing.ProtocolError
    assert issubclass(wire.FrameTooLarge, protocol.ProtocolError)
    message = {"op": "run", "job": {"kind": "code", "n": [1, 2.5, "x"]}}
    ours, theirs = socket.socketpair()
    with ours, theirs:
        protocol.send_frame(ours, message)
        assert wire.recv_frame(theirs) == message
        wire.send_frame(ours, message)
        assert protocol.recv_frame(theirs) == message


def test_a_frame_over_the_cap_is_refused_before_it_is_sent_or_read() -> None:
    with pytest.raises(framing.FrameTooLarge, match="exceeds the limit of 4"):
        framing.frame(b"12345", 4)
    assert framing.frame(b"1234", 4) == b"\x00\x00\x00\x041234"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(framing.HEADER.pack(1 << 30))  # nothing after it: a reader that waited for the body would hang
        with pytest.raises(framing.FrameTooLarge):
            protocol.recv_frame(theirs)
        ours.sendall(framing.HEADER.pack(1 << 30))
        with pytest.raises(framing.FrameTooLarge):
            wire.recv_frame(theirs, max_bytes=1 << 20)


def test_reading_exactly_ends_at_the_peers_close_and_at_the_deadline() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(b"ab")
        ours.shutdown(socket.SHUT_WR)
        with pytest.raises(EOFError, match="in the middle"):
            framing.recv_exactly(theirs, 3)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        with pytest.raises(TimeoutError):
            framing.recv_exactly(theirs, 1, time.monotonic() + 0.05)
        asked = []

        def moving() -> float:
            # A deadline that moves once: asked again when the first read times out, it is over.
            asked.append(1)
            return time.monotonic() + (0.05 if len(asked) == 1 else -1.0)

        with pytest.raises(TimeoutError):
            framing.recv_exactly(theirs, 1, moving)
        assert len(asked) == 2
