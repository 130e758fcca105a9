"""Memory no process maps: what a run pins in the kernel (socket buffers, pipes) counts against its own limit.

Red team: a wrong program queued GiB in Unix socketpair send buffers and printed 0. The sweep (RssAnon +
RssShmem) never saw it; the sandbox's memory cgroup was charged, and the OOM killer, which weighs processes by
what they map, took its neighbours instead: correct function-call jobs scored -1.0, sessions holding 150 MiB
were killed, and sandboxes were recycled by the dozen. Each attack here runs beside correct jobs or sessions in
the same sandbox.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import grpc
import pytest
from sandboxd_client import Limit, SandboxClient, Status
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from sandboxd.agent.host.runner import LOWERED_MESSAGE
from tests.conftest import DaemonProcess, serving_daemon
from tests.integration import helpers

pytestmark = pytest.mark.docker

# Fills socketpair send buffers (SO_SNDBUF as high as net.core.wmem_max lets it: 8 MiB each on this host, 416 KiB
# under Linux's default) in 8 processes until each has no descriptor left, then holds them: GiB in the kernel,
# 5 MiB resident per process. Each process stops at its first failed send (the sandbox's memory is full).
PIN_SOCKETS = '''
import os, socket, time

def _pin():
    pairs = []
    while True:
        try:
            a, b = socket.socketpair()
        except OSError:
            return pairs
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
        a.setblocking(False)
        try:
            while True:
                a.send(b"x" * (1 << 16))
        except BlockingIOError:
            pairs.append((a, b))
        except OSError:
            return pairs

for _ in range(7):
    if os.fork() == 0:
        _pin()
        time.sleep(60)
        os._exit(0)
_held = _pin()
time.sleep(2)
'''
# The same, prepared: 16 processes each open socketpairs until no descriptor is left (about 8,000 sockets, 20 MiB
# of kernel memory, empty), wait together for a second (a sweep over that many sockets takes long enough that
# the pause after it stretches), then fill them all at once.
PIN_PREPARED = '''
import os, socket, time

start = time.time() + 1.0

def _pin():
    pairs = []
    while True:
        try:
            a, b = socket.socketpair()
        except OSError:
            break
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
        a.setblocking(False)
        pairs.append((a, b))
    time.sleep(max(0.0, start - time.time()))
    for a, _ in pairs:
        try:
            while True:
                a.send(b"x" * (1 << 16))
        except BlockingIOError:
            pass
        except OSError:
            break
    return pairs

for _ in range(15):
    if os.fork() == 0:
        _pin()
        time.sleep(60)
        os._exit(0)
_held = _pin()
time.sleep(2)
'''
# The same, with each process lowering its OOM score to 0 (the agent's) every millisecond from a thread: the
# sandbox was recycled 3 times in 3, its agent taken by the OOM killer.
PIN_LOWERING = PIN_PREPARED.replace("def _pin():\n", '''def _lower(fd):
    while True:
        try:
            os.pwrite(fd, b"0", 0)
        except OSError:
            pass
        time.sleep(0.001)

def _pin():
    import threading
    threading.Thread(target=_lower, args=(os.open("/proc/self/oom_score_adj", os.O_WRONLY),), daemon=True).start()
''', 1)
# The same with pipes: 1 MiB each (fs.pipe-max-size) while the uid holds under fs.pipe-user-pages-soft (64 MiB),
# then the two pages Linux gives a pipe past it.
PIN_PIPES = '''
import fcntl, os, time

def _pin():
    pipes = []
    while True:
        try:
            r, w = os.pipe()
        except OSError:
            return pipes
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError:
            pass
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * (1 << 16))
        except BlockingIOError:
            pipes.append((r, w))
        except OSError:
            return pipes

for _ in range(199):
    if os.fork() == 0:
        _pin()
        time.sleep(60)
        os._exit(0)
_held = _pin()
time.sleep(2)
'''
ADD_FUNCTION = {"fn_name": "add", "inputs": [[1, 2], [5, 5]], "outputs": [3, 10]}
ADD_ASSERTS = {"test_list": ["assert add(1, 2) == 3", "assert add(5, 5) == 10"]}
CORRECT_ADD = "```python\ndef add(a, b):\n    return a + b\n```"
STDIO_SUM = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
CORRECT_SUM = "```python\nprint(sum(map(int, input().split())))\n```"


def _attacker(pin: str) -> pb.Job:
    """A function-call job whose program pins kernel memory as it loads, then adds wrong."""
    return helpers.code(f"```python\n{pin}\ndef add(a, b):\n    return 0\n```", ADD_FUNCTION, timeout=20)


def _stdio_attacker(pin: str) -> pb.Job:
    return helpers.code(f"```python\n{pin}\nprint(0)\n```", STDIO_SUM, timeout=20)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One python sandbox of 4 job slots and one sessions sandbox, each of 1.5 GiB, jobs limited to 256 MiB."""
    with serving_daemon(tmp_path_factory.mktemp("kmem"), "kmem", extra_env={
        "SANDBOXD_POOL_MATH": "false", "SANDBOXD_POOL_IMAGES": "python", "SANDBOXD_POOL_MIN_SIZE": "1",
        "SANDBOXD_POOL_MAX_SIZE": "1", "SANDBOXD_POOL_JOBS_PER_SANDBOX": "4",
        "SANDBOXD_SANDBOX_MEMORY_BYTES": str(1536 << 20),
        "SANDBOXD_LIMITS_DEFAULT_MEMORY_BYTES": str(256 << 20), "SANDBOXD_LIMITS_MAX_MEMORY_BYTES": str(1 << 30),
        "SANDBOXD_SESSIONS_PER_SANDBOX": "6", "SANDBOXD_SESSIONS_MAX_SANDBOXES": "1",
    }) as process:
        yield process


