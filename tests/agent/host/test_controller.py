"""The controller's bookkeeping (its block of job uids) and its control socket, with no sandbox around it."""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import signal
import socket
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from sandboxd.agent import messages
from sandboxd.agent.host import cleanup, errors, jobhost, jobs, runner, tmpspace, usage
from sandboxd.agent.host import controller as controller_module
from sandboxd.agent.host.errors import SandboxDamaged
from sandboxd.agent.host.jobhost import UidPool
from sandboxd.agent.messages import JobLimits, Program, Reply
from sandboxd.agent.protocol import (
    HEADER,
    MAX_FRAME_BYTES,
    UIDS_PER_SANDBOX,
    UNSLOTTED_FIRST_UID,
    encode_frame,
    first_job_uid,
    read_frame,
)


def test_uids_come_from_the_placed_block_lowest_first_and_reused_last() -> None:
    uids = UidPool()
    uids.place(first_job_uid(31337))
    first = first_job_uid(31337)
    taken = [uids.take() for _ in range(3)]
    assert taken == [first, first + 1, first + 2]
    uids.give_back(first)
    assert [uids.take() for _ in range(UIDS_PER_SANDBOX - 2)][-1] == first  # after the 497 never taken


def test_the_block_runs_out_rather_than_spilling_into_another_sandboxes() -> None:
    uids = UidPool(first_job_uid(7))
    for _ in range(UIDS_PER_SANDBOX):
        assert first_job_uid(7) <= uids.take() < first_job_uid(8)
    with pytest.raises(SandboxDamaged, match="no free job uid"):
        uids.take()


def test_the_block_moves_only_while_no_uid_is_taken() -> None:
    uids = UidPool()
    assert uids.take() == UNSLOTTED_FIRST_UID
    uids.place(UNSLOTTED_FIRST_UID)  # the same block again (a repeated hello): nothing to move
    with pytest.raises(SandboxDamaged, match="while 1 are taken"):
        uids.place(first_job_uid(99))
    uids.give_back(UNSLOTTED_FIRST_UID)
    uids.place(first_job_uid(99))
    assert uids.take() == first_job_uid(99)


# ---- the control socket and releases, against a controller with no zygote -------------------------------------------

TEST_FIRST_UID = 28_000  # a block no agent on a test machine uses (test_runner takes 29,998 and 29,999)
_serving: set[asyncio.Future[None]] = set()  # the controller's ends of the tests' connections


def bare_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> controller_module.Controller:
    """A Controller whose work dirs and shared folder are under tmp_path; it forks nothing."""
    (tmp_path / "work").mkdir()
    (tmp_path / "shm").mkdir()
    zygote = types.SimpleNamespace(pid=-1)
    controller = controller_module.Controller(zygote, ["python"])  # type: ignore[arg-type]
    controller.host.work_root = str(tmp_path / "work")
    controller.host.uids = UidPool(TEST_FIRST_UID)
    controller.host.shared_writable = [str(tmp_path / "shm")]
    return controller


async def connect(controller: controller_module.Controller) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to controller.handle, as the daemon has one."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server_reader, server_writer = await asyncio.open_unix_connection(sock=theirs)
    task = asyncio.ensure_future(controller.handle(server_reader, server_writer))
    _serving.add(task)
    task.add_done_callback(_serving.discard)
    return await asyncio.open_unix_connection(sock=ours)


async def ask(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: Any) -> Any:
    reader, writer = connection
    writer.write(encode_frame(request))
    await writer.drain()
    return await asyncio.wait_for(read_frame(reader), 10)


class FakeSession:
    def __init__(self, uid: int, cell: Any = None) -> None:
        self.uid = uid
        self.alive = True
        self._cell = cell

    async def run_cell(self, code: str, timeout: float, output: int) -> dict[str, Any]:
        return await self._cell()

    def close(self) -> None:
        self.alive = False


def test_a_sessions_files_are_removed_while_the_agent_serves_other_requests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session left 3 million hard links: removing them on the event loop held its Close for more than 10 s,
    and every other session of the sandbox was lost. The removal here waits until a ping on another
    connection has been answered: on the loop, that ping could not be."""
    controller = bare_controller(tmp_path, monkeypatch)
    removal_started, ping_answered = threading.Event(), threading.Event()
    during: list[Any] = []
    real_remove_tree = cleanup.remove_tree

    def slow_remove_tree(path: str) -> None:
        if path.endswith(f"/{uid}"):
            removal_started.set()
            during.append(ping_answered.wait(10))
            during.append(uid in controller.host.uids._free)
        real_remove_tree(path)

    monkeypatch.setattr(jobhost, "remove_tree", slow_remove_tree)

    async def scenario() -> None:
        closer, other = await connect(controller), await connect(controller)
        closing = asyncio.ensure_future(ask(closer, {"op": "session_close", "session": uid}))
        assert await asyncio.to_thread(removal_started.wait, 20)
        assert await ask(other, {"op": "ping"}) == {"ok": True}
        ping_answered.set()
        assert await closing == {"ok": True}
        while controller.host._releasing:
            await asyncio.sleep(0.01)

    uid = controller.host.uids.take()
    workdir = tmp_path / "work" / str(uid)
    workdir.mkdir()
    (workdir / "a").write_text("x")
    for index in range(100):
        os.link(workdir / "a", workdir / f"link{index}")
    controller.sessions[uid] = FakeSession(uid)  # type: ignore[assignment]
    asyncio.run(scenario())
    assert during == [True, False], "the removal ran on the event loop, or the uid came back before it ended"
    assert not workdir.exists()
    assert uid in controller.host.uids._free
    assert uid not in controller.sessions


def test_a_jobs_uid_comes_back_only_after_its_files_are_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    uid = controller.host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()
    (tmp_path / "work" / str(uid) / "output.txt").write_text("x")
    (tmp_path / "shm" / "left").write_text("x")
    os.chown(tmp_path / "shm" / "left", uid, uid)
    seen: list[bool] = []
    real_remove_tree = cleanup.remove_tree

    def checking_remove_tree(path: str) -> None:
        seen.append(uid in controller.host.uids._free)
        real_remove_tree(path)

    monkeypatch.setattr(jobhost, "remove_tree", checking_remove_tree)

    async def scenario() -> None:
        await controller.host.release(uid)

    asyncio.run(scenario())
    assert seen == [False]
    assert uid in controller.host.uids._free
    assert not (tmp_path / "work" / str(uid)).exists()
    assert not (tmp_path / "shm" / "left").exists()


def test_an_empty_work_dir_is_removed_without_a_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What most runs leave (a Python-harness candidate writes nothing): rmdir on the loop, then the uid is free."""
    controller = bare_controller(tmp_path, monkeypatch)
    uid = controller.host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()
    removals: list[str] = []
    monkeypatch.setattr(jobhost, "remove_tree", removals.append)

    asyncio.run(controller.host.release(uid))
    assert removals == []
    assert not (tmp_path / "work" / str(uid)).exists()
    assert uid in controller.host.uids._free


