"""What the daemon, the agent's controller and its workers share: constants, request checks, and the frame.

A frame is sandboxd's one (sandboxd.verifiers.framing: a 4-byte big-endian
length, then that many bytes of JSON), here with the standard JSON dialect,
descriptors riding on a header (recv_frame_fds) and an asyncio reader. Lengths
are capped so that a hostile or broken peer cannot make the reader allocate
without bound.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

from sandboxd.verifiers.framing import HEADER, ProtocolError, body_length, frame, recv_exactly

# Workers and the zygote import this module; asyncio (5 MB) stays out of them.
if TYPE_CHECKING:
    import asyncio

# The agent's `hello` reports the kernel's Landlock ABI (`landlock_abi`); from
# this one on, each run's abstract Unix sockets are scoped to it (agent/forked/worker.py).
LANDLOCK_SCOPE_ABI = 6
# A run's deadline may move on by the CPU the other runs of its sandbox
# took while it waited for one, up to this many times its timeout
# (runner.RunDeadline); a job's clock moves with its runs'. The daemon
# waits for a job as many times its budget before it gives up on the
# sandbox (scheduler), and the client's deadline allows for it.
DEADLINE_STRETCH = 3.0
# How a run's credit (those seconds so far) is kept in its file: a double.
CPU_CREDIT = struct.Struct("=d")
# 64 MiB: the largest request (a program with many big test inputs) fits,
# and nothing a job prints can make a reader allocate more.
MAX_FRAME_BYTES = 64 << 20

# Job uids. Containers share the host's user namespace, so the kernel counts
# a uid's processes (RLIMIT_NPROC), inotify instances and pipe buffers across
# every sandbox: two sandboxes handing out the same uid let a job in one make
# a fork fail in the other. So each sandbox gets a block of its own, placed
# by its slot: the host pid of its init process, which no other live
# container holds and which is below the kernel's PID_MAX_LIMIT (2**22).
# The highest uid, 100,000 + 2**22 * 500, stays below 2**31.
UIDS_PER_SANDBOX = 500
FIRST_SLOTTED_UID = 100_000
MAX_UID_SLOT = 1 << 22
# A sandbox its daemon gave no slot (an agent driven by hand) uses this block.
UNSLOTTED_FIRST_UID = 20_000

# What a worker sets its oom_score_adj to (worker.main). The OOM killer takes the process with the most
# points: what it maps, plus oom_score_adj / 1000 of the sandbox's memory. A job's processes come first,
# the resident servers (a judge, a math server) a quarter of the sandbox after them, and the agent and its
# zygote (0) half a sandbox after those: a math zygote holds sympy as its servers do, and in a sandbox at its
# limit the OOM killer must take a server, not the zygote. (With servers at 250 a CI run saw a math
# template die during its checkpoint, most likely its zygote taken.) A run the sweep saw pinning
# memory in the kernel, which no process maps, is raised to PINNING_OOM_SCORE_ADJ (usage): its processes
# then outweigh those of any run within a limit of up to a quarter of the sandbox, though they map little.
# The controller puts back a job's value when a run changed it (usage).
JOB_OOM_SCORE_ADJ = 750
PINNING_OOM_SCORE_ADJ = 1000
RESIDENT_OOM_SCORE_ADJ = 500
# Where the daemon mounts a reward model's folder, read-only (rewardpool; host/rewardmodel starts its scorer).
MODEL_MOUNT = "/opt/sandboxd-model"
# What a session cell's value shows of its repr (repl); the controller accepts that much and the note on the cut.
VALUE_PREVIEW_CHARS = 64 << 10

# The zygote's channel (SOCK_SEQPACKET) carries fixed-layout messages, not frames; see zygote._serve for why.
# controller -> zygote: (op, tag)
REQUEST = struct.Struct("<BI")
OP_FORK = 1
OP_RESEED = 2
# -> controller, from the new worker itself, its channel's other end attached (SCM_RIGHTS): (op, tag, pid)
FORKED = struct.Struct("<BIi")
OP_FORKED = 1
# -> controller, from the zygote: (op, tag of its fork, pid, wait status, CPU seconds, max RSS bytes)
EXITED = struct.Struct("<BIiidq")
OP_EXITED = 2
READY = b"\x03"
# -> controller, from the zygote: (op, tag of the fork, errno) when fork() failed: the sandbox's
# pids limit (EAGAIN), taken by its runs. The zygote lives on; so do the sandbox's other runs.
FORK_FAILED = struct.Struct("<BIi")
OP_FORK_FAILED = 4
MESSAGE_BYTES = max(FORKED.size, EXITED.size, FORK_FAILED.size, len(READY))


class BadRequest(ValueError):
    """A request the agent refuses as malformed where it checks one: a missing or mistyped field, an unknown op.

    The controller answers it as a bad request, without a traceback: it is
    the sender's fault. Any other exception while serving a request is a bug
    of ours, answered as an internal error with its traceback on stderr.
    """


_MISSING = object()


def require(
    message: dict[str, Any], key: str, kinds: type | tuple[type, ...], *, what: str = "request", default: Any = _MISSING
) -> Any:
    """`message[key]`, which must be of `kinds` (bool is no int here); BadRequest if not, or `default` if absent."""
    value = message.get(key, _MISSING)
    if value is _MISSING:
        if default is not _MISSING:
            return default
        raise BadRequest(f"{what} has no {key!r}")
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
        raise BadRequest(f"{what}.{key} is a {type(value).__name__}, not {_names(kinds)}")
    return value


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds: type | tuple[type, ...]) -> str:
    return " or ".join(kind.__name__ for kind in _as_tuple(kinds))


def first_job_uid(slot: int) -> int:
    """The first uid of the block that `slot` (a container's host pid) places; BadRequest for anything else."""
    if not isinstance(slot, int) or isinstance(slot, bool) or not 0 < slot < MAX_UID_SLOT:
        raise BadRequest(f"uid slot {slot!r} is not a pid in [1, {MAX_UID_SLOT})")
    return FIRST_SLOTTED_UID + slot * UIDS_PER_SANDBOX


def encode_frame(message: Any) -> bytes:
    return frame(json.dumps(message, separators=(",", ":")).encode(), MAX_FRAME_BYTES)


def _decode_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    except RecursionError:
        # "[" * 200,000, which a session cell can write to its results socket: the
        # RecursionError would take the controller's connection down with every session.
        raise ProtocolError("frame nests too deep") from None


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """Read one frame; raises EOFError on a clean end of stream."""
    try:
        header = await reader.readexactly(HEADER.size)
    except EOFError as exc:  # asyncio.IncompleteReadError
        if not getattr(exc, "partial", b""):
            raise EOFError from None
        raise ProtocolError("truncated frame header") from None
    length = body_length(header, max_bytes)
    try:
        body = await reader.readexactly(length)
    except EOFError:  # asyncio.IncompleteReadError
        raise ProtocolError("truncated frame body") from None
    return _decode_body(body)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """Blocking twin of read_frame for worker processes."""
    return _decode_body(recv_exactly(sock, body_length(recv_exactly(sock, HEADER.size), max_bytes)))


def recv_frame_fds(sock: socket.socket, max_fds: int, max_bytes: int = MAX_FRAME_BYTES) -> tuple[Any, list[int]]:
    """Blocking: one frame whose descriptors ride on its 4-byte header (SCM_RIGHTS), then the body as stream data.

    The sender passes the descriptors with the header alone (socket.send_fds
    of frame[:HEADER.size]) and sends the rest with sendall. Raises EOFError
    when the peer closed the channel before a frame began.
    """
    header, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, max_fds)
    try:
        if not header:
            raise EOFError
        if len(header) < HEADER.size:
            header += recv_exactly(sock, HEADER.size - len(header))
        return _decode_body(recv_exactly(sock, body_length(header, max_bytes))), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def send_frame(sock: socket.socket, message: Any) -> None:
    sock.sendall(encode_frame(message))
