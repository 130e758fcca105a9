"""Sessions against a real daemon: state across cells, isolation, timeouts, expiry, scale."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sandboxd_client import AsyncSandboxClient, CellResult, InvalidRequest, SandboxClient, SessionNotFound, Status
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from sandboxd import config
from tests.conftest import DaemonProcess
from tests.integration import helpers


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[SandboxClient]:
    with SandboxClient(daemon.address) as client:
        yield client


def _sessions_pool(status: pb.PoolStatus) -> pb.PoolState:
    return next(pool for pool in status.pools if pool.name == "sessions")


def test_python_state_persists_across_cells(client: SandboxClient) -> None:
    with client.open_session(timeout=10) as session:
        assert session.run("import math\nradius = 2\ndef area(r):\n    return math.pi * r * r").ok
        result = session.run("print('area'); round(area(radius), 3)")
        assert (result.status, result.stdout, result.value) == (Status.OK, "area\n", "12.566")
        assert session.run("_ * 2").value == "25.132"  # the last value is bound to _, like a notebook
        error = session.run("undefined_name + 1")
        assert error.status == Status.RUNTIME_ERROR and error.session_alive
        assert "NameError" in error.message and "undefined_name" in error.stderr
        assert session.run("radius").value == "2"  # an error does not lose the namespace


def test_files_at_open_and_files_changed(client: SandboxClient) -> None:
    with client.open_session(files={"data/input.txt": "3 4\n"}) as session:
        result = session.run("a, b = map(int, open('data/input.txt').read().split())\n"
                             "open('out.txt', 'w').write(str(a * b))\na * b")
        assert result.value == "12"
        assert result.files_changed == ("out.txt",)
        assert session.run("import os\nos.remove('out.txt')").files_changed == ("out.txt",)
        assert session.run("1").files_changed == ()


def test_bash_keeps_directory_environment_and_functions(client: SandboxClient) -> None:
    with client.open_session("bash") as session:
        setup = session.run("mkdir -p work/deep && cd work/deep && export GREETING=hello && COUNT=3 && "
                            "shout() { echo \"$1!\"; } && echo ready")
        assert (setup.status, setup.stdout) == (Status.OK, "ready\n")
        result = session.run("pwd | sed 's#.*/work#work#'; echo $GREETING $COUNT; shout hey; env | grep -c GREETING")
        assert result.stdout == "work/deep\nhello 3\nhey!\n1\n"
        failed = session.run("false")
        assert failed.status == Status.RUNTIME_ERROR and failed.session_alive
        slow = session.run("cd /; sleep 30", timeout=1)
        assert (slow.status, slow.limit_hit.name, slow.session_alive) == (Status.TIMEOUT, "WALL_TIME", True)
        # The timed-out cell's `cd /` died with it; the saved state is the one before.
        assert session.run("pwd | sed 's#.*/work#work#'").stdout == "work/deep\n"


def test_timeout_interrupts_only_that_cell(client: SandboxClient) -> None:
    with client.open_session() as slow, client.open_session() as fast:
        slow.run("state = 'kept'")
        outcome: dict[str, CellResult] = {}

        def hang() -> None:
            outcome["result"] = slow.run("while True:\n    pass", timeout=2)

        thread = threading.Thread(target=hang)
        thread.start()
        answers = [fast.run(f"{i} * {i}").value for i in range(5)]
        thread.join(30)
        assert answers == [str(i * i) for i in range(5)]
        result = outcome["result"]
        # Or, on a host that kept it off the CPU more than 2/3 of its time, uncharged (runner.starved_out).
        kept_off = (result.status == Status.INTERNAL and helpers.KEPT_OFF.search(result.message) is not None
                    and "not charged" in result.message)
        assert (result.status == Status.TIMEOUT or kept_off) and result.session_alive, result
        assert result.limit_hit.name == "WALL_TIME" or kept_off
        assert slow.run("state").value == "'kept'"


def test_cell_that_ignores_the_interrupt_ends_its_session(client: SandboxClient) -> None:
    session = client.open_session()
    result = session.run("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
                         timeout=1)
    assert result.status == Status.TIMEOUT and not result.session_alive
    with pytest.raises(SessionNotFound, match="ignored the interrupt"):
        session.run("1")
    session.close()  # closing an ended session is fine


@pytest.mark.parametrize(("code", "status"), [
    ("import os\nos._exit(0)", Status.RUNTIME_ERROR),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", Status.RUNTIME_ERROR),
    # Its own SIGKILL, with no OOM kill meanwhile: was reported as a memory limit.
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", Status.RUNTIME_ERROR),
])
def test_crashed_interpreter_is_reported_dead(client: SandboxClient, code: str, status: Status) -> None:
    with client.open_session() as session:
        result = session.run(code)
        assert result.status == status and not result.session_alive, result
        assert "the session was closed" in result.message
        with pytest.raises(SessionNotFound):
            session.run("1")


def test_a_cell_that_forks_answers_with_its_parents_value(client: SandboxClient) -> None:
    """The child came back into the session loop on the channel it shares with its parent: its result raced the
    parent's and it read the next cell too, so the session answered with the child's values or stalled."""
    with client.open_session(timeout=10) as session:
        forked = session.run("import os\npid = os.fork()\nprint('child' if pid == 0 else 'parent', flush=True)\n"
                             "if pid:\n    os.waitpid(pid, 0)\n'child' if pid == 0 else 'parent'")
        assert (forked.status, forked.value) == (Status.OK, "'parent'"), forked
        assert sorted(forked.stdout.split()) == ["child", "parent"]
        for number in range(3):  # each later cell answered once, by the session's own interpreter
            assert session.run(f"os.getpid() == {session.run('os.getpid()').value} and {number}").value == str(number)


def test_sys_exit_and_limits_leave_the_session_alive(client: SandboxClient) -> None:
    with client.open_session(memory_bytes=256 << 20, output_bytes=10_000) as session:
        assert session.run("x = 1\nimport sys\nsys.exit(0)").status == Status.OK
        assert session.run("raise SystemExit(3)").status == Status.RUNTIME_ERROR
        memory = session.run("blob = bytearray(1 << 30)")
        assert (memory.status, memory.session_alive) == (Status.MEMORY_LIMIT, True)
        flood = session.run("while True:\n    print('y' * 1000)", timeout=20)
        assert (flood.status, flood.session_alive) == (Status.OUTPUT_LIMIT, True)
        assert len(flood.stdout) <= 10_000
        assert session.run("x").value == "1"


def test_a_sessions_processes_are_held_to_its_memory_limit_together(client: SandboxClient) -> None:
    """Each process a cell forks is under the interpreter's address-space cap; three children of 100 MiB left
    running between cells were 300 MiB under a 128 MiB session. The session ends at its next cell."""
    with client.open_session(memory_bytes=128 << 20) as session:
        left = session.run("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n"
                           "        held = bytearray(b'x') * (100 << 20)\n        time.sleep(60)\n        os._exit(0)")
        assert left.status == Status.OK, left
        ended = session.run("import time\ntime.sleep(5)", timeout=10)
        assert (ended.status, ended.session_alive) == (Status.MEMORY_LIMIT, False), ended
        assert "held more than its memory limit of 128 MiB together" in ended.message


def test_out_of_memory_kills_sessions_before_the_agent(client: SandboxClient) -> None:
    with client.open_session() as session:
        mine, agent = session.run("open('/proc/self/oom_score_adj').read(), open('/proc/1/oom_score_adj').read()"
                                  ).value.strip("()").split(", ")
        assert mine == "'750\\n'" and int(agent.strip("'\\n")) < 500


def test_sessions_have_no_network(client: SandboxClient) -> None:
    with client.open_session() as session:
        result = session.run("import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 53))")
        # PermissionError: the seccomp profile refuses IP sockets (sandbox.loopback); an OSError either way.
        assert result.status == Status.RUNTIME_ERROR and "Error" in result.message, result


def test_sessions_in_one_container_cannot_touch_each_other(client: SandboxClient) -> None:
    opened = [client.open_session() for _ in range(4)]
    try:
        by_host: dict[str, list] = {}
        for session in opened:
            host = session.run("import os, socket\nsocket.gethostname()").value
            by_host.setdefault(host, []).append(session)
        victim, attacker = next(group for group in by_host.values() if len(group) >= 2)[:2]
        where = victim.run("open('secret.txt', 'w').write('s3cret')\n(os.getcwd(), os.getpid())").value
        attack = attacker.run(
            f"folder, pid = {where}\nimport signal\nresults = []\n"
            "for probe in (lambda: open(folder + '/secret.txt').read(), lambda: os.listdir(folder),\n"
            "              lambda: os.kill(pid, signal.SIGKILL), lambda: open(f'/proc/{pid}/environ').read(),\n"
            "              lambda: open(f'/proc/{pid}/mem', 'rb').read(1), lambda: open('/tmp/x', 'w')):\n"
            "    try:\n        probe()\n        results.append('allowed')\n"
            "    except OSError as exc:\n        results.append(type(exc).__name__)\nresults")
        assert "allowed" not in attack.value, attack
        assert victim.run("open('secret.txt').read()").value == "'s3cret'"
    finally:
        for session in opened:
            session.close()


def test_concurrent_cells_in_one_session_are_refused(daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SessionsStub(channel)
        info = stub.Open(pb.OpenSessionRequest(), timeout=60)
        try:
            slow = stub.RunCell.future(pb.RunCellRequest(session_id=info.session_id, code="import time\n"
                                                         "time.sleep(2)"), timeout=30)
            time.sleep(0.5)
            with pytest.raises(grpc.RpcError) as caught:
                stub.RunCell(pb.RunCellRequest(session_id=info.session_id, code="1"), timeout=30)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert slow.result().status == pb.STATUS_OK
        finally:
            stub.Close(pb.CloseSessionRequest(session_id=info.session_id), timeout=30)


def test_opens_with_one_request_id_hold_one_session(daemon: DaemonProcess) -> None:
    """A retried Open whose first attempt had opened a session (its answer lost to a dropped connection) opened a
    second one, held until its idle timeout and never closed. Opens with one request_id, at once or one after the
    other, now get one session; the key sent with another request is refused."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SessionsStub(channel)

        def listed() -> set[str]:
            return {s.session_id for s in stub.List(pb.ListSessionsRequest(), timeout=10).sessions}

        before = listed()
        request = pb.OpenSessionRequest(request_id=uuid.uuid4().hex)
        at_once = [stub.Open.future(request, timeout=60) for _ in range(2)]
        opened = {future.result().session_id for future in at_once} | {stub.Open(request, timeout=60).session_id}
        try:
            assert len(opened) == 1 and listed() - before == opened
            with pytest.raises(grpc.RpcError) as caught:
                stub.Open(pb.OpenSessionRequest(language="bash", request_id=request.request_id), timeout=60)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "was sent before with another request" in caught.value.details()
            assert listed() - before == opened
        finally:
            for session_id in opened:
                stub.Close(pb.CloseSessionRequest(session_id=session_id), timeout=30)