def test_a_release_after_a_run_swept_its_uid_empty_looks_at_no_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's end sweeps its uid until none of its processes is left: the release after it has nothing to kill,
    unless a worker was handed the uid since (a stdio job's next case, a server)."""
    controller = bare_controller(tmp_path, monkeypatch)
    host = controller.host
    sweeps: list[int] = []

    def sweep(uid: int, **_: Any) -> set[int]:
        sweeps.append(uid)
        return set()

    monkeypatch.setattr(cleanup, "sigkill_uid", sweep)
    uid = host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()
    host.runner._emptied.add(uid)  # as Runner.run leaves it after its kill_uid
    asyncio.run(host.release(uid))
    assert sweeps == [] and uid in host.uids._free
    assert not host.runner.take_emptied(uid), "forgotten once asked"
    uid = host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()
    host.runner._emptied.add(uid)
    host.runner._emptied.discard(uid)  # as Runner.launch does when a worker is handed the uid again
    asyncio.run(host.release(uid))
    assert sweeps == [uid]


def test_a_jobs_files_in_shared_folders_are_removed_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a job's reply, what its uid left in /dev/shm goes (up to tmpfs_inodes entries): in a thread, which
    here waits until the loop has run something else."""
    controller = bare_controller(tmp_path, monkeypatch)
    uid = controller.host.uids.take()
    (tmp_path / "shm" / "left").write_text("x")
    os.chown(tmp_path / "shm" / "left", uid, uid)
    (tmp_path / "shm" / "another_uids").write_text("x")
    loop_ran = threading.Event()
    during: list[bool] = []
    real_remove_files_of = cleanup.remove_files_of

    def slow_remove_files_of(owner: int, folder: str) -> None:
        during.append(loop_ran.wait(10))
        real_remove_files_of(owner, folder)

    monkeypatch.setattr(jobhost, "remove_files_of", slow_remove_files_of)

    async def scenario() -> None:
        removing = asyncio.ensure_future(controller.host.remove_shared_files(uid))
        await asyncio.sleep(0.05)
        loop_ran.set()
        await removing

    asyncio.run(scenario())
    assert during == [True]
    assert sorted(os.listdir(tmp_path / "shm")) == ["another_uids"]


def test_a_removal_that_fails_damages_the_sandbox_and_keeps_the_uid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    uid = controller.host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()
    (tmp_path / "work" / str(uid) / "left").write_text("x")

    def stuck(path: str) -> None:
        raise errors.SandboxDamaged(f"cannot remove {path}")

    monkeypatch.setattr(jobhost, "remove_tree", stuck)
    damaged: list[str] = []
    controller.host.damaged = damaged.append  # type: ignore[method-assign, assignment]

    async def scenario() -> None:
        controller.host.release_later(uid)
        while controller.host._releasing:
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert len(damaged) == 1 and f"releasing uid {uid} failed (cannot remove" in damaged[0]
    assert uid not in controller.host.uids._free


def test_a_bug_hit_by_one_request_fails_that_request_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Any exception but four dropped the connection, which the daemon reads as a lost sandbox: every job and
    session in it ended. It is that request's error now, logged with its traceback; the connection goes on."""
    controller = bare_controller(tmp_path, monkeypatch)
    real_dispatch = controller._dispatch

    async def buggy_dispatch(request: dict[str, Any]) -> Reply:
        if request.get("op") == "boom":
            raise RuntimeError("a bug of ours")
        if request.get("op") == "oserror":
            raise OSError(28, "No space left on device")
        return await real_dispatch(request)

    monkeypatch.setattr(controller, "_dispatch", buggy_dispatch)

    async def scenario() -> None:
        connection = await connect(controller)
        reply = await ask(connection, {"op": "boom"})
        assert reply == {"error": "internal error in the agent: RuntimeError: a bug of ours"}
        assert "No space left" in (await ask(connection, {"op": "oserror"}))["error"]
        assert "bad request" in (await ask(connection, ["not", "an", "object"]))["error"]
        assert await ask(connection, {"op": "ping"}) == {"ok": True}

    asyncio.run(scenario())
    err = capfd.readouterr().err
    assert "internal error serving 'boom'" in err and "Traceback" in err and "RuntimeError: a bug of ours" in err


def test_a_session_whose_cell_hit_a_bug_is_closed_in_the_agent_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The daemon ends a session whose cell got no result without telling the agent.
    controller = bare_controller(tmp_path, monkeypatch)
    uid = controller.host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()

    async def failing_cell() -> dict[str, Any]:
        raise RuntimeError("a bug of ours")

    controller.sessions[uid] = FakeSession(uid, failing_cell)  # type: ignore[assignment]

    async def scenario() -> None:
        connection = await connect(controller)
        reply = await ask(connection, {"op": "session_cell", "session": uid, "code": "1", "timeout": 1, "output": 10})
        assert "internal error" in reply["error"]
        assert await ask(connection, {"op": "ping"}) == {"ok": True}
        while uid not in controller.host.uids._free:
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert uid not in controller.sessions
    assert not (tmp_path / "work" / str(uid)).exists()


def test_a_broken_stream_still_ends_the_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)

    async def scenario() -> bytes:
        reader, writer = await connect(controller)
        writer.write(HEADER.pack(MAX_FRAME_BYTES + 1))
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)

    assert asyncio.run(scenario()) == b""


def test_reply_strings_are_valid_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone surrogate (a file name that is not UTF-8, a message a job made) passed the agent's JSON, and the
    daemon's protobuf refused it: the call failed with UNKNOWN."""
    controller = bare_controller(tmp_path, monkeypatch)

    async def dispatch(request: dict[str, Any]) -> dict[str, Any]:
        return {"result": {"message": "ValueError: bad\udcff\ud800", "files_changed": ["ok.txt", "b\udcffd"]}}

    monkeypatch.setattr(controller, "_dispatch", dispatch)

    async def scenario() -> Any:
        return await ask(await connect(controller), {"op": "run"})

    result = asyncio.run(scenario())["result"]
    assert result == {"message": "ValueError: bad\\udcff\\ud800", "files_changed": ["ok.txt", "b\\udcffd"]}
    json.dumps(result, ensure_ascii=False).encode()  # what protobuf needs: no UnicodeEncodeError


