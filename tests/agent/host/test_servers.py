"""A resident server's answer, or why there was none (the test plays the server over real sockets)."""

from __future__ import annotations

import asyncio
import socket
import types
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from sandboxd.agent.host import judgeservers, mathservers
from sandboxd.agent.host.servers import SERVER_CPU_SECONDS, ResidentServer, ResidentWorker
from sandboxd.agent.messages import JudgeRequest, MathJob
from sandboxd.agent.protocol import HEADER, encode_frame, recv_frame_fds


async def connected_worker() -> tuple[ResidentWorker, socket.socket, socket.socket]:
    """A ResidentWorker wired to sockets whose far ends the test holds: (worker, requests, results)."""
    worker = ResidentWorker(runner=None, max_reply_bytes=1024)  # type: ignore[arg-type]
    control, requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours, results = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    control.setblocking(False)
    worker._channel = control
    worker._reader, worker._writer = await asyncio.open_unix_connection(sock=ours)
    worker.exited = asyncio.get_running_loop().create_future()
    return worker, requests, results


def server_with(worker: ResidentWorker) -> ResidentServer:
    server = ResidentServer(types.SimpleNamespace(runner=None), "math_server",  # type: ignore[arg-type]
                            recycle_after=10, max_reply_bytes=1024)
    server.worker = worker
    return server


def ask_with(behaviour: Callable[[socket.socket, socket.socket, ResidentWorker], Awaitable[None]],
             timeout: float) -> tuple[str, str]:
    outcome, message, _server = ask_server_with(behaviour, timeout)
    return outcome, message


def ask_server_with(behaviour: Callable[[socket.socket, socket.socket, ResidentWorker], Awaitable[None]],
                    timeout: float) -> tuple[str, str, ResidentServer]:
    async def scenario() -> tuple[str, str, ResidentServer]:
        worker, requests, results = await connected_worker()
        server = server_with(worker)
        asking = asyncio.ensure_future(server.ask({"op": "verify"}, timeout=timeout))
        await asyncio.sleep(0.05)
        request, _fds = await asyncio.to_thread(recv_frame_fds, requests, 4)
        assert request == {"op": "verify"}
        await behaviour(requests, results, worker)
        outcome, _result, message = await asking
        requests.close()
        results.close()
        return outcome, message, server

    return asyncio.run(scenario())


def test_an_answer() -> None:
    async def answer(_requests: socket.socket, results: socket.socket, _worker: ResidentWorker) -> None:
        results.sendall(encode_frame({"result": {"verdict": True}}))

    assert ask_with(answer, timeout=5) == ("ok", "")


def test_an_answer_from_a_worn_server_counts_and_retires_the_server() -> None:
    async def worn(_requests: socket.socket, results: socket.socket, _worker: ResidentWorker) -> None:
        results.sendall(encode_frame({"result": {"verdict": False}, "worn": True}))

    async def fresh(_requests: socket.socket, results: socket.socket, _worker: ResidentWorker) -> None:
        results.sendall(encode_frame({"result": {"verdict": False}}))

    outcome, _message, server = ask_server_with(worn, timeout=5)
    assert outcome == "ok" and server.worn and not server.usable
    outcome, _message, server = ask_server_with(fresh, timeout=5)
    assert outcome == "ok" and not server.worn


def test_a_server_takes_no_request_it_may_not_have_the_cpu_left_to_finish() -> None:
    """Its CPU rlimit covers its whole life (SERVER_CPU_SECONDS): a request that
    could run past it would be lost to SIGXCPU (STATUS_INTERNAL for an innocent job)."""
    async def nearly_spent(_requests: socket.socket, results: socket.socket, _worker: ResidentWorker) -> None:
        results.sendall(encode_frame({"result": {"verdict": True}, "cpu_seconds": SERVER_CPU_SECONDS - 5.0}))

    outcome, _message, server = ask_server_with(nearly_spent, timeout=5)
    assert outcome == "ok" and server.usable
    assert server.has_cpu_for(4.0)
    assert not server.has_cpu_for(10.0)


def test_a_new_server_has_its_whole_cpu_limit_and_a_bad_count_changes_nothing() -> None:
    async def bad_count(_requests: socket.socket, results: socket.socket, _worker: ResidentWorker) -> None:
        results.sendall(encode_frame({"result": {"verdict": True}, "cpu_seconds": "a lot"}))

    worker = ResidentWorker(runner=None, max_reply_bytes=1024)  # type: ignore[arg-type]
    assert server_with(worker).has_cpu_for(SERVER_CPU_SECONDS - 1)
    outcome, _message, server = ask_server_with(bad_count, timeout=5)
    assert outcome == "ok" and server.cpu_seconds == 0.0


