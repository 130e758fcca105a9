"""A run against its own sandbox: what it forks, leaves behind or hands back must not harm its score or the next job."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import serving_daemon
from tests.integration import helpers

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    """One python sandbox (two jobs at once): each job's next one runs where it ran."""
    with serving_daemon(tmp_path_factory.mktemp("runs"), "runs", extra_env={
        "SANDBOXD_POOL_MATH": "false", "SANDBOXD_POOL_IMAGES": "python", "SANDBOXD_POOL_MIN_SIZE": "1",
        "SANDBOXD_POOL_MAX_SIZE": "1", "SANDBOXD_SESSIONS_ENABLED": "false",
    }) as process, grpc.insecure_channel(process.address, options=[
            ("grpc.max_receive_message_length", 64 << 20)]) as channel:
        yield channel


def _recycled(channel: grpc.Channel) -> int:
    status = pb_grpc.PoolStub(channel).GetStatus(pb.GetPoolStatusRequest(), timeout=10)
    return next(p for p in status.pools if p.name == "python").recycled_total


@pytest.mark.parametrize(("child", "parent_sees"), [
    ("print('child', flush=True)\n", "0"),  # falls off the end of the program
    ("sys.exit(3)\n", "3"),
    ("raise ValueError('in the child')\n", "1"),
], ids=["end", "sys.exit", "raise"])
def test_a_forked_child_that_ends_ends_alone(channel: grpc.Channel, child: str, parent_sees: str) -> None:
    """As under `python main.py`, the child's end is its own: it wrote the run's status, which ended the run there
    with the child's exit status and the parent killed before its output (a correct program scored wrong)."""
    code = ("import os, sys\npid = os.fork()\nif pid == 0:\n" + "".join(f"    {line}\n" for line in child.splitlines())
            + "else:\n    _, status = os.waitpid(pid, 0)\n    print('parent', os.waitstatus_to_exitcode(status))\n")
    result = helpers.run(channel, helpers.execute(code))
    assert result.status == pb.STATUS_OK, (result.message, result.execute.stderr)
    assert result.execute.stdout.endswith(f"parent {parent_sees}\n".encode()), result.execute.stdout
    # A stdio test of such a program passes.
    completion = f"```python\n{code}```"
    expected = f"child\nparent {parent_sees}\n" if parent_sees == "0" else f"parent {parent_sees}\n"
    scored = helpers.run(channel, pb.Job(limits=pb.Limits(timeout_seconds=5), code=pb.CodeJob(
        completion=completion, tests=pb.CodeTests(stdio=[pb.StdioCase(stdin="", expected_stdout=expected)]))))
    assert scored.status == pb.STATUS_OK and scored.reward == 1.0, scored


# A correct add() that forks for nothing; the child comes back into the harness with a wrong answer.
FORKING_ADD = """```python
import os

if os.fork() == 0:
    pass  # a child at load time falls through to the harness too
else:
    os.wait()

def add(a, b):
    pid = os.fork()
    if pid == 0:
        return -1
    os.waitpid(pid, 0)
    return a + b
```"""


@pytest.mark.parametrize("tests", [
    {"fn_name": "add", "inputs": [[1, 2], [5, 5], [0, 0]], "outputs": [3, 10, 0]},
    {"test_list": ["assert add(1, 2) == 3", "assert add(5, 5) == 10", "assert add(0, 0) == 0"]},
], ids=["function-call", "asserts"])
def test_a_program_that_forks_is_scored_on_its_own_answers(channel: grpc.Channel, tests: dict) -> None:
    """The forked child returned into the harness and answered on the channel it shares with its parent:
    the judge read the child's -1 (or its second "ready") as the answer, and a correct program failed."""
    result = helpers.run(channel, helpers.code(FORKING_ADD, tests))
    assert result.status == pb.STATUS_OK and result.reward == 1.0, (result.message, list(result.tests))