def test_a_reply_too_large_for_a_frame_is_an_error_reply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)

    async def dispatch(request: dict[str, Any]) -> dict[str, Any]:
        return {"result": {"stdout": "x" * (MAX_FRAME_BYTES + 1)}} if request["op"] == "run" else {"ok": True}

    monkeypatch.setattr(controller, "_dispatch", dispatch)

    async def scenario() -> tuple[Any, Any]:
        connection = await connect(controller)
        return await ask(connection, {"op": "run"}), await ask(connection, {"op": "ping"})

    too_large, ping = asyncio.run(scenario())
    assert "its reply could not be sent" in too_large["error"] and "exceeds" in too_large["error"]
    assert ping == {"ok": True}


# ---- withdrawing a job: the daemon half-closes the job's connection ----------------------------------------------


def withdrawable_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[
        controller_module.Controller, list[str]]:
    """A controller whose jobs run until withdrawn, as a run registers its kill with the job's JobWithdrawal."""
    controller = bare_controller(tmp_path, monkeypatch)
    events: list[str] = []

    async def run_job(job: dict[str, Any]) -> dict[str, Any]:
        if job.get("quick"):
            return {"status": "ok"}
        withdrawal = runner.CURRENT_JOB.get()
        assert withdrawal is not None
        killed = asyncio.Event()

        def kill() -> None:
            events.append("killed")
            killed.set()

        withdrawal.watch(kill)
        await killed.wait()
        events.append("answered")
        return {"status": "internal", "message": "killed"}

    monkeypatch.setattr(controller.jobs, "run", run_job)
    return controller, events


def _withdrawn_by(controller: controller_module.Controller, events: list[str],
                  signal: Callable[[asyncio.StreamWriter], None]) -> tuple[Any, bytes]:
    """A job started on a connection, then `signal(writer)` while it runs: (the reply, what follows it)."""

    async def scenario() -> tuple[Any, bytes]:
        reader, writer = await connect(controller)
        writer.write(encode_frame({"op": "run", "job": {"kind": "execute"}}))
        await writer.drain()
        await asyncio.sleep(0.05)
        assert events == []
        signal(writer)
        await writer.drain()
        reply = await asyncio.wait_for(read_frame(reader), 10)
        return reply, await asyncio.wait_for(reader.read(), 10)

    return asyncio.run(scenario())


def test_a_withdrawn_job_is_killed_and_answered_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller gave up; its job ran on to its deadline in the agent while the daemon held (or, before, freed) its
    slot. Now the daemon half-closes the connection: the agent kills the job's runs and still sends the reply."""
    controller, events = withdrawable_controller(tmp_path, monkeypatch)
    reply, rest = _withdrawn_by(controller, events, lambda writer: writer.write_eof())
    assert events == ["killed", "answered"]
    assert reply["result"]["message"] == "killed"
    assert rest == b"", "the connection ends after the reply"


def test_jobs_that_are_not_withdrawn_share_the_connection_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller, events = withdrawable_controller(tmp_path, monkeypatch)

    async def scenario() -> None:
        connection = await connect(controller)
        for _ in range(3):
            reply = await ask(connection, {"op": "run", "job": {"kind": "execute", "quick": True}})
            assert reply["result"]["status"] == "ok"
        assert await ask(connection, {"op": "ping"}) == {"ok": True}

    asyncio.run(scenario())
    assert events == []


def test_bytes_sent_while_a_job_runs_withdraw_it_and_end_the_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller, events = withdrawable_controller(tmp_path, monkeypatch)
    reply, rest = _withdrawn_by(controller, events, lambda writer: writer.write(encode_frame({"op": "ping"})))
    assert events == ["killed", "answered"] and "result" in reply
    assert rest == b""


def test_a_run_of_a_withdrawn_job_does_not_start(tmp_path: Path) -> None:
    """A job withdrawn between two runs (the next stdio case, the compile's run): the next run is refused before it
    forks, and the other end of its peer socket (a judge waiting for the candidate) reads end of file."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    withdrawal = runner.JobWithdrawal()
    withdrawal.withdraw()
    spec = runner.RunSpec(mode="python", uid=TEST_FIRST_UID, cwd=str(tmp_path), timeout=1, output_limit=100,
                          rlimits={}, code="print(1)", peer=theirs)

    async def scenario() -> None:
        runner.CURRENT_JOB.set(withdrawal)
        await runner.Runner(None, lambda: None).run(spec)  # type: ignore[arg-type]

    with pytest.raises(errors.JobWithdrawn):
        asyncio.run(scenario())
    ours.settimeout(5)
    assert ours.recv(1) == b""
    ours.close()


def test_a_withdrawal_tries_every_kill_and_reports_the_first_that_failed() -> None:
    withdrawal = runner.JobWithdrawal()
    killed: list[str] = []

    def failing() -> None:
        killed.append("failing")
        raise SandboxDamaged("processes of uid 1 survive SIGKILL")

    withdrawal.watch(failing)
    withdrawal.watch(lambda: killed.append("other"))
    with pytest.raises(SandboxDamaged):
        withdrawal.withdraw()
    assert sorted(killed) == ["failing", "other"]
    late: list[str] = []
    withdrawal.watch(lambda: late.append("at once"))
    assert late == ["at once"], "a run watched after the withdrawal is killed when it registers"


# ---- bad requests, and bugs of ours ----------------------------------------------------------------------------------

EXECUTE: dict[str, Any] = {"kind": "execute", "program": {"language": "python", "code": "print(1)"},
                           "limits": {"timeout": 1, "output": 100, "memory": 0, "total_timeout": 300}}


def test_a_keyerror_of_ours_is_an_internal_error_with_its_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Every KeyError, TypeError and ValueError was answered "bad request", with no trace: a bug in the agent read
    as the daemon's fault. Only what the agent refuses on purpose (BadRequest) is a bad request now."""
    controller = bare_controller(tmp_path, monkeypatch)

    async def buggy_execute(job: dict[str, Any], uid: int, runs: list[Any]) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        return settings["a key we forgot"]

    monkeypatch.setattr(controller.jobs, "_execute", buggy_execute)

    async def scenario() -> Any:
        connection = await connect(controller)
        reply = await ask(connection, {"op": "run", "job": EXECUTE})
        while controller.host._releasing:
            await asyncio.sleep(0.01)
        return reply

    reply = asyncio.run(scenario())
    assert reply == {"error": "internal error in the agent: KeyError: 'a key we forgot'"}
    err = capfd.readouterr().err
    assert "internal error serving 'run'" in err and "Traceback" in err and "in buggy_execute" in err
    assert TEST_FIRST_UID in controller.host.uids._free