def test_judges_replace_an_idle_judge_without_the_cpu_for_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """JudgeServers starts a new judge rather than hand a job to one whose
    lifetime CPU limit it could reach; the spent one is closed."""
    events: list[str] = []

    class Judge:
        def __init__(self, name: str, cpu_seconds: float) -> None:
            self.name, self.cpu_seconds, self.usable = name, cpu_seconds, True

        def has_cpu_for(self, seconds: float) -> bool:
            return self.cpu_seconds + seconds < SERVER_CPU_SECONDS

        async def start(self) -> None:
            events.append(f"start {self.name}")

        async def judge(self, *_args: object, **_kwargs: object) -> tuple[str, dict[str, Any], str]:
            events.append(f"judge {self.name}")
            return "ok", {"tests": []}, ""

        def close(self) -> None:
            events.append(f"close {self.name}")

    monkeypatch.setattr(judgeservers, "JudgeServer", lambda _controller: Judge("new", 0.0))
    judges = judgeservers.JudgeServers(host=None)  # type: ignore[arg-type]
    judges._idle = [Judge("spent", SERVER_CPU_SECONDS - 20.0), Judge("fresh", 100.0)]  # type: ignore[list-item]
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # 30 s of deadline: the last idle judge ("fresh", popped first) has room, and is used.
        assert asyncio.run(judges.judge(cast("JudgeRequest", {}), peer, -1, 30.0))[0] == "ok"
        assert events == ["judge fresh"]
        # The next job finds the spent one left: closed, and a new judge takes the job.
        events.clear()
        judges._idle = [Judge("spent", SERVER_CPU_SECONDS - 20.0)]  # type: ignore[list-item]
        assert asyncio.run(judges.judge(cast("JudgeRequest", {}), peer, -1, 30.0))[0] == "ok"
        assert events == ["close spent", "start new", "judge new"]
    finally:
        peer.close()


def test_math_servers_replace_an_idle_server_without_the_cpu_for_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    class Server:
        def __init__(self, name: str, cpu_seconds: float) -> None:
            self.name, self.cpu_seconds, self.usable, self.memory, self.jobs_done = name, cpu_seconds, True, 0, 1

        def has_cpu_for(self, seconds: float) -> bool:
            return self.cpu_seconds + seconds < SERVER_CPU_SECONDS

        async def start(self) -> None:
            events.append(f"start {self.name}")

        async def verify(self, _job: object, timeout: float) -> tuple[str, dict[str, Any], str]:
            events.append(f"verify {self.name} {timeout:g}")
            return "ok", {"status": "ok"}, ""

        def close(self) -> None:
            events.append(f"close {self.name}")

    monkeypatch.setattr(mathservers, "MathServer", lambda _controller, _memory: Server("new", 0.0))

    async def scenario() -> None:
        servers = mathservers.MathServers(host=None, servers=1)  # type: ignore[arg-type]
        servers._idle = {0: [Server("spent", SERVER_CPU_SECONDS - 5.0)]}  # type: ignore[list-item]
        servers._live = {0: 1}
        outcome, _verdict, _message = await servers.verify(cast("MathJob", {"limits": {"timeout": 10.0, "memory": 0}}))
        assert outcome == "ok"

    asyncio.run(scenario())
    assert events == ["close spent", "start new", "verify new 10"]


def test_no_answer_by_the_deadline_is_a_timeout() -> None:
    async def silent(*_: object) -> None:
        pass

    outcome, message = ask_with(silent, timeout=0.3)
    assert outcome == "timeout" and "0.3 s wall clock" in message


def test_a_malformed_answer_is_our_error_not_a_timeout_even_near_the_deadline() -> None:
    """A broken answer is told apart from a late one by what arrived, not by the clock.

    The old rule (no answer and the deadline passed: timeout) called this a
    timeout, because a malformed answer waits a second for the server's exit
    and that second runs past a short deadline.
    """
    async def garbage(_requests: socket.socket, results: socket.socket, _worker: ResidentWorker) -> None:
        results.sendall(HEADER.pack(5) + b"nope!")

    outcome, message = ask_with(garbage, timeout=0.5)
    assert outcome == "error" and "malformed or oversized" in message


def test_a_server_that_exits_without_answering() -> None:
    async def exits(_requests: socket.socket, _results: socket.socket, worker: ResidentWorker) -> None:
        assert worker.exited is not None
        worker.exited.set_result({"status": 3 << 8, "cpu_seconds": 0.0, "max_rss_bytes": 0})

    outcome, message = ask_with(exits, timeout=5)
    assert outcome == "error" and "3" in message


def test_closing_a_worker_whose_exit_was_reported_signals_no_one() -> None:
    """Red team: once the zygote reaped a worker its pid may be another process's. A session's
    interpreter killed from within, and the pid counter wrapped round, made the session's Close
    kill the interpreter of a session opened since, which had been given that pid."""
    import signal
    import subprocess
    import sys

    async def scenario() -> None:
        stand_in = types.SimpleNamespace(zygote=types.SimpleNamespace(forget=lambda pid: None))
        for reported, survives in ((True, True), (False, False)):
            holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            worker = ResidentWorker(runner=stand_in, max_reply_bytes=1024)  # type: ignore[arg-type]
            worker.pid = holder.pid  # the number the worker had, now the holder's (or still its own)
            worker.exited = asyncio.get_running_loop().create_future()
            if reported:
                worker.exited.set_result({"pid": holder.pid, "status": 0})
            worker.close()
            try:
                if survives:
                    assert holder.poll() is None
                else:
                    assert holder.wait(timeout=5) == -signal.SIGKILL
            finally:
                holder.kill()
                holder.wait()

    asyncio.run(scenario())
