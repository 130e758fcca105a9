"""A resident server's request loop (forked.serving), run in a forked process over real sockets."""

from __future__ import annotations

import os
import socket
from typing import Any

from sandboxd.agent.forked.serving import RECYCLE_GROWTH_BYTES, serve_requests
from sandboxd.agent.protocol import recv_frame, send_frame


def test_a_server_that_grew_says_so_with_its_answer() -> None:
    """serve_requests in a forked process: an answer after which the process holds more than
    RECYCLE_GROWTH_BYTES over what it began with is flagged worn; one before is not."""
    requests, theirs_requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    results, theirs_results = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        requests.close()  # or the server never reads the end of its channel
        results.close()
        kept: list[bytes] = []

        def handle(request: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
            kept.append(b"x" * request["grow"])  # written, so resident
            return {"result": {"held": len(kept)}}

        try:
            serve_requests(b"test-server", lambda: (recv_frame(theirs_requests), []), handle, theirs_results)
        finally:
            os._exit(1)
    theirs_requests.close()
    theirs_results.close()
    try:
        send_frame(requests, {"grow": 1 << 20})
        first = recv_frame(results)
        first_cpu = first.pop("cpu_seconds")
        assert first_cpu >= 0 and first == {"result": {"held": 1}}
        send_frame(requests, {"grow": RECYCLE_GROWTH_BYTES + (16 << 20)})
        second = recv_frame(results)
        # Writing the second request's 80 MiB took CPU: the count covers the server's life so far.
        assert second.pop("cpu_seconds") > first_cpu and second == {"result": {"held": 2}, "worn": True}
    finally:
        requests.close()
        results.close()
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the server ends when its channel closes"


def _address_space_limit(pid: int) -> str:
    """The soft RLIMIT_AS of process `pid`, as /proc shows it ("unlimited" or bytes)."""
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max address space"))
    return line.split()[3]


def test_a_request_past_its_memory_budget_is_answered_and_the_next_is_served() -> None:
    """serve_requests(memory_per_request=) in a forked process: a request that maps more than its budget gets a
    MemoryError, answered as one, and the server goes on; the budget holds during each request only."""
    budget = 64 << 20
    outside = _address_space_limit(os.getpid())  # the forked server's between requests
    requests, theirs_requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    results, theirs_results = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        requests.close()
        results.close()

        def handle(request: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
            held = bytearray(request["map"])
            return {"result": {"mapped": len(held), "limit": _address_space_limit(os.getpid())}}

        try:
            serve_requests(b"test-server", lambda: (recv_frame(theirs_requests), []), handle, theirs_results,
                           memory_per_request=budget)
        finally:
            os._exit(1)
    theirs_requests.close()
    theirs_results.close()
    try:
        send_frame(requests, {"map": budget + (16 << 20)})
        over = recv_frame(results)
        assert over["error"] == "MemoryError" and over["memory"] is True, over
        assert _address_space_limit(pid) == outside, "lifted between requests"
        send_frame(requests, {"map": budget - (16 << 20)})
        within = recv_frame(results)["result"]
        assert within["mapped"] == budget - (16 << 20) and within["limit"] != outside, within
        assert _address_space_limit(pid) == outside
    finally:
        requests.close()
        results.close()
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the server ends when its channel closes"