@pytest.mark.parametrize("request_", [
    ["not", "an", "object"],
    {"op": "no such op"},
    {"op": "run"},
    {"op": "run", "job": "execute"},
    {"op": "run", "job": {"kind": "no such kind"}},
    {"op": "run", "job": {"kind": "execute", "limits": {"timeout": 1, "output": 100}}},
    {"op": "run", "job": dict(EXECUTE, program={"language": "python"})},
    {"op": "run", "job": dict(EXECUTE, files=[{"path": "../up", "content": ""}])},
    {"op": "run", "job": dict(EXECUTE, files=[{"path": "in.txt", "content": "not base64!"}])},
    {"op": "run", "job": dict(EXECUTE, stdin=7)},
    {"op": "hello", "uid_slot": -1},
    {"op": "session_open", "language": "cobol", "limits": {}},
    {"op": "session_cell", "session": "one", "code": "1", "timeout": 1, "output": 10},
    {"op": "session_close"},
], ids=lambda request: json.dumps(request)[:60])
def test_a_malformed_request_is_a_bad_request_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], request_: Any) -> None:
    controller = bare_controller(tmp_path, monkeypatch)

    async def scenario() -> tuple[Any, Any]:
        connection = await connect(controller)
        reply = await ask(connection, request_)
        ping = await ask(connection, {"op": "ping"})
        while controller.host._releasing:
            await asyncio.sleep(0.01)
        return reply, ping

    reply, ping = asyncio.run(scenario())
    assert reply["error"].startswith("bad request: "), reply
    assert ping == {"ok": True}
    assert "Traceback" not in capfd.readouterr().err
    assert len(controller.host.uids._free) == UIDS_PER_SANDBOX


# ---- a job crowded out of /tmp by its neighbours ---------------------------------------------------------------------


def fake_tmp(monkeypatch: pytest.MonkeyPatch, root: Path, *, entries: tuple[int, int],
             pages: tuple[int, int]) -> None:
    """statvfs of `root` (the work root) as a tmpfs of `entries` = (total, free) entries and `pages` of 4 KiB."""
    real_statvfs = os.statvfs

    def statvfs(path: Any) -> Any:
        if str(path) != str(root):
            return real_statvfs(path)
        return types.SimpleNamespace(f_files=entries[0], f_ffree=entries[1], f_blocks=pages[0], f_bfree=pages[1],
                                     f_frsize=4096)

    monkeypatch.setattr(controller_module.os, "statvfs", statvfs)


def no_space_for(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """mkdir under `root` fails as on a tmpfs whose entries are all taken."""
    real_mkdir = os.mkdir

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(f"{root}/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(controller_module.os, "mkdir", mkdir)


def test_sessions_ended_names_those_that_ended_between_cells_or_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    reasons = {5: "its interpreter exited with status 3 between cells", 6: ""}
    controller.sessions = {uid: types.SimpleNamespace(ended_between_cells=lambda why=why: why)  # type: ignore[misc]
                           for uid, why in reasons.items()}

    async def scenario() -> Any:
        return await controller.answer({"op": "sessions_ended", "sessions": [5, 6, 7]})

    assert asyncio.run(scenario()) == {"ended": {"5": reasons[5], "7": "the sandbox no longer holds it"}}
    assert set(controller.sessions) == {5, 6}  # the daemon's Close ends them, as any other


def _run(controller: controller_module.Controller, job: dict[str, Any]) -> Any:
    async def scenario() -> Any:
        reply = await ask(await connect(controller), {"op": "run", "job": job})
        while controller.host._releasing:
            await asyncio.sleep(0.01)
        return reply

    return asyncio.run(scenario())


def test_a_job_whose_work_dir_finds_tmp_full_of_others_files_is_sent_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour took every entry of /tmp; the next job's work dir failed with ENOSPC and that job was answered
    INTERNAL. The agent answers "full" now: the daemon runs the job elsewhere."""
    controller = bare_controller(tmp_path, monkeypatch)
    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, 0), pages=(1000, 990))
    no_space_for(monkeypatch, tmp_path / "work")
    reply = _run(controller, EXECUTE)
    assert reply["full"] is True and "other runs hold its space" in reply["error"], reply
    assert "result" not in reply and not reply.get("damaged")
    assert len(controller.host.uids._free) == UIDS_PER_SANDBOX


def test_a_job_that_fills_tmp_itself_is_not_sent_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own input file takes the space: no neighbour to blame, so no retry (it would fail anywhere)."""
    controller = bare_controller(tmp_path, monkeypatch)
    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, 990), pages=(100, 0))

    def write_tree(workdir: str, uid: int, files: list[tuple[str, bytes]], mode: int = 0o600) -> None:
        ((relpath, content),) = files
        Path(workdir, relpath).write_bytes(content)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), relpath)

    monkeypatch.setattr(jobhost, "write_tree", write_tree)
    job = dict(EXECUTE, files=[{"path": "in.txt", "content": base64.b64encode(os.urandom(300 << 10)).decode()}])
    reply = _run(controller, job)
    assert "full" not in reply and "No space left on device" in reply["error"], reply


@pytest.mark.parametrize(("free_entries", "full"), [(0, True), (990, False)], ids=["others-hold-tmp", "room"])
def test_a_compile_out_of_space_is_sent_elsewhere_only_when_others_hold_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_entries: int, full: bool) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, free_entries), pages=(1000, 990))

    async def compile_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        return runner.RunOutcome(wait_status=1 << 8, stdout=b"", stderr=b"/usr/bin/ld: final link failed: "
                                 b"No space left on device\n", stdout_truncated=False, stderr_truncated=False,
                                 killed_for="", wall_seconds=0.1, cpu_seconds=0.1, max_rss_bytes=0)

    monkeypatch.setattr(controller.host.runner, "run", compile_run)
    job = dict(EXECUTE, program={"language": "cpp", "code": "int main() {}", "source": "main.cpp",
                                 "compile": ["g++", "main.cpp"], "run": ["./a.out"]})
    reply = _run(controller, job)
    if full:
        assert reply.get("full") is True and "compiling" in reply["error"], reply
    else:
        assert reply["result"]["status"] == "compile_error", reply


def test_neighbours_hold_counts_what_is_outside_the_jobs_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "big").write_bytes(os.urandom(1 << 20))  # 256 pages
    for index in range(40):
        os.link(own / "big", own / f"link{index}")  # an entry each, no bytes
    root = tmp_path / "root"
    root.mkdir()
    fake_tmp(monkeypatch, root, entries=(100, 50), pages=(1000, 1000 - 300))  # 50 entries, 300 pages used
    assert not tmpspace.neighbours_hold(str(root), str(own)), "the job's own 256 pages and 42 entries"
    assert tmpspace.neighbours_hold(str(root), None)
    assert not tmpspace.has_room(str(root))
    fake_tmp(monkeypatch, root, entries=(0, 0), pages=(1000, 1000 - 100))  # no nr_inodes cap
    assert tmpspace.has_room(str(root))
    # Memory and pids, measured from /proc (all of this machine's here) against the limits the daemon gave.
    assert tmpspace.has_room(str(root), memory_bytes=1 << 50, pids=1 << 30)
    assert not tmpspace.has_room(str(root), memory_bytes=1 << 20)
    assert not tmpspace.has_room(str(root), pids=2)


