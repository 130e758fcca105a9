"""A long-lived worker's request loop (a math server, a judge): the forked side of host/servers.py.

Such a worker is forked once and answers request after request until its
channel closes; the controller replaces it (host.servers.ResidentServer)
when it fails, is late, or says it is worn.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import socket
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from sandboxd.agent.protocol import ProtocolError, send_frame

PR_SET_NAME = 15
# A server whose resident memory grew by more than this since it started is replaced after its
# answer. A hostile math answer that ends in a MemoryError, which Math-Verify's own handlers
# turn into "not equal", leaves its server holding about 500 MB of freed heap that the allocator
# keeps (585 MB under the default 512 MiB limit) for up to 500 more jobs. A few such
# servers (one per CPU, plus those started when all are busy) would fill a 2 GiB sandbox, and
# the OOM killer would then take a server in the middle of another job. Ordinary math jobs
# grow a server by about 2 MB in 300.
RECYCLE_GROWTH_BYTES = 64 << 20


@contextlib.contextmanager
def _memory_budget(extra: int) -> Iterator[None]:
    """A soft RLIMIT_AS of `extra` bytes over what this process maps now, for the block (0: none).

    Soft, so that it can be raised again after: an unprivileged process may
    raise its soft limit up to the hard one, never the hard one it lowered.
    Never above a limit already set (a math server's address space, which is
    both soft and hard).
    """
    if not extra:
        yield
        return
    before = resource.getrlimit(resource.RLIMIT_AS)
    soft = memory_bytes()[0] + extra
    if before[0] != resource.RLIM_INFINITY:
        soft = min(soft, before[0])
    resource.setrlimit(resource.RLIMIT_AS, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, before)


def serve_requests(name: bytes, receive: Callable[[], tuple[dict[str, Any], list[int]]],
                   handle: Callable[[dict[str, Any], list[int]], dict[str, Any]],
                   results: socket.socket, memory_per_request: int = 0) -> NoReturn:
    """Worker side: one answer on `results` per request `receive` returns, until the channel closes.

    What `handle` raises is answered as an error (a MemoryError flagged as
    such), after which the controller replaces this server. So is an answer
    after which this process holds RECYCLE_GROWTH_BYTES more than when it
    began: flagged ``worn``, answered, then replaced.

    With `memory_per_request`, each `handle` call may map that many bytes
    more than the server maps when the call starts; past it, allocations
    fail with MemoryError (which `handle` may answer itself) instead of
    growing the server into the memory that the sandbox's other jobs share.
    The limit is lifted again for the answer and between requests. A
    request's ``memory_budget`` raises it for that request (a judge's job
    whose memory limit admits more of the dataset's own data).
    """
    # Named, so that a look at /proc tells the server from a job's leftovers.
    ctypes.CDLL(None).prctl(PR_SET_NAME, name, 0, 0, 0)
    _, started_with = memory_bytes()
    while True:
        try:
            request, fds = receive()
        except (EOFError, OSError, ProtocolError):
            os._exit(0)
        reply: dict[str, Any]
        try:
            budget = memory_per_request and max(memory_per_request, int(request.get("memory_budget") or 0))
            with _memory_budget(budget):
                reply = handle(request, fds)
        except MemoryError:
            reply = {"error": "MemoryError", "memory": True}
        except BaseException as exc:  # our own code's failure: reported, then this server is replaced
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        if memory_bytes()[1] - started_with > RECYCLE_GROWTH_BYTES:
            reply["worn"] = True
        # What this process has used of SERVER_CPU_SECONDS, so that the controller hands it no request it may
        # not have the CPU left to finish (one times(2) call).
        used = os.times()
        reply["cpu_seconds"] = used.user + used.system
        try:
            send_frame(results, reply)
        except OSError:
            os._exit(0)


def memory_bytes() -> tuple[int, int]:
    """This process's (address space, resident memory) in bytes, from /proc/self/statm (about 12 us).

    Read with os.read, not a file object, for the same reason as worker._set_oom_score_adj.
    """
    statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        size, resident = os.read(statm, 256).split()[:2]
    finally:
        os.close(statm)
    return int(size) * resource.getpagesize(), int(resident) * resource.getpagesize()
