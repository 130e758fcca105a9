"""Frames between the controller and its workers, with descriptors riding on the header."""

from __future__ import annotations

import itertools
import os
import socket
import threading

import pytest

from sandboxd.agent.protocol import (
    HEADER,
    MAX_UID_SLOT,
    UIDS_PER_SANDBOX,
    UNSLOTTED_FIRST_UID,
    ProtocolError,
    encode_frame,
    first_job_uid,
    recv_frame_fds,
)


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


def test_uid_blocks_of_distinct_slots_do_not_overlap_and_stay_below_2_31() -> None:
    firsts = [first_job_uid(slot) for slot in (1, 2, 4242, MAX_UID_SLOT - 1)]
    assert all(b - a >= UIDS_PER_SANDBOX for a, b in itertools.pairwise(firsts))
    assert firsts[0] > UNSLOTTED_FIRST_UID + UIDS_PER_SANDBOX
    assert firsts[-1] + UIDS_PER_SANDBOX < 2**31


@pytest.mark.parametrize("slot", [0, -1, MAX_UID_SLOT, True, 1.5, "7", None])
def test_a_uid_slot_that_is_not_a_pid_is_refused(slot: object) -> None:
    with pytest.raises(ValueError, match="uid slot"):
        first_job_uid(slot)  # type: ignore[arg-type]


def test_a_frame_nested_past_the_recursion_limit_is_a_protocol_error() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        body = b"[" * 200_000 + b"]" * 200_000
        # Sent from a thread: larger than a socket buffer, it blocks until read.
        sender = threading.Thread(target=ours.sendall, args=(HEADER.pack(len(body)) + body,))
        sender.start()
        with pytest.raises(ProtocolError, match="nests too deep"):
            recv_frame_fds(theirs, 0)
        sender.join()