POOLED_SUM_OF_SQUARES = """```python
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import Pool

def square(x):
    return x * x

def sum_squares(n):
    with Pool(2) as pool:
        pooled = sum(pool.map(square, range(n)))
    with ProcessPoolExecutor(2) as executor:
        assert sum(executor.map(square, range(n))) == pooled
    return pooled
```"""


@pytest.mark.parametrize("tests", [
    {"fn_name": "sum_squares", "inputs": [[3], [4]], "outputs": [5, 14]},
    {"test_list": ["assert sum_squares(3) == 5", "assert sum_squares(4) == 14"]},
], ids=["function-call", "asserts"])
def test_a_program_that_uses_a_process_pool_passes(channel: grpc.Channel, tests: dict) -> None:
    """The pool's workers are forked children that never return into the harness: ending forked children
    that come back (above) must not end these, nor may their exits end the run."""
    result = helpers.run(channel, helpers.code(POOLED_SUM_OF_SQUARES, tests, timeout=20))
    assert result.status == pb.STATUS_OK and result.reward == 1.0, (result.message, list(result.tests))


# A correct add, and a table whose syntax tree takes the judge about 430 MiB to build (compile() takes the
# candidate 315 MiB): past the judge's budget for a job of 384 MiB (the job's memory limit, and at least
# judgeserver.JOB_MEMORY_BYTES, 256 MiB).
LARGE_TREE = "```python\ndef add(a, b):\n    return a + b\n\n\nTABLE = [" + "1," * 450_000 + "]\n```"
CORRECT_ADD = "```python\ndef add(a, b):\n    return a + b\n```"
ADD_ASSERTS = {"test_list": ["assert add(1, 2) == 3", "assert add(5, 5) == 10"]}