def test_room_tells_whether_jobs_can_come_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)

    async def scenario() -> Any:
        return await ask(await connect(controller), {"op": "room"})

    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, 100), pages=(1000, 1000))
    assert asyncio.run(scenario()) == {"room": False}
    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, 900), pages=(1000, 900))
    assert asyncio.run(scenario()) == {"room": True}


# ---- a kill that waits leaves the agent serving ----------------------------------------------------------------------


def test_a_request_is_answered_while_a_release_waits_for_the_uids_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill_uid waited on the event loop (time.sleep) for a uid's processes to go, up to 5 s: one job's fork bomb
    stalled every other job and session of the sandbox. Here the uid's process goes only once a ping on another
    connection has been answered, which a kill holding the loop would never let happen."""
    controller = bare_controller(tmp_path, monkeypatch)
    uid = controller.host.uids.take()
    (tmp_path / "work" / str(uid)).mkdir()
    events: list[str] = []

    def sweep(swept: int, **_: Any) -> set[int]:
        if swept != uid:
            return set()
        events.append("sweep")
        return set() if "ping answered" in events else {4242}

    monkeypatch.setattr(cleanup, "sigkill_uid", sweep)
    monkeypatch.setattr(cleanup, "_kill_all_as", lambda swept: pytest.fail("one process, signalled again"))

    async def scenario() -> None:
        connection = await connect(controller)
        releasing = asyncio.ensure_future(controller.host.release(uid))
        await asyncio.sleep(0)
        assert await ask(connection, {"op": "ping"}) == {"ok": True}
        events.append("ping answered")
        await asyncio.wait_for(releasing, 10)

    asyncio.run(scenario())
    assert events.index("ping answered") >= 1 and events[-1] == "sweep", events
    assert uid in controller.host.uids._free


async def until_the_judge_hangs_up(spec: runner.RunSpec) -> runner.RunOutcome:
    """A stand-in candidate run: it lasts until the judge's end of its socket closes, then exits 0, as a real
    candidate's does (python.candidate)."""
    assert spec.peer is not None
    spec.peer.setblocking(False)
    while await asyncio.get_running_loop().sock_recv(spec.peer, 1):
        pass
    return runner.RunOutcome(wait_status=0, stdout=b"", stderr=b"", stdout_truncated=False,
                             stderr_truncated=False, killed_for="", wall_seconds=0.0, cpu_seconds=0.0, max_rss_bytes=0)


def candidate_fills_then_judge_finds_no_room(controller: controller_module.Controller,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate writes 300 KiB (75 of fake_tmp's 100 pages) and runs on; its judge then cannot make a work dir."""

    async def candidate_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        Path(spec.cwd, "filler").write_bytes(os.urandom(300 << 10))
        return await until_the_judge_hangs_up(spec)

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        await asyncio.sleep(0.01)
        await controller.host.charge_neighbours(None, "making a work dir: No space left on device")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(controller.host.runner, "run", candidate_run)
    monkeypatch.setattr(controller.jobs.judges, "judge", judge)


@pytest.mark.parametrize(("entries", "full"), [((1000, 0), True), ((1000, 990), False)],
                         ids=["others-hold-tmp", "the-candidate-filled-it"])
def test_a_judge_that_cannot_start_for_lack_of_space_blames_the_candidate_only_if_it_filled_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: tuple[int, int], full: bool) -> None:
    """A judge starts beside its job's candidate, whose files count as others' to the judge's work dir: a candidate
    that filled /tmp itself would have its job retried, its wrong answer spared, without the second look."""
    controller = bare_controller(tmp_path, monkeypatch)
    fake_tmp(monkeypatch, tmp_path / "work", entries=entries, pages=(100, 0))

    candidate_fills_then_judge_finds_no_room(controller, monkeypatch)
    job = dict(EXECUTE, kind="code", plan={"kind": "function", "total": 2, "stdio": []}, harness={})
    reply = _run(controller, job)
    if full:
        assert reply.get("full") is True, reply
    else:
        assert reply["result"]["status"] == "runtime_error" and "filled /tmp" in reply["result"]["message"], reply
    assert len(controller.host.uids._free) == UIDS_PER_SANDBOX


JUDGED_JOB: dict[str, Any] = dict(EXECUTE, kind="code", plan={"kind": "function", "total": 2, "stdio": []}, harness={})


@pytest.mark.parametrize("crowded", [True, False], ids=["crowded-out", "its-own-sigkill"])
def test_a_candidate_its_judge_saw_die_is_judged_by_its_exit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crowded: bool) -> None:
    """The OOM killer took a candidate while the others held the sandbox's memory: its judge answered "died" (the
    socket closes before the exit is reported), the candidate was then taken for one its caller killed, and the
    out-of-memory check was skipped: RUNTIME_ERROR for 6 of 12 correct jobs beside a socket-buffer attack (red
    team). Now the harness waits for that exit, so the run retries it as it does a stdio run (SandboxFull); a
    candidate that ended itself keeps its verdict."""
    controller = bare_controller(tmp_path, monkeypatch)

    async def candidate_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        await asyncio.sleep(0.05)  # its exit, reported after the judge's answer
        if crowded and not spec.ended_by_caller:
            raise messages.SandboxFull("the sandbox ran out of memory while this run held 150 MiB")
        return runner.RunOutcome(wait_status=0 if not crowded else signal.SIGKILL, stdout=b"", stderr=b"",
                                 stdout_truncated=False, stderr_truncated=False, killed_for="", wall_seconds=0.05,
                                 cpu_seconds=0.0, max_rss_bytes=0)

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        died = {"index": 0, "status": "died", "passed": False, "message": "the candidate process exited"}
        return "ok", {"status": "died", "total": 2, "candidate_died": True, "tests": [died]}, ""

    monkeypatch.setattr(controller.host.runner, "run", candidate_run)
    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    reply = _run(controller, JUDGED_JOB)
    if crowded:
        assert reply.get("full") is True and "ran out of memory" in reply["error"], reply
    else:
        assert reply["result"]["status"] == "runtime_error", reply