@pytest.fixture(scope="module")
def channel(daemon: DaemonProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.address) as channel:
        helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 1)
        yield channel


def _recycled(channel: grpc.Channel, pool: str) -> int:
    status = pb_grpc.PoolStub(channel).GetStatus(pb.GetPoolStatusRequest(), timeout=10)
    return next(p for p in status.pools if p.name == pool).recycled_total


@pytest.mark.parametrize("pin", [PIN_SOCKETS, PIN_PREPARED, PIN_LOWERING, PIN_PIPES],
                         ids=["sockets", "prepared", "lowering", "pipes"])
def test_kernel_memory_a_job_pins_is_its_memory_limit_and_spares_its_neighbours(
        channel: grpc.Channel, pin: str) -> None:
    """Two attackers (a function-call job and a stdio job) beside twelve correct jobs of both kinds, four slots in
    one sandbox: each attacker ends as its own STATUS_MEMORY_LIMIT on its first attempt, every correct job passes
    (a retry for a job crowded out is no harm), and the sandbox is not recycled."""
    recycled = _recycled(channel, "python")
    correct = [helpers.code(CORRECT_ADD, ADD_FUNCTION), helpers.code(CORRECT_ADD, ADD_ASSERTS),
               helpers.code(CORRECT_SUM, STDIO_SUM)] * 4
    with concurrent.futures.ThreadPoolExecutor(14) as threads:
        attacks = [threads.submit(helpers.run, channel, job) for job in (_attacker(pin), _stdio_attacker(pin))]
        beside = [threads.submit(helpers.run, channel, job) for job in correct]
        attacked = [attack.result() for attack in attacks]
        neighbours = [job.result() for job in beside]
    assert [(r.status, r.reward) for r in neighbours] == [(pb.STATUS_OK, 1.0)] * len(correct), [
        (r.status, r.message, r.attempts) for r in neighbours]
    assert _recycled(channel, "python") == recycled
    for result in attacked:
        assert (result.status, result.limit_hit, result.reward, result.attempts) == (
            pb.STATUS_MEMORY_LIMIT, pb.LIMIT_MEMORY, -1.0, 1), (result.status, result.message, result.attempts)
        # Lowering its score, it may be killed for that before a sweep sees it pin.
        assert "of it in the kernel" in result.message or (
            pin is PIN_LOWERING and result.message == LOWERED_MESSAGE), result.message


