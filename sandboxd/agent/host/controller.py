"""The controller: PID 1 of a sandbox, the daemon's peer on the control socket.

Requests are frames (see protocol.py) on a Unix socket in a folder the
daemon bind-mounts from the host; only root in the sandbox can reach it
(folder 0700), so jobs, which run under other uids, cannot talk to it.

Ops: `hello` (after a start or a restore: reseed, learn the sandbox's id and
its uid slot),
`prepare` (start the warm math servers; the reward model's state), `ping`, `run` (one job: execute,
code or math), and `session_open`,
`session_cell`, `session_close`, `sessions_ended` (see sessions.py): the
table `Controller.ops`. The job kinds are jobs.py's; what they, the
sessions and the resident servers need of the sandbox (uids, work dirs,
environment, limits) is the JobHost (jobhost.py); /tmp accounting is
tmpspace.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import stat
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandboxd.agent.host import sessions as sessions_module
from sandboxd.agent.host.errors import JobWithdrawn, SandboxDamaged
from sandboxd.agent.host.jobhost import SHARED_WRITABLE, WORK_ROOT, JobHost
from sandboxd.agent.host.jobs import Jobs, decode_files
from sandboxd.agent.host.judgeservers import JudgeServers
from sandboxd.agent.host.mathservers import MathServers
from sandboxd.agent.host.rewardmodel import RewardModelHost
from sandboxd.agent.host.runner import CURRENT_JOB, JobWithdrawal
from sandboxd.agent.host.tmpspace import has_room
from sandboxd.agent.host.zygoteclient import Zygote
from sandboxd.agent.landlock import landlock_abi
from sandboxd.agent.messages import (
    ErrorReply,
    HelloReply,
    OkReply,
    PrepareReply,
    Reply,
    ResultReply,
    RoomReply,
    RunReply,
    SandboxFull,
    SessionOpenReply,
    SessionsEndedReply,
)
from sandboxd.agent.protocol import (
    HEADER,
    MAX_FRAME_BYTES,
    BadRequest,
    ProtocolError,
    encode_frame,
    first_job_uid,
    read_frame,
    require,
)

PR_SET_CHILD_SUBREAPER = 36
# The image's sticky folders, which --private-tmp makes root-only. They are
# on the root file system, which a restored container has writable (the
# engine's restore does not remount it read-only): left 1777 there, a run
# could write to the host's disk (the container's upper layer) past every
# tmpfs cap. So they are locked again at every hello.
STICKY_ROOT_FOLDERS = ("/var/tmp", "/run/lock")
# An error reply's message is cut here.
MAX_ERROR_CHARS = 2000


@dataclass
class MathSettings:
    servers: int = 1
    prestart_memory: int = 0  # the memory limit `prepare` starts and warms servers for


def lock_sticky_folders() -> None:
    """Make STICKY_ROOT_FOLDERS root-only (0755) where the root file system lets us."""
    for folder in STICKY_ROOT_FOLDERS:
        with contextlib.suppress(OSError):  # read-only (a cold start), or not in this image
            os.chmod(folder, 0o755)


class Controller:
    def __init__(self, zygote: Zygote, languages: list[str], math: MathSettings | None = None, *,
                 private_tmp: bool = False) -> None:
        self.zygote = zygote
        self.private_tmp = private_tmp
        self.host = JobHost(zygote)
        self.languages = languages
        self.sandbox_id = ""
        # The sandbox's pids limit and CPUs, from the daemon's hello; 0: unknown.
        self.sandbox_pids = 0
        self.sandbox_cpus = 0.0
        self.math = math or MathSettings()
        # The job kinds, with the resident servers they keep; `jobs.reward_model` is set in a reward-model sandbox.
        self.jobs = Jobs(self.host, JudgeServers(self.host), MathServers(self.host, self.math.servers))
        # Open sessions by uid, which is also the handle the daemon holds.
        self.sessions: dict[int, sessions_module.Session] = {}
        self.ops: dict[str, Callable[[dict[str, Any]], Awaitable[Reply]]] = {
            "ping": self._ping,
            "hello": self._hello,
            "prepare": self._prepare,
            "room": self._room,
            "run": self._run,
            "session_open": self._session_open,
            "session_cell": self._session_cell,
            "session_close": self._session_close,
            "sessions_ended": self._sessions_ended,
        }

    # ---- the control socket ----------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection, request after request, until the daemon closes it.

        Only a broken stream (end of file, a malformed frame, a reset) ends
        it. Whatever serving one request raises is that request's error
        reply (see `answer`): the daemon reads a dropped connection as a
        lost sandbox, and retires it with every job and session it holds.
        The daemon withdraws a job by closing its side of the connection
        while it runs (`answer_job`); the reply still goes out.
        """
        try:
            while True:
                try:
                    request = await read_frame(reader)
                except (EOFError, ProtocolError, ConnectionError):
                    return
                stream_broken = False
                if isinstance(request, dict) and request.get("op") == "run":
                    reply, stream_broken = await self.answer_job(request, reader)
                else:
                    reply = await self.answer(request)
                writer.write(encode_reply(reply))
                await writer.drain()
                if reply.get("damaged"):
                    os._exit(71)
                if stream_broken:
                    return
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def answer_job(self, request: dict[str, Any],
                         reader: asyncio.StreamReader) -> tuple[Reply | ErrorReply, bool]:
        """`answer(request)` for a job, which the daemon withdraws by an end of file on `reader` meanwhile.

        The daemon sends nothing else while it waits for a reply, so the
        only thing a read can return before the reply is that end of file
        (its caller gave up: a client deadline, a cancelled batch). The
        job's runs are then killed and no other starts (JobWithdrawal), and the
        reply comes within milliseconds: the daemon holds the job's slot
        until it does. Anything else read there is a broken stream: the job
        is withdrawn too, and the connection ends after the reply: returns
        (reply, whether the stream is broken).
        """
        job = JobWithdrawal()
        token = CURRENT_JOB.set(job)
        try:
            answering = asyncio.ensure_future(self.answer(request))  # copies the context, and `job` with it
        finally:
            CURRENT_JOB.reset(token)
        hangup = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait((answering, hangup), return_when=asyncio.FIRST_COMPLETED)
            if not answering.done():
                try:
                    job.withdraw()
                except SandboxDamaged as exc:
                    self.host.damaged(f"withdrawing a job failed ({exc})")
        finally:
            if not hangup.done():
                hangup.cancel()
                # Its wait on the reader must end before the next frame's read starts.
                await asyncio.wait((hangup,))
        # Bytes mid-request (one of them now read) or a reset: no frame can be read from here on.
        broken = hangup.done() and not hangup.cancelled() and (hangup.exception() is not None or hangup.result() != b"")
        return await answering, broken

    async def answer(self, request: Any) -> Reply | ErrorReply:
        """The reply to one request, errors included: nothing but cancellation escapes."""
        try:
            if not isinstance(request, dict):
                raise BadRequest(f"a request is a JSON object, not {type(request).__name__}")
            return await self._dispatch(request)
        except SandboxDamaged as exc:
            return {"error": str(exc), "damaged": True}
        except SandboxFull as exc:
            # Not the job's doing: the daemon runs it elsewhere, and gives this sandbox no job until `room`.
            return {"error": str(exc), "full": True}
        except JobWithdrawn as exc:
            return {"error": str(exc)}
        except BadRequest as exc:
            # The daemon's request, refused on purpose where it is checked: nothing of ours to trace.
            return {"error": f"bad request: {exc}"[:MAX_ERROR_CHARS]}
        except Exception as exc:
            # A bug of ours that one request hit: that request fails, the others go on.
            op = request.get("op") if isinstance(request, dict) else None
            print(f"sandboxd-agent: internal error serving {op!r}:", file=sys.stderr, flush=True)
            traceback.print_exc()
            sys.stderr.flush()
            return {"error": f"internal error in the agent: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]}

    async def _dispatch(self, request: dict[str, Any]) -> Reply:
        op = request.get("op")
        handler = self.ops.get(op) if isinstance(op, str) else None
        if handler is None:
            raise BadRequest(f"unknown op {op!r}")
        return await handler(request)

    async def _ping(self, request: dict[str, Any]) -> OkReply:
        return {"ok": True}

    async def _hello(self, request: dict[str, Any]) -> HelloReply:
        self.sandbox_id = require(request, "sandbox_id", str, default="")
        # The daemon's word: a sandbox restored from a snapshot sees another cgroup than its own (usage.VMSTAT).
        self.host.runner.sandbox_bytes = require(request, "memory_bytes", int, default=0) or None
        self.sandbox_pids = require(request, "pids", int, default=0)
        self.sandbox_cpus = float(require(request, "cpus", (int, float), default=0.0))
        # What its runs can have at once: what waiting behind themselves earns them nothing up to (usage.CpuShare).
        self.host.runner.usage.cpus = self.sandbox_cpus or 1.0
        if "uid_slot" in request:
            self.host.uids.place(first_job_uid(request["uid_slot"]))
        if self.private_tmp:
            lock_sticky_folders()
        # Only these need scrubbing after a run; the others are locked
        # (--private-tmp) or read-only. Checked again after every restore,
        # whose root file system may be writable where the template's was not.
        self.host.shared_writable = [folder for folder in SHARED_WRITABLE if _writable_by_all(folder)]
        random.seed()
        self.zygote.reseed()
        self.zygote.drop_spares()
        return {"ok": True, "languages": self.languages, "pid": os.getpid(), "landlock_abi": landlock_abi()}

    async def _prepare(self, request: dict[str, Any]) -> PrepareReply:
        # After hello, before the pool hands the sandbox jobs (and never
        # in a snapshot's template): what cannot be snapshotted starts
        # here, and the pool learns the reward model's state.
        if self.math.prestart_memory:
            await self.jobs.math_servers.prestart(self.math.prestart_memory)
        reply: PrepareReply = {"ok": True}
        if self.jobs.reward_model is not None:
            reply["reward_model"] = self.jobs.reward_model.status()
        return reply

    async def _room(self, request: dict[str, Any]) -> RoomReply:
        return {"room": has_room(self.host.work_root, self.host.runner.sandbox_bytes or 0, self.sandbox_pids,
                                 self.sandbox_cpus)}

    async def _run(self, request: dict[str, Any]) -> RunReply:
        return {"result": await self.jobs.run(require(request, "job", dict))}

    async def _session_open(self, request: dict[str, Any]) -> SessionOpenReply:
        files = decode_files(require(request, "files", list, default=[]), "files")
        opened = await sessions_module.open_session(self.host, require(request, "language", str), files,
                                                    require(request, "limits", dict))
        self.sessions[opened.uid] = opened
        return {"session": opened.uid}

    async def _session_cell(self, request: dict[str, Any]) -> ResultReply:
        session = self.sessions.get(require(request, "session", int))
        if session is None:
            return {"result": {"status": "gone", "message": "no such session", "alive": False}}
        try:
            result = await session.run_cell(require(request, "code", str),
                                            float(require(request, "timeout", (int, float))),
                                            require(request, "output", int),
                                            final=require(request, "final", bool, default=False))
        except Exception:
            # The daemon ends a session whose cell got no result without
            # telling us (it counts it dead): end it here too.
            self.close_session(session.uid)
            raise
        if not session.alive:
            releasing = self.close_session(session.uid)
            if session.over_files_share and releasing is not None:
                # Its files go before the answer: a neighbour's cell that follows it finds its room.
                await asyncio.shield(releasing)
        return {"result": result}

    async def _session_close(self, request: dict[str, Any]) -> OkReply:
        self.close_session(require(request, "session", int))
        return {"ok": True}

    async def _sessions_ended(self, request: dict[str, Any]) -> SessionsEndedReply:
        # The daemon's look, every few seconds, for the sessions of `sessions` that ended on their own.
        ended: dict[str, str] = {}
        for handle in require(request, "sessions", list):
            session = self.sessions.get(handle) if isinstance(handle, int) else None
            why = "the sandbox no longer holds it" if session is None else session.ended_between_cells()
            if why:
                ended[str(handle)] = why
        return {"ended": ended}

    def close_session(self, uid: int) -> asyncio.Future[None] | None:
        """End a session: its interpreter killed now, its uid swept and its files removed in the background
        (the returned release, None for no session).

        A session's folder can hold as many entries as the tmpfs allows; its
        removal held the Close (3 million links: more than 10 s) and with it
        every other session of the sandbox.
        """
        session = self.sessions.pop(uid, None)
        if session is None:
            return None
        session.close()
        return self.host.release_later(uid)


def encode_reply(reply: Mapping[str, Any]) -> bytes:
    """`reply` as a frame the daemon can turn into protobuf strings, which must be valid UTF-8.

    A lone surrogate (from a file name that is not UTF-8, or a message a
    job made) passes JSON, but the daemon's protobuf refused it and the
    call failed with UNKNOWN. Such strings are sent with each surrogate
    written out as its escape (\\udcff). A reply that cannot be a frame
    at all (too large) is answered as an internal error.
    """
    try:
        body = json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        body = json.dumps(_valid_text(reply), ensure_ascii=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return _error_frame(reply, exc)
    if len(body) > MAX_FRAME_BYTES:
        return _error_frame(reply, ProtocolError(f"reply of {len(body)} bytes exceeds {MAX_FRAME_BYTES}"))
    return HEADER.pack(len(body)) + body


def _error_frame(reply: Mapping[str, Any], exc: BaseException) -> bytes:
    print(f"sandboxd-agent: a reply could not be sent: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    error: ErrorReply = {"error": f"internal error in the agent: its reply could not be sent: "
                                  f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]}
    if reply.get("damaged"):
        error["damaged"] = True
    return encode_frame(_valid_text(error))


def _valid_text(value: Any) -> Any:
    """`value` with every string made valid UTF-8 (lone surrogates escaped)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_valid_text(key): _valid_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_text(item) for item in value]
    return value


def _writable_by_all(folder: str) -> bool:
    try:
        return bool(os.stat(folder).st_mode & stat.S_IWOTH) and not os.statvfs(folder).f_flag & os.ST_RDONLY
    except OSError:
        return False


def available_languages(toolchains: dict[str, str]) -> list[str]:
    return sorted(lang for lang, binary in toolchains.items() if shutil.which(binary))


async def serve(socket_path: str, zygote_process: tuple[socket.socket, int], toolchains: dict[str, str],
                reward_model: dict[str, Any] | None = None, math: MathSettings | None = None, *,
                private_tmp: bool = False) -> None:
    """Run the agent until SIGTERM.

    zygote_process: the zygote's channel and pid, from zygote.spawn (which the
    entry point calls before it imports this module). private_tmp: jobs get
    no shared place on disk to leave files (/tmp and the image's sticky folders root-only).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if private_tmp:
        # Docker 20.10 ignores mode= in --tmpfs options and mounts 1777. (The
        # sticky folders on the root file system are locked at hello, the only
        # time they can be: a cold start's root is read-only.)
        os.chmod("/tmp", 0o755)
    os.makedirs(WORK_ROOT, mode=0o711, exist_ok=True)
    os.chmod(WORK_ROOT, 0o711)
    zygote = Zygote(*zygote_process)
    controller = Controller(zygote, available_languages(toolchains), math, private_tmp=private_tmp)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGCHLD, controller.host.reap)
    await zygote.ready
    if reward_model is not None:
        # Loaded before the socket exists: the sandbox is ready (and snapshotted) with its model.
        controller.jobs.reward_model = RewardModelHost(reward_model)
        await controller.jobs.reward_model.start()
    folder = os.path.dirname(socket_path)
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = await asyncio.start_unix_server(controller.handle, path=socket_path)
    os.chmod(socket_path, 0o600)
    print(f"sandboxd-agent: ready on {socket_path}", flush=True)
    stop: asyncio.Future[None] = loop.create_future()

    def on_sigterm() -> None:
        if not stop.done():
            stop.set_result(None)

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    async with server:
        await stop