def test_an_innocent_candidate_is_not_charged_when_the_neighbour_leaves_between_the_two_looks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour took every entry of /tmp; this job's judge could not make its work dir (SandboxFull). The
    candidate wrote nothing, and the neighbour's job ends (its files removed) before _python_harness's second look.
    The job goes elsewhere; it was answered runtime_error "the program filled /tmp", a wrong verdict."""
    controller = bare_controller(tmp_path, monkeypatch)
    root = str(tmp_path / "work")
    looks = {"n": 0}
    real_statvfs = os.statvfs

    def statvfs(path: Any) -> Any:
        if str(path) != root:
            return real_statvfs(path)
        looks["n"] += 1
        free = 0 if looks["n"] == 1 else 990  # full at the judge's look, the neighbour gone at the second
        return types.SimpleNamespace(f_files=1000, f_ffree=free, f_blocks=1000, f_bfree=1000, f_frsize=4096)

    monkeypatch.setattr(controller_module.os, "statvfs", statvfs)

    async def candidate_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        return await until_the_judge_hangs_up(spec)  # writes nothing

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        # As JudgeServer.start -> make_workdir: mkdir got ENOSPC before the candidate ran at all.
        await controller.host.charge_neighbours(None, "making a work dir: No space left on device")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(controller.host.runner, "run", candidate_run)
    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    reply = _run(controller, JUDGED_JOB)
    assert reply.get("full") is True, f"innocent candidate charged: {reply}"


def test_the_candidate_is_killed_before_shared_folders_are_cleaned_on_the_runtime_error_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate that filled /tmp before its judge started is answered runtime_error, and its uid is killed before
    _under_own_uid removes its files from /dev/shm & co.: killed after (a cancelled run kills nothing), what it wrote
    to /dev/shm in between stayed for later jobs."""
    controller = bare_controller(tmp_path, monkeypatch)
    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, 990), pages=(100, 0))
    events: list[str] = []


    real_remove_shared = controller.host.remove_shared_files

    async def remove_shared_files(uid: int) -> None:
        events.append("shared files removed")
        await real_remove_shared(uid)

    async def kill_uid(uid: int, reap: Any) -> None:
        events.append("uid killed")

    def sigkill_uid(uid: int, **_: Any) -> set[int]:
        events.append("uid killed")
        return set()

    candidate_fills_then_judge_finds_no_room(controller, monkeypatch)
    monkeypatch.setattr(controller.host, "remove_shared_files", remove_shared_files)
    monkeypatch.setattr(jobhost, "kill_uid", kill_uid)
    monkeypatch.setattr(jobs, "sigkill_uid", sigkill_uid)
    reply = _run(controller, JUDGED_JOB)
    assert reply["result"]["status"] == "runtime_error", reply
    assert "uid killed" in events and events.index("uid killed") < events.index("shared files removed"), events


def test_a_compile_error_that_merely_says_no_space_is_not_sent_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`#error No space left on device` (or a string constant in any type error) puts the phrase in the compiler's
    output. With a legitimate neighbour holding half of /tmp's entries but /tmp far from full (no ENOSPC anywhere),
    the candidate keeps its compile_error; taken at its word, it became {"full": true}: a free retry, and the
    sandbox taken out of service (room stays false while the neighbour holds half; replaced after 10 s)."""
    controller = bare_controller(tmp_path, monkeypatch)
    fake_tmp(monkeypatch, tmp_path / "work", entries=(1000, 480), pages=(1000, 1000))  # half the entries, no bytes

    async def compile_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        return runner.RunOutcome(wait_status=1 << 8, stdout=b"",
                                 stderr=b"main.c:1:2: error: #error No space left on device\n",
                                 stdout_truncated=False, stderr_truncated=False, killed_for="", wall_seconds=0.1,
                                 cpu_seconds=0.1, max_rss_bytes=0)

    monkeypatch.setattr(controller.host.runner, "run", compile_run)
    job = dict(EXECUTE, program={"language": "c", "code": "#error No space left on device\n", "source": "main.c",
                                 "compile": ["gcc", "main.c"], "run": ["./a.out"]})
    reply: Any = _run(controller, job)
    assert "result" in reply and reply["result"]["status"] == "compile_error", reply


def test_runs_without_an_address_space_limit_are_held_by_their_peak_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    # Only the fields _program_spec reads of an exec'd program.
    limits = cast("JobLimits", {"timeout": 1.0, "output": 1024, "memory": 256 << 20})
    go = cast("Program", {"language": "go", "run": ["./main"], "address_space_limit": False})
    spec = controller.jobs._program_spec(go, limits, TEST_FIRST_UID, str(tmp_path), b"", [])
    assert spec.peak_memory_limit == 256 << 20 and "as_extra" not in spec.rlimits
    assert spec.env["GOMEMLIMIT"] == f"{192 << 20}B"
    java = cast("Program", {"language": "java", "run": ["java", "-cp", ".", "Main"], "address_space_limit": False})
    spec = controller.jobs._program_spec(java, limits, TEST_FIRST_UID, str(tmp_path), b"", ["x"])
    assert spec.argv == ["java", f"-XX:MaxRAM={256 << 20}", "-XX:MaxRAMPercentage=75", "-cp", ".", "Main", "x"]
    node = cast("Program", {"language": "javascript", "run": ["node", "main.js"], "address_space_limit": False})
    spec = controller.jobs._program_spec(node, limits, TEST_FIRST_UID, str(tmp_path), b"", [])
    assert spec.argv == ["node", "--max-old-space-size=192", "main.js"] and "GOMEMLIMIT" not in spec.env
    c = cast("Program", {"language": "c", "run": ["./main"]})
    spec = controller.jobs._program_spec(c, limits, TEST_FIRST_UID, str(tmp_path), b"", [])
    assert spec.peak_memory_limit == 0 and spec.rlimits["as_extra"] == 256 << 20 and "GOMEMLIMIT" not in spec.env


# ---- the job's time: all of a code job's stdin/stdout cases together -----------------------------------------------

def test_the_cases_share_the_jobs_time_and_the_rest_are_failed_when_it_runs_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case had its own timeout and nothing more: a program that ran each of 100 cases just under 10 s held
    its slot for 1,000 s. Here each case takes 1.2 s of a 2 s timeout, the job 3 s: the third is cut short at the
    job's end, the fourth never starts."""
    controller = bare_controller(tmp_path, monkeypatch)
    clock = [0.0]
    monkeypatch.setattr(jobs, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    timeouts: list[float] = []

    async def run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        timeouts.append(spec.timeout)
        took = min(1.2, spec.timeout)
        clock[0] += took
        return runner.RunOutcome(wait_status=0, stdout=b"ok\n", stderr=b"", stdout_truncated=False,
                                 stderr_truncated=False, killed_for="wall_time" if took < 1.2 else "",
                                 wall_seconds=took, cpu_seconds=took, max_rss_bytes=0)

    monkeypatch.setattr(controller.host.runner, "run", run)
    job: dict[str, Any] = {"kind": "code", "program": {"language": "python", "code": "print('ok')"},
                           "limits": {"timeout": 2.0, "output": 100, "memory": 0, "total_timeout": 3.0},
                           "plan": {"kind": "stdio", "total": 4, "stdio": [{"stdin": "", "expected_stdout": "ok"}] * 4}}
    result = _run(controller, job)["result"]
    assert timeouts == [2.0, pytest.approx(1.8), pytest.approx(0.6)]
    tests = result["tests"]
    assert [t["status"] for t in tests] == ["ok", "ok", "timeout"], tests
    assert tests[2]["limit"] == "total_time" and "job's 3 s for all its tests ran out" in tests[2]["message"]
    assert result["status"] == "timeout" and result["limit"] == "total_time"
    assert result["code"] == {"tests_passed": 2, "tests_total": 4}
    # The job's time gone between two cases: the next is failed without a run.
    clock[0] = 0.0
    timeouts.clear()
    result = _run(controller, dict(job, limits=dict(job["limits"], total_timeout=2.4)))["result"]
    assert timeouts == [2.0, pytest.approx(1.2)]
    assert [(t["status"], t["limit"]) for t in result["tests"]] == [("ok", ""), ("ok", ""), ("timeout", "total_time")]
    assert result["tests"][2]["message"].startswith("not run") and result["code"]["tests_passed"] == 2


def test_a_code_job_without_a_total_timeout_is_a_bad_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    job = {"kind": "code", "program": {"language": "python", "code": "print('ok')"},
           "limits": {"timeout": 2.0, "output": 100, "memory": 0},
           "plan": {"kind": "stdio", "total": 1, "stdio": [{"stdin": "", "expected_stdout": "ok"}]}}
    reply = _run(controller, job)
    assert reply == {"error": "bad request: job.limits has no 'total_timeout'"}


@pytest.mark.parametrize(("assembly", "error"), [
    ("prompt + code", "bad request: job.assembly is a str, not dict"),
    ({"head": "", "prompt": "def f():\n", "prompt_head": ""}, "bad request: job.assembly has no 'entry_point'"),
    ({"head": "", "prompt": 3, "prompt_head": "", "entry_point": "f"},
     "bad request: job.assembly.prompt is a int, not str"),
])
def test_a_code_job_with_a_malformed_assembly_is_a_bad_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                assembly: Any, error: str) -> None:
    controller = bare_controller(tmp_path, monkeypatch)
    job = {"kind": "code", "program": {"language": "python", "code": "    return 1\n"}, "assembly": assembly,
           "limits": {"timeout": 2.0, "output": 100, "memory": 0, "total_timeout": 3.0},
           "plan": {"kind": "assert", "total": 1, "stdio": []}, "harness": {"assert_code": "assert f() == 1"}}
    assert _run(controller, job) == {"error": error}


