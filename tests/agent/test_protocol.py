"""Frames between the controller and its workers, with descriptors riding on the header."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from sandboxd.agent.protocol import HEADER, ProtocolError, encode_frame, recv_frame_fds


def send_with_fds(sock: socket.socket, message: object, fds: list[int]) -> None:
    frame = encode_frame(message)
    socket.send_fds(sock, [frame[:HEADER.size]], fds)
    sock.sendall(frame[HEADER.size:])


def test_a_frame_and_its_descriptors_arrive_together() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    try:
        # A body larger than a socket buffer arrives whole, in order (sent from a thread: it blocks until read).
        sender = threading.Thread(target=send_with_fds, args=(ours, {"mode": "python", "code": "x" * 300_000},
                                                               [write_end]))
        sender.start()
        message, fds = recv_frame_fds(theirs, 4)
        sender.join()
        assert message == {"mode": "python", "code": "x" * 300_000}
        assert len(fds) == 1
        os.write(fds[0], b"through the passed descriptor")
        os.close(fds[0])
        assert os.read(read_end, 100) == b"through the passed descriptor"
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        ours.close()
        theirs.close()


def test_end_of_file_before_a_frame() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.close()
    with pytest.raises(EOFError):
        recv_frame_fds(theirs, 4)
    theirs.close()


def test_an_oversized_frame_is_refused_and_its_descriptors_closed() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    try:
        socket.send_fds(ours, [HEADER.pack(1 << 20)], [write_end])
        os.close(write_end)
        with pytest.raises(ProtocolError, match="exceeds"):
            recv_frame_fds(theirs, 4, max_bytes=1024)
        # The received copy of the write end was closed: the pipe reads end of file.
        assert os.read(read_end, 10) == b""
    finally:
        os.close(read_end)
        ours.close()
        theirs.close()