def test_a_program_too_large_for_the_judge_is_its_memory_limit_and_spares_its_neighbours(
        channel: grpc.Channel) -> None:
    """The judge parses an assert job's program for the names its tests may call. It did so without a bound on
    its memory: this program's tree took 430 MiB of the sandbox's memory, beside its other jobs, and the job
    passed. Now a tree past the judge's budget is the model's failure at the memory limit, and the jobs beside it
    and after it on the same sandbox are judged as ever."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        large = helpers.code(LARGE_TREE, ADD_ASSERTS)
        large.limits.memory_bytes = 384 << 20
        attack = pool.submit(helpers.run, channel, large)
        beside = pool.submit(helpers.run, channel, helpers.code(CORRECT_ADD, ADD_ASSERTS))
        result, neighbour = attack.result(), beside.result()
    assert (result.status, result.limit_hit, result.reward) == (pb.STATUS_MEMORY_LIMIT, pb.LIMIT_MEMORY, -1.0), result
    assert "more memory or nesting to parse than the judge may use" in result.message, result.message
    assert neighbour.status == pb.STATUS_OK and neighbour.reward == 1.0, neighbour
    after = helpers.run(channel, helpers.code(CORRECT_ADD, ADD_ASSERTS))
    assert after.status == pb.STATUS_OK and after.reward == 1.0, after


def test_arguments_execve_cannot_take_are_invalid_argument(channel: grpc.Channel) -> None:
    """A NUL ended the run with exit status 1 and no word of why: the caller's slip, scored as the model's."""
    job = helpers.execute('echo "$@"', language="bash")
    job.execute.args.extend(["fine", "a\0b"])
    with pytest.raises(grpc.RpcError) as caught:
        helpers.run(channel, job)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("jobs[0].execute.args[1] holds a NUL"), caught.value.details()
    del job.execute.args[1]
    assert helpers.run(channel, job).execute.stdout == b"fine\n"


# Everything a run can leave where the next run of its sandbox could look, in one go: a POSIX message queue, a
# listening Unix socket and a flock()ed file in /dev/shm, a folder tree there it made unreadable, System V IPC
# objects, a process in a session of its own, and its own work dir made mode 000 (the agent removes it all).
LEAVE = r"""
import ctypes, fcntl, os, socket, time
os.umask(0)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
queue = rt.mq_open(b"/left-queue", os.O_CREAT | os.O_RDWR, 0o666, None)
listener = socket.socket(socket.AF_UNIX)
listener.bind("/dev/shm/left-socket")
listener.listen()
lock = open("/dev/shm/left-lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
os.makedirs("/dev/shm/left-tree/a/b")
os.chmod("/dev/shm/left-tree/a", 0)
libc = ctypes.CDLL(None, use_errno=True)
ipc = [libc.semget(0x5C5C, 4, 0o1666), libc.shmget(0x5D5D, 1 << 20, 0o1666), libc.msgget(0x5E5E, 0o1666)]
if os.fork() == 0:
    os.setsid()
    time.sleep(600)
os.chmod(".", 0)
print(queue >= 0, sorted(os.listdir("/dev/shm")), min(ipc) >= 0, sorted(os.listdir("/dev/mqueue")))
"""
FIND = r"""
import ctypes, os
rt = ctypes.CDLL("librt.so.1", use_errno=True)
libc = ctypes.CDLL(None, use_errno=True)
print(rt.mq_open(b"/left-queue", os.O_RDWR, 0, None), os.listdir("/dev/mqueue"), os.listdir("/dev/shm"),
      libc.semget(0x5C5C, 0, 0), libc.shmget(0x5D5D, 0, 0), libc.msgget(0x5E5E, 0),
      sorted(os.listdir(".")), os.stat(".").st_mode & 0o777)
"""


def test_what_a_run_leaves_in_shared_places_is_gone_for_the_next_run(channel: grpc.Channel) -> None:
    recycled = _recycled(channel)
    left = helpers.run(channel, helpers.execute(LEAVE))
    assert left.execute.stdout == (b"True ['left-lock', 'left-socket', 'left-tree'] True ['left-queue']\n"), left
    for _ in range(3):  # with two runs at once, the next lands on the same sandbox with or without a pause
        found = helpers.run(channel, helpers.execute(FIND))
        assert found.execute.stdout == b"-1 [] [] -1 -1 -1 [] 448\n", found
    assert _recycled(channel) == recycled  # all of it cleaned, none of it damaged the sandbox


GROW = r"""
import os, socket, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open("grows", "ab", buffering=0) as out:
            while out.tell() < (8 << 20):
                out.write(b"x" * 4096)
            time.sleep(600)
    os._exit(0)
while os.path.getsize("grows") < (1 << 20) if os.path.exists("grows") else True:
    time.sleep(0.01)
socket.socket(socket.AF_UNIX).bind("socket")
os.symlink("/proc/1/environ", "link")
os.mkfifo("fifo")
with open("sparse", "w") as sparse:
    sparse.truncate(60 << 20)
"""


def test_files_collected_are_read_once_the_run_is_gone(channel: grpc.Channel) -> None:
    """A file a daemonised child still writes, a socket, a link to the agent's environment, a fifo and a sparse
    60 MiB file: the growing file is read once every process of the run is gone, the sparse one is cut at 16 MiB,
    the others are left out, and nothing of it holds up the agent."""
    job = helpers.execute(GROW, timeout=20)
    job.execute.collect_files.extend(["sparse", "socket", "link", "fifo", "grows"])
    result = helpers.run(channel, job)
    assert result.status == pb.STATUS_OK, (result.message, result.execute.stderr)
    files = {f.path: f.content for f in result.execute.files}
    assert sorted(files) == ["grows", "sparse"], sorted(files)
    assert files["sparse"] == bytes(16 << 20)
    assert (1 << 20) <= len(files["grows"]) <= (8 << 20) and set(files["grows"]) == {ord("x")}
    # The child that wrote it is gone, with the rest of the run.
    assert helpers.run(channel, helpers.execute("import os; print(os.listdir('.'))")).execute.stdout == b"[]\n"