@pytest.mark.parametrize(("total_timeout", "deadline", "judge_deadline", "time_for_all", "limit"),
                         [(300, 2.0, 6.0, None, "wall_time"), (1.5, 2.5, 5.5, 1.5, "total_time")])
def test_function_tests_end_at_the_sooner_of_their_timeouts_and_the_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total_timeout: float, deadline: float,
        judge_deadline: float, time_for_all: float | None, limit: str) -> None:
    """The judge calls the candidate once per case, under one deadline for them all: two cases of 1 s, or the job's
    time where that is shorter, which the result names. That time the judge keeps itself (time_for_all), so both
    get JUDGE_GRACE_SECONDS more; here it gives no verdict even so. The judge moves its deadlines by the CPU the
    others take from the candidate, up to DEADLINE_STRETCH times them, and is waited for as long (the candidate's
    run moves its own)."""
    controller = bare_controller(tmp_path, monkeypatch)
    deadlines: list[float] = []
    requests: list[dict[str, Any]] = []

    async def candidate_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        deadlines.append(spec.timeout)
        return await until_the_judge_hangs_up(spec)

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        deadlines.append(timeout)
        requests.append(request)
        return "timeout", None, f"no verdict within {timeout:g} s"

    monkeypatch.setattr(controller.host.runner, "run", candidate_run)
    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    job = dict(JUDGED_JOB, limits=dict(JUDGED_JOB["limits"], total_timeout=total_timeout))
    result = _run(controller, job)["result"]
    assert sorted(deadlines) == [deadline, judge_deadline]
    assert requests[0]["harness"].get("time_for_all") == time_for_all and requests[0]["harness"]["call_timeout"] == 1
    assert (result["status"], result["limit"]) == ("timeout", limit), result
    if limit == "total_time":
        assert result["message"] == "killed when the job's 1.5 s for all its tests ran out"


def test_function_tests_cut_by_the_jobs_time_keep_the_verdicts_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge answers when the job's time runs out: the cases before it keep their verdicts (it gave none)."""
    controller = bare_controller(tmp_path, monkeypatch)
    monkeypatch.setattr(controller.host.runner, "run", until_the_judge_hangs_up)

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        tests = [{"index": 0, "passed": True, "status": "ok", "message": ""},
                 {"index": 1, "passed": False, "status": "total_time", "message": "the time for all the tests ran out"},
                 {"index": 2, "passed": False, "status": "total_time",
                  "message": "not run: the time for all the tests ran out"}]
        return "ok", {"passed": False, "passed_count": 1, "total": 3, "status": "total_time", "tests": tests}, ""

    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    job = dict(JUDGED_JOB, plan={"kind": "function", "total": 3, "stdio": []},
               limits=dict(JUDGED_JOB["limits"], total_timeout=1.5))
    result = _run(controller, job)["result"]
    assert [(t["status"], t["limit"], t["message"]) for t in result["tests"]] == [
        ("ok", "", ""),
        ("timeout", "total_time", "killed when the job's 1.5 s for all its tests ran out"),
        ("timeout", "total_time", "not run: the job's 1.5 s for all its tests ran out")]
    assert result["code"]["tests_passed"] == 1 and result["status"] == "timeout", result