HOLD_150_MIB = "held = bytearray(b'x') * (150 << 20)\nlen(held)"


@pytest.mark.parametrize("pin", [PIN_SOCKETS, PIN_PREPARED, PIN_LOWERING], ids=["sockets", "prepared", "lowering"])
def test_kernel_memory_a_session_pins_is_its_memory_limit_and_spares_its_neighbours(
        daemon: DaemonProcess, channel: grpc.Channel, pin: str) -> None:
    """Three sessions of 150 MiB each beside a session whose cell pins socket buffers, in one sandbox: the cell
    ends as its session's STATUS_MEMORY_LIMIT, the three answer their next cell with their state kept, and the
    sandbox is not recycled."""
    recycled = _recycled(channel, "sessions")
    with SandboxClient(daemon.address) as client:
        holders = [client.open_session(memory_bytes=256 << 20, timeout=30) for _ in range(3)]
        try:
            for holder in holders:
                assert holder.run(HOLD_150_MIB).value == str(150 << 20)
            with client.open_session(memory_bytes=256 << 20, timeout=30) as attacker:
                pinned = attacker.run(pin + "\n0")
            for holder in holders:
                after = holder.run("len(held)")
                assert (after.status, after.value) == (Status.OK, str(150 << 20)), after
            assert (pinned.status, pinned.limit_hit) == (Status.MEMORY_LIMIT, Limit.MEMORY), pinned
        finally:
            for holder in holders:
                holder.close()
    assert _recycled(channel, "sessions") == recycled


def test_a_function_call_candidate_the_oom_killer_takes_under_its_limit_is_retried(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The two-process harness: a candidate the OOM killer took while it held less than its limit and half the
    sandbox is retried, as a stdio run is. Three candidates of 150 MiB each within their 256 MiB limit, in a
    sandbox of 384 MiB. Which comes first, the judge's "died" or the exit's report, is a race that this test
    does not steer (it passed before the fix too); tests/agent/test_controller.py sets the order that failed."""
    hold = ("```python\nimport time\n_held = bytearray(b'x') * (150 << 20)\ntime.sleep(3)\n"
            "def add(a, b):\n    return a + b\n```")
    with serving_daemon(tmp_path_factory.mktemp("oomharness"), "oomh", extra_env={
        "SANDBOXD_POOL_MATH": "false", "SANDBOXD_POOL_IMAGES": "python", "SANDBOXD_POOL_MIN_SIZE": "1",
        "SANDBOXD_POOL_MAX_SIZE": "1", "SANDBOXD_POOL_JOBS_PER_SANDBOX": "3", "SANDBOXD_SESSIONS_ENABLED": "false",
        "SANDBOXD_SANDBOX_MEMORY_BYTES": str(384 << 20), "SANDBOXD_LIMITS_DEFAULT_MEMORY_BYTES": str(256 << 20),
        "SANDBOXD_LIMITS_MAX_MEMORY_BYTES": str(384 << 20),
    }) as process, grpc.insecure_channel(process.address) as oom_channel:
        helpers.pool_settled(pb_grpc.PoolStub(oom_channel), "python", 1)
        with concurrent.futures.ThreadPoolExecutor(3) as threads:
            results = list(threads.map(
                lambda _: helpers.run(oom_channel, helpers.code(hold, ADD_FUNCTION, timeout=20)), range(3)))
    assert [(r.status, r.reward) for r in results] == [(pb.STATUS_OK, 1.0)] * 3, [
        (r.status, r.message, list(r.tests), r.attempts) for r in results]
    assert max(r.attempts for r in results) >= 2, results
