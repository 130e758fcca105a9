"""The control socket's messages: each op's request (the daemon builds it) and reply (the controller builds it).

Declared once for both ends: the daemon's sandbox.py, sessions.py and
pool.py send these requests, and the controller's handlers (host/controller.py,
`Controller.ops`) return these replies, so that mypy checks each side's keys
against the same declaration. A request arrives at the agent as untrusted
JSON: the controller reads its fields with protocol.require, which checks
each one's type, rather than trusting the declaration.

What a `run` carries (the job) and answers (its result) is shaped by the job
kind (sandboxd/jobs.py builds jobs, agent/host/jobs.py runs them): here it
is a JSON object.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class FileItem(TypedDict):
    """A file of a job or session: its relative path, and its content in base64."""

    path: str
    content: str


class PingRequest(TypedDict):
    op: Literal["ping"]


class HelloRequest(TypedDict):
    """After a start or a restore: the sandbox's name and uid slot, and the limits a restored agent cannot read."""

    op: Literal["hello"]
    sandbox_id: str
    uid_slot: int
    memory_bytes: int
    pids: int
    cpus: float


class PrepareRequest(TypedDict):
    op: Literal["prepare"]


class RoomRequest(TypedDict):
    op: Literal["room"]


class RunRequest(TypedDict):
    op: Literal["run"]
    job: dict[str, Any]


class SessionOpenRequest(TypedDict):
    op: Literal["session_open"]
    language: str
    files: list[FileItem]
    limits: dict[str, Any]


class SessionCellRequest(TypedDict):
    op: Literal["session_cell"]
    session: int
    code: str
    timeout: float
    output: int
    # A final cell: the session's processes killed, the cell run in a fresh process, the session ended.
    final: NotRequired[bool]


class SessionCloseRequest(TypedDict):
    op: Literal["session_close"]
    session: int


class SessionsEndedRequest(TypedDict):
    op: Literal["sessions_ended"]
    sessions: list[int]


Request = (PingRequest | HelloRequest | PrepareRequest | RoomRequest | RunRequest | SessionOpenRequest
           | SessionCellRequest | SessionCloseRequest | SessionsEndedRequest)


class OkReply(TypedDict):
    """`ping` and `session_close`."""

    ok: bool


class HelloReply(TypedDict):
    ok: bool
    languages: list[str]
    pid: int
    landlock_abi: int


class PrepareReply(TypedDict):
    ok: bool
    # In a reward-model sandbox: the model's state (loaded, or why not).
    reward_model: NotRequired[dict[str, Any]]


class RoomReply(TypedDict):
    room: bool


class ResultReply(TypedDict):
    """`run` (the job's result) and `session_cell` (the cell's)."""

    result: dict[str, Any]


class SessionOpenReply(TypedDict):
    # The session's handle, which is also its uid.
    session: int


class SessionsEndedReply(TypedDict):
    # Handle (as text: a JSON object's key) -> why it ended.
    ended: dict[str, str]


class ErrorReply(TypedDict):
    """Any op that failed: `damaged` retires the sandbox, `full` sends the job elsewhere (SandboxFull)."""

    error: str
    damaged: NotRequired[bool]
    full: NotRequired[bool]


Reply = OkReply | HelloReply | PrepareReply | RoomReply | ResultReply | SessionOpenReply | SessionsEndedReply