@pytest.mark.parametrize("past_stretch", [True, False], ids=["kept-off-past-the-stretch", "had-its-time"])
def test_a_call_whose_deadline_moved_by_the_whole_stretch_is_retried_not_charged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, past_stretch: bool) -> None:
    """The judge gave up on a call whose deadline had moved by the whole stretch, the candidate kept off the CPU
    longer still (by the host's other load: its neighbours ran no more than it did). Over the candidate's life, two
    calls that ran before it, it was kept off less than 1 - 1 / DEADLINE_STRETCH of its time: only the judge's word
    tells that it did not have its time. Such a job is run again (SandboxFull); one whose call had its time keeps
    its TIMEOUT."""
    controller = bare_controller(tmp_path, monkeypatch)
    share = usage.CpuShare(ran_seconds=1.0, waited_seconds=2.2, others_ran_seconds=0.5, waited_lately=0.9,
                           kept_off_seconds=2.2)

    async def candidate_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        outcome = await until_the_judge_hangs_up(spec)
        outcome.wall_seconds, outcome.cpu_share = 3.5, share
        return outcome

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        tests = [{"index": 0, "passed": True, "status": "ok", "message": ""},
                 {"index": 1, "passed": True, "status": "ok", "message": ""},
                 {"index": 2, "passed": False, "status": "timeout",
                  "message": "the candidate did not answer within 1 s"}]
        return "ok", {"passed": False, "passed_count": 2, "total": 3, "status": "timeout", "tests": tests,
                      "past_stretch": past_stretch}, ""

    monkeypatch.setattr(controller.host.runner, "run", candidate_run)
    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    reply = _run(controller, dict(JUDGED_JOB, plan={"kind": "function", "total": 3, "stdio": []}))
    if past_stretch:
        assert reply.get("full") is True and "kept off a CPU for 2.20 s" in reply["error"], reply
    else:
        assert reply["result"]["status"] == "timeout" and reply["result"]["limit"] == "wall_time", reply


def test_a_program_or_reply_too_large_for_the_judge_is_the_memory_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's verdict "memory" (python.harness.TooLargeForJudge) is the model's failure at the memory limit: it
    was no status of the harness's before, and a judge's MemoryError ended the job STATUS_INTERNAL."""
    controller = bare_controller(tmp_path, monkeypatch)
    monkeypatch.setattr(controller.host.runner, "run", until_the_judge_hangs_up)
    too_large = "the candidate's reply took more memory to decode than the judge may use (MemoryError)"

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        tests = [{"index": 0, "passed": True, "status": "ok", "message": ""},
                 {"index": 1, "passed": False, "status": "memory", "message": too_large},
                 {"index": 2, "passed": False, "status": "memory", "message": f"not run: {too_large}"}]
        return "ok", {"passed": False, "passed_count": 1, "total": 3, "status": "memory", "tests": tests}, ""

    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    job = dict(JUDGED_JOB, plan={"kind": "function", "total": 3, "stdio": []})
    result = _run(controller, job)["result"]
    assert [(t["status"], t["limit"]) for t in result["tests"]] == [
        ("ok", ""), ("memory_limit", "memory"), ("memory_limit", "memory")]
    assert (result["status"], result["limit"], result["message"]) == ("memory_limit", "memory", too_large), result


class _StandInZygote:
    """Hands out workers that have already exited (status 0), and holds each one's channel until told to let go."""

    def __init__(self) -> None:
        self.ends: list[socket.socket] = []
        self.gates: list[asyncio.Event] = []  # the next takes wait for these, in turn

    async def take(self) -> tuple[int, socket.socket, asyncio.Future[dict[str, Any]]]:
        if self.gates:
            await self.gates.pop(0).wait()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ends.append(theirs)
        exited: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        exited.set_result({"status": 0, "cpu_seconds": 0.0, "max_rss_bytes": 0})
        return 4242, ours, exited

    def forget(self, pid: int) -> None:
        pass


def test_a_run_marks_its_uid_emptied_only_if_no_other_worker_was_handed_it_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release after a run skips its sweep of the uid (take_emptied) only when the run's own sweep was the
    last word: not when another launch of the uid began while the run ended, whose worker may take it later."""
    swept: list[int] = []

    async def sweep(uid: int, reap: Any) -> None:
        swept.append(uid)

    monkeypatch.setattr(runner, "kill_uid", sweep)
    zygote = _StandInZygote()
    host = runner.Runner(zygote, lambda: None)  # type: ignore[arg-type]

    def spec() -> runner.RunSpec:
        return runner.RunSpec(mode="exec", uid=TEST_FIRST_UID, cwd=str(tmp_path), timeout=5, output_limit=100,
                              rlimits={}, argv=["true"])

    async def scenario() -> tuple[bool, bool]:
        await host.run(spec())
        alone = host.take_emptied(TEST_FIRST_UID)
        gates = [asyncio.Event(), asyncio.Event()]
        zygote.gates = list(gates)
        first = asyncio.ensure_future(host.run(spec()))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(host.run(spec()))  # launched (counted) while the first waits for its worker
        await asyncio.sleep(0)
        gates[0].set()
        await first
        overlapped = host.take_emptied(TEST_FIRST_UID)
        gates[1].set()
        await second
        return alone, overlapped

    alone, overlapped = asyncio.run(scenario())
    assert alone, "a run that swept its uid empty leaves it marked"
    assert not overlapped, "a run marked its uid while another launch of it was under way"
    assert host.take_emptied(TEST_FIRST_UID), "the last run to end, with no launch after it, marks it"
    assert swept == [TEST_FIRST_UID] * 3
    for end in zygote.ends:
        end.close()


@pytest.mark.parametrize("status", ["ok", "wrong_answer", "timeout"])
def test_a_candidate_waiting_for_a_request_ends_on_its_own_and_a_busy_one_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """Once the judge has its verdict, a candidate that waits for a request reads end of file and exits (the run's
    end then sweeps its uid): a sweep of every process to kill it first is for nothing. One whose call the judge
    gave up on is still running it, and is killed at once."""
    controller = bare_controller(tmp_path, monkeypatch)
    sweeps: list[int] = []
    events: dict[str, asyncio.Event] = {}

    def killed() -> asyncio.Event:
        return events.setdefault("killed", asyncio.Event())

    def sigkill_uid(uid: int, **_: Any) -> set[int]:
        sweeps.append(uid)
        killed().set()
        return set()

    async def candidate_run(spec: runner.RunSpec, *, settle: bool = True) -> runner.RunOutcome:
        if status == "timeout":
            await killed().wait()  # still in the call its judge gave up on
            return await until_the_judge_hangs_up(spec)
        return await until_the_judge_hangs_up(spec)

    async def judge(request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int, timeout: float,
                    share: Any = None) -> Any:
        tests = [{"index": 0, "status": status, "passed": status == "ok", "message": ""}]
        return "ok", {"status": status, "total": 1, "passed": status == "ok", "passed_count": int(status == "ok"),
                      "candidate_died": False, "tests": tests}, ""

    monkeypatch.setattr(controller.host.runner, "run", candidate_run)
    monkeypatch.setattr(controller.jobs.judges, "judge", judge)
    monkeypatch.setattr(jobs, "sigkill_uid", sigkill_uid)
    reply = _run(controller, dict(JUDGED_JOB, plan={"kind": "function", "total": 1, "stdio": []}))
    assert reply["result"]["status"] == status, reply
    assert sweeps == ([TEST_FIRST_UID] if status == "timeout" else []), sweeps