def test_idle_expiry_frees_the_slot(client: SandboxClient, daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        sessions_stub, pool_stub = pb_grpc.SessionsStub(channel), pb_grpc.PoolStub(channel)
        busy_before = _sessions_pool(pool_stub.GetStatus(pb.GetPoolStatusRequest(), timeout=10)).busy
        info = sessions_stub.Open(pb.OpenSessionRequest(idle_timeout_seconds=1.0), timeout=60)
        listed = sessions_stub.List(pb.ListSessionsRequest(), timeout=10).sessions
        assert info.session_id in {s.session_id for s in listed}
        assert info.expires_at_unix - info.opened_at_unix == pytest.approx(1.0, abs=0.1)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            listed = sessions_stub.List(pb.ListSessionsRequest(), timeout=10).sessions
            if info.session_id not in {s.session_id for s in listed}:
                break
            time.sleep(0.2)
        with pytest.raises(grpc.RpcError) as caught:
            sessions_stub.RunCell(pb.RunCellRequest(session_id=info.session_id, code="1"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "idle for 1 s" in caught.value.details()
        status = _sessions_pool(pool_stub.GetStatus(pb.GetPoolStatusRequest(), timeout=10))
        assert status.busy <= busy_before


def _host_pid_named(comm: str) -> int:
    """The host's pid of the one process whose name (/proc/<pid>/comm) is `comm`."""
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/comm") as named:
                if name.isdigit() and named.read().strip() == comm:
                    return int(name)
        except OSError:
            continue
    raise LookupError(f"no process named {comm}")


def test_a_session_whose_interpreter_ends_between_cells_leaves_the_list(daemon: DaemonProcess) -> None:
    """An interpreter killed between cells (here from outside: the sandbox's OOM killer does it): the session
    was listed alive and held its slot until its next cell or its idle timeout. The daemon asks the agent every
    2 s which ended."""
    with SandboxClient(daemon.address) as client, grpc.insecure_channel(daemon.address) as channel:
        sessions_stub = pb_grpc.SessionsStub(channel)

        def listed() -> set[str]:
            return {s.session_id for s in sessions_stub.List(pb.ListSessionsRequest(), timeout=10).sessions}

        with client.open_session() as dying, client.open_session() as neighbour:
            marker = f"sbd{uuid.uuid4().hex[:12]}"  # its interpreter's name, as the host sees it
            assert dying.run(f"import ctypes\nctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)").value == "0"
            assert neighbour.run("x = 5").ok
            os.kill(_host_pid_named(marker), signal.SIGKILL)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and dying.id in listed():
                time.sleep(0.2)
            assert dying.id not in listed() and neighbour.id in listed()
            with pytest.raises(SessionNotFound, match="its interpreter was killed by signal SIGKILL between cells"):
                dying.run("1")
            assert neighbour.run("x").value == "5"


def test_a_timer_a_cell_leaves_fires_at_the_next_cell(client: SandboxClient) -> None:
    """What a cell leaves running is stopped until the next cell (docs/sessions.md): a timer that ends the
    interpreter 0.3 s on does so during the next cell, which is answered for it, and the session ends."""
    with client.open_session() as dying:
        assert dying.run("import os, threading\nthreading.Timer(0.3, os._exit, (3,)).start()").ok
        time.sleep(1)
        ended = dying.run("import time\ntime.sleep(2)")
        assert (ended.status, ended.session_alive) == (Status.RUNTIME_ERROR, False), ended
        assert "exited with status 3" in ended.message, ended


# What the final cell's own child (close_fds=False, as os.system would) can reach of the check: its descriptors,
# memory and environment through /proc, and any socket the check holds (the results socket: an answer of its own).
FINAL_CHILD = """
import os, stat
ppid = os.getppid()
reached = []
for what, reach in (("fd", lambda: os.listdir(f"/proc/{ppid}/fd")), ("mem", lambda: open(f"/proc/{ppid}/mem", "rb")),
                    ("environ", lambda: open(f"/proc/{ppid}/environ", "rb").read())):
    try:
        reach()
        reached.append(what)
    except OSError:
        pass
sockets = 0
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        sockets += stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        pass  # the listing's own descriptor, closed since
print(reached, sockets)
"""


def test_a_final_cell_runs_in_a_fresh_interpreter_on_the_sessions_files(client: SandboxClient) -> None:
    """A final cell (the check of what a session left): the session's processes killed, its interpreter's state
    gone, its files there; the check's own children can neither trace it nor answer for it; the session ends."""
    with client.open_session(timeout=20) as session:
        leftover = session.run(
            "import builtins, os, subprocess\nopen('answer.txt', 'w').write('41')\nos.makedirs('sub')\n"
            "os.chdir('sub')\nx = 1\nos.environ['PYTHONPATH'] = os.getcwd()\nbuiltins.abs = lambda value: 0\n"
            "subprocess.Popen(['sleep', '1000'], start_new_session=True).pid")
        assert leftover.ok, leftover
        final = session.run(
            "import ctypes, os, subprocess, sys\nhome = os.environ['HOME']\n"
            "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid() and "
            "os.stat('/proc/' + p).st_uid == os.getuid()]\n"
            f"child = subprocess.run([sys.executable, '-I', '-c', {FINAL_CHILD!r}], close_fds=False, "
            "capture_output=True, text=True)\n"
            "('x' in globals(), os.getcwd() == home, [p for p in sys.path if p in ('', '.') or p.startswith(home)], "
            "open('answer.txt').read(), 'PYTHONPATH' in os.environ, abs(-1), others, "
            "ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), child.stdout.strip(), child.stderr)", final=True)
        assert (final.status, final.session_alive) == (Status.OK, False), final
        assert final.value == "(False, True, [], '41', False, 1, [], 0, '[] 0', '')", final
        with pytest.raises(SessionNotFound, match="closed by its final cell"):
            session.run("1")


def test_a_final_bash_cell_restores_none_of_the_sessions_shell_state(client: SandboxClient) -> None:
    with client.open_session("bash") as shell:
        assert shell.run("echo 41 > answer.txt && mkdir sub && echo 42 > sub/answer.txt && cd sub && "
                         "head() { echo 42; } && python3() { echo 42; } && export ANSWER=42 PATH=/nowhere:$PATH && "
                         "shopt -s nullglob").ok
        own = shell.run("head answer.txt; python3; shopt -q nullglob && echo nullglob")
        assert own.stdout == "42\n42\nnullglob\n", own
        final = shell.run("head answer.txt; python3 -c 'print(6 * 7)'; echo \"${ANSWER:-unset}\" \"$PATH\"; "
                          "[ \"$PWD\" = \"$HOME\" ] && echo home; shopt -q nullglob || echo no-nullglob", final=True)
        assert (final.status, final.session_alive) == (Status.OK, False), final
        assert final.stdout == "41\n42\nunset /usr/local/bin:/usr/bin:/bin\nhome\nno-nullglob\n", final
        with pytest.raises(SessionNotFound):
            shell.run("true")


def test_client_rejects_bad_session_arguments(client: SandboxClient) -> None:
    with pytest.raises(InvalidRequest):
        client.open_session(idle_timeout=-1)


async def _episode(client: AsyncSandboxClient, number: int) -> list[str]:
    async with await client.open_session() as session:
        values = []
        for step in range(3):
            result = await session.run(f"total = {number} + {step} if {step} == 0 else total + {step}\ntotal")
            assert result.ok, result
            values.append(result.value)
        return values


def test_256_concurrent_sessions_all_answered(daemon: DaemonProcess) -> None:
    count = 256

    async def main() -> list[list[str]]:
        async with AsyncSandboxClient(daemon.address) as client:
            await client.set_batch_hint(0, sessions=count)
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                pool = _sessions_pool(await client.pool_status())
                if pool.ready * 64 >= count:
                    break
                await asyncio.sleep(0.5)
            try:
                return await asyncio.gather(*(_episode(client, n) for n in range(count)))
            finally:
                await client.set_batch_hint(0, sessions=0)

    results = asyncio.run(main())
    assert results == [[str(n), str(n + 1), str(n + 3)] for n in range(count)]


@pytest.fixture(scope="module")
def strict_daemon(tmp_path_factory: pytest.TempPathFactory, daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """A daemon whose session limits are small enough to reach in a test: 1 sandbox of 2 slots."""
    process = DaemonProcess(tmp_path_factory.mktemp("strict"), "strict", extra_env={
        "SANDBOXD_POOL_IMAGES": "python",
        "SANDBOXD_POOL_MATH": "false",
        "SANDBOXD_POOL_MIN_SIZE": "1",
        "SANDBOXD_SESSIONS_PER_SANDBOX": "2",
        "SANDBOXD_SESSIONS_MAX_SANDBOXES": "1",
        "SANDBOXD_SESSIONS_MAX_CELLS": "3",
        "SANDBOXD_SESSIONS_MAX_LIFETIME_SECONDS": "4",
        "SANDBOXD_SESSIONS_OPEN_WAIT_SECONDS": "1",
    })
    try:
        process.wait_serving()
        yield process
    finally:
        process.stop()


def test_max_cells_and_lifetime_end_sessions(strict_daemon: DaemonProcess) -> None:
    with SandboxClient(strict_daemon.address) as client:
        with client.open_session() as counted:
            assert counted.run("1").session_alive and counted.run("2").session_alive
            last = counted.run("3")
            assert last.value == "3" and not last.session_alive
            assert "3 cells" in last.message
            with pytest.raises(SessionNotFound, match="reached 3 cells"):
                counted.run("4")
        aging = client.open_session()
        started = time.monotonic()
        with grpc.insecure_channel(strict_daemon.address) as channel:
            stub = pb_grpc.SessionsStub(channel)
            while aging.id in {s.session_id for s in stub.List(pb.ListSessionsRequest(), timeout=10).sessions}:
                # Its idle timeout (600 s) is far away: the lifetime ends it.
                assert time.monotonic() - started < 15, "the session outlived its maximum lifetime"
                time.sleep(0.2)
        assert time.monotonic() - started >= 4 - 0.5
        with pytest.raises(SessionNotFound, match="maximum lifetime of 4 s"):
            aging.run("1")
        aging.close()


def test_sessions_beyond_capacity_are_refused_not_queued(strict_daemon: DaemonProcess) -> None:
    with SandboxClient(strict_daemon.address) as client:
        held = [client.open_session(), client.open_session()]
        try:
            with grpc.insecure_channel(strict_daemon.address) as channel, pytest.raises(grpc.RpcError) as caught:
                pb_grpc.SessionsStub(channel).Open(pb.OpenSessionRequest(), timeout=30)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limit 2" in caught.value.details()
        finally:
            for session in held:
                session.close()
        # The slots are free again once the sessions are closed.
        with client.open_session() as again:
            assert again.run("1 + 1").value == "2"


def test_multi_turn_rollout_example_runs(daemon: DaemonProcess) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "multi_turn_rollout.py"
    done = subprocess.run([sys.executable, str(example), "--address", daemon.address, "--rollouts", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rewards = [line for line in done.stdout.splitlines() if line.startswith("reward")]
    assert len(rewards) == 4 and all(line.startswith("reward +1.0 after 2 tool calls") for line in rewards)
    assert "(True, 385)" in done.stdout  # turn two used `terms`, defined in turn one


def test_file_names_and_messages_that_are_not_utf8_leave_the_cell_answered(client: SandboxClient) -> None:
    """A cell that made a file named b"bad\\xff" failed with UNKNOWN: the name reached the daemon's protobuf as a
    lone surrogate (red-team). So did a message holding one. Bad bytes are written out as \\xNN, surrogates as
    \\udcff, and the session lives on."""
    with client.open_session() as session:
        made = session.run("open(b'bad\\xff', 'w').write('x')\nopen('ok.txt', 'w').write('y')")
        assert made.status == Status.OK and made.session_alive, made
        assert made.files_changed == ("bad\\xff", "ok.txt")
        error = session.run("raise ValueError('bad\\udcff')")
        assert error.status == Status.RUNTIME_ERROR and error.session_alive, error
        assert error.message == "ValueError: bad\\udcff"
        assert session.run("import os\nos.remove(b'bad\\xff')").files_changed == ("bad\\xff",)
    with client.open_session("bash") as session:
        made = session.run("touch $'caf\\xc3\\xa9' $'caf\\xff'")
        assert made.status == Status.OK and made.files_changed == ("caf\\xff", "café"), made


LINK_CELL = ("import errno, os\nos.mkdir('links')\nopen('links/f', 'w').close()\nn, why = 0, 'none'\n"
             "while n < 300_000:\n    try: os.link('links/f', f'links/l{n}')\n"
             "    except OSError as exc: why = errno.errorcode[exc.errno]; break\n    n += 1\nn, why")


def test_a_session_full_of_hard_links_closes_without_ending_its_neighbours(client: SandboxClient) -> None:
    """3 million hard links in a session: its Close removed them on the agent's event loop for more than 10 s,
    and every session in the sandbox ended (red-team). Now a session holds at most sandbox.tmpfs_inodes entries,
    and its files go off the loop; its neighbour goes on and can write files again. (Since issue #52 the cell that
    leaves them ends its session, the links removed before its answer.)"""
    opened = [client.open_session() for _ in range(4)]
    try:
        by_host: dict[str, list] = {}
        for session in opened:
            by_host.setdefault(session.run("import socket\nsocket.gethostname()").value, []).append(session)
        maker, neighbour = next(group for group in by_host.values() if len(group) >= 2)[:2]
        filled = maker.run(LINK_CELL, timeout=60)
        assert (filled.status, filled.session_alive) == (Status.RUNTIME_ERROR, False), filled
        made, why = ast.literal_eval(filled.value)
        assert why == "ENOSPC" and made < config.DEFAULT_TMPFS_INODES, filled.value
        maker.close()
        assert neighbour.run("1").value == "1"
        deadline = time.monotonic() + 60
        while True:  # the maker's links are removed in the background
            wrote = neighbour.run("open('after.txt', 'w').write('ok')")
            if wrote.status == Status.OK or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert wrote.status == Status.OK and wrote.session_alive, wrote
        assert neighbour.run("open('after.txt').read()").value == "'ok'"
    finally:
        for session in opened:
            session.close()
