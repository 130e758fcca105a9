"""Attacks on the sandbox: each must fail safely and leave the next job unharmed."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess
from tests.integration import helpers

pytestmark = pytest.mark.docker


def outcome(channel: grpc.Channel, code: str, **kwargs: object) -> pb.JobResult:
    return helpers.run(channel, helpers.execute(code, **kwargs))


def test_plain_run(channel: grpc.Channel) -> None:
    result = outcome(channel, "print(input()[::-1])", stdin=b"olleh\n")
    assert result.status == pb.STATUS_OK
    assert result.execute.stdout == b"hello\n"
    assert result.reward == 1.0


@pytest.mark.parametrize(
    "code",
    [
        # DNS, TCP to the host's Docker socket port and to the bridge gateway: no network at all.
        "import socket; socket.getaddrinfo('example.com', 443)",
        "import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)",
        "import socket; socket.create_connection(('172.17.0.1', 2375), timeout=2)",
        "import urllib.request; urllib.request.urlopen('http://1.1.1.1', timeout=2)",
    ],
)
def test_no_network(channel: grpc.Channel, code: str) -> None:
    result = outcome(channel, code)
    assert result.status == pb.STATUS_RUNTIME_ERROR
    assert any(word in result.execute.stderr for word in (b"gaierror", b"Error", b"refused", b"unreachable"))


def test_only_loopback_interface(channel: grpc.Channel) -> None:
    result = outcome(channel, "import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert result.execute.stdout.strip() == b"['lo']"


# /var/tmp and /run/lock are 1777 in the image and on the root file system,
# which a restored container has writable: there a job could fill the host's disk.
@pytest.mark.parametrize("path", ["/etc/passwd", "/usr/bin/evil", "/opt/sandboxd/sandboxd/agent/x.py",
                                  "/tmp/shared", "/run/sandboxd-agent/x", "/root/x", "/var/tmp/x", "/run/lock/x"])
def test_cannot_write_outside_workdir(channel: grpc.Channel, path: str) -> None:
    result = outcome(channel, f"open({path!r}, 'w').write('x')")
    assert result.status == pb.STATUS_RUNTIME_ERROR
    assert b"Error" in result.execute.stderr


def test_workdir_is_private_and_fresh(channel: grpc.Channel) -> None:
    writer = outcome(channel, "import os; open('secret.txt', 'w').write('42'); print(os.getcwd())")
    first_dir = writer.execute.stdout.decode().strip()
    reader = outcome(channel, f"import os; print(os.listdir('.')); print(os.path.exists({first_dir!r} + "
                              "'/secret.txt'))")
    assert reader.execute.stdout.decode().split("\n")[:2] == ["[]", "False"]


def test_cannot_list_other_workdirs_or_reach_agent(channel: grpc.Channel) -> None:
    result = outcome(channel, "import os\nfor p in ('/tmp/sandboxd', '/run/sandboxd-agent'):\n"
                              "    try: os.listdir(p); print('listed', p)\n    except OSError: print('denied')")
    assert result.execute.stdout.decode().split() == ["denied", "denied"]


def test_runs_unprivileged(channel: grpc.Channel) -> None:
    result = outcome(channel, "import os; print(os.getuid(), os.geteuid());"
                              "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
    uid, euid, caps = result.execute.stdout.decode().split()
    assert int(uid) >= 20000 and uid == euid
    assert int(caps, 16) == 0


def test_cannot_kill_agent(channel: grpc.Channel) -> None:
    result = outcome(channel, "import os, signal\nfor pid in (1, 2, 3, -1):\n    try: os.kill(pid, signal.SIGKILL)\n"
                              "    except OSError as e: print(type(e).__name__)")
    assert result.status == pb.STATUS_OK
    after = outcome(channel, "print('alive')")
    assert after.execute.stdout == b"alive\n"


def test_fork_bomb_contained(channel: grpc.Channel) -> None:
    result = outcome(channel, "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=2)
    assert result.status == pb.STATUS_TIMEOUT
    assert outcome(channel, "print('next')").execute.stdout == b"next\n"


def test_memory_bomb_reported_as_memory_limit(channel: grpc.Channel) -> None:
    result = outcome(channel, "x = bytearray(3 << 30)", memory=256 << 20)
    assert result.status == pb.STATUS_MEMORY_LIMIT
    assert result.limit_hit == pb.LIMIT_MEMORY


def test_gradual_memory_growth(channel: grpc.Channel) -> None:
    result = outcome(channel, "chunks = []\nwhile True: chunks.append(bytearray(16 << 20))", memory=256 << 20)
    assert result.status == pb.STATUS_MEMORY_LIMIT


def test_output_flood_truncated(channel: grpc.Channel) -> None:
    # 1 GB attempted; the daemon keeps the configured cap and kills the writer.
    result = outcome(channel, "import sys\nfor _ in range(16384): sys.stdout.write('x' * 65536)",
                     output=1 << 20, timeout=20)
    assert result.status == pb.STATUS_OUTPUT_LIMIT
    assert result.limit_hit == pb.LIMIT_OUTPUT
    assert len(result.execute.stdout) + len(result.execute.stderr) <= 1 << 20


def test_infinite_loop_timeout(channel: grpc.Channel) -> None:
    result = outcome(channel, "while True: pass", timeout=1)
    assert result.status == pb.STATUS_TIMEOUT
    assert result.limit_hit in (pb.LIMIT_WALL_TIME, pb.LIMIT_CPU_TIME)
    assert result.reward == -1.0


def test_sleeping_job_timeout(channel: grpc.Channel) -> None:
    result = outcome(channel, "import time; time.sleep(60)", timeout=1)
    assert result.status == pb.STATUS_TIMEOUT
    assert result.limit_hit == pb.LIMIT_WALL_TIME


def _job_processes(channel: grpc.Channel) -> int:
    """How many job processes the sandbox that runs this has, the counting one included."""
    survivors = outcome(channel, "import os\nRESIDENT = ('sandboxd-judge\\n',)\nn = 0\n"
                                 "for p in os.listdir('/proc'):\n    if p.isdigit():\n"
                                 "        try: n += (os.stat('/proc/' + p).st_uid >= 20000 and\n"
                                 "                   open(f'/proc/{p}/comm').read() not in RESIDENT)\n"
                                 "        except OSError: pass\nprint(n)")
    # Long-lived test judges, named sandboxd-judge, are not jobs.
    return int(survivors.execute.stdout)


# Forks 150 children (151 processes of the job's uid, the limit being 256),
# holds them for 3 s, and says how many forks the kernel refused.
HOLD_PROCESSES = ("import os, time\nstart = time.time()\nchildren, refused = 0, 0\nfor _ in range(150):\n"
                  "    try: pid = os.fork()\n    except OSError: refused += 1; continue\n"
                  "    if pid == 0: time.sleep(6); os._exit(0)\n    children += 1\n"
                  "while time.time() < start + 3: time.sleep(0.05)\n"
                  "print(os.getuid(), children, refused, start, time.time())")


def test_a_job_holding_processes_does_not_starve_another_sandboxes_job(tmp_path: Path) -> None:
    """The kernel counts RLIMIT_NPROC per uid across the host: sandboxes that hand out the same uids let a
    job in one make forks fail in another. Two jobs at once, one per sandbox (jobs_per_sandbox = 1)."""
    daemon = DaemonProcess(tmp_path, "uids", extra_env={"SANDBOXD_POOL_MATH": "false", "SANDBOXD_POOL_IMAGES": "python",
                                                        "SANDBOXD_POOL_JOBS_PER_SANDBOX": "1"})
    try:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.address) as channel:
            helpers.pool_settled(pb_grpc.PoolStub(channel), "python", 2)
            results: list[pb.JobResult] = []
            jobs = [threading.Thread(target=lambda: results.append(outcome(channel, HOLD_PROCESSES, timeout=20)))
                    for _ in range(2)]
            for job in jobs:
                job.start()
            for job in jobs:
                job.join(120)
        assert [r.status for r in results] == [pb.STATUS_OK] * 2, results
        (uid_a, children_a, refused_a, start_a, end_a), (uid_b, children_b, refused_b, start_b, end_b) = (
            [float(word) for word in r.execute.stdout.split()] for r in results)
        assert start_a < end_b - 1 and start_b < end_a - 1, "the two jobs did not run at once"
        assert (children_a, refused_a, children_b, refused_b) == (150, 0, 150, 0)
        assert uid_a != uid_b
    finally:
        assert daemon.stop() == 0


def test_background_process_gone_before_next_job(channel: grpc.Channel) -> None:
    spawn = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
             "        time.sleep(600)\n    os._exit(0)\nprint('spawned')")
    for _ in range(4):  # lands on every warm sandbox at least once
        assert outcome(channel, spawn).execute.stdout == b"spawned\n"
    assert _job_processes(channel) == 1  # no leftover sleepers from earlier jobs


DEEP_FOLDER = ("import os\nos.chdir({where!r})\nos.mkdir('deep_rt')\nos.chdir('deep_rt')\n"
               "for _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\nprint('built')")


@pytest.mark.parametrize("where", ["/dev/shm", "."])
def test_a_folder_too_deep_for_rmtree_is_removed(channel: grpc.Channel, where: str) -> None:
    """Python 3.11's rmtree recursed and raised RecursionError: the agent died and the job was retried 3 times."""
    for _ in range(3):
        result = outcome(channel, DEEP_FOLDER.format(where=where))
        assert result.status == pb.STATUS_OK and result.attempts == 1, result
        follow_up = outcome(channel, "print(1)")
        assert follow_up.execute.stdout == b"1\n" and follow_up.attempts == 1, follow_up
    listing = outcome(channel, "import os\nprint(os.path.exists('/dev/shm/deep_rt'))")
    assert listing.execute.stdout == b"False\n"


# A Python run reports its exit status on a pipe of its own just before it
# exits, so that the answer need not wait for the exit. The program can find
# that pipe and write to it: this must end its run right there, as
# os._exit(5) would, and not leave it running past its answer.
FAKE_STATUS = ("import os, time\nprint('before', flush=True)\n{close}"
               "for fd in range(3, 64):\n    try: os.write(fd, bytes([5]))\n    except OSError: pass\n"
               "time.sleep(1)\nprint('after', flush=True)\ntime.sleep(600)")


@pytest.mark.parametrize("close", ["", "os.closerange(0, 3)\n"], ids=["output-open", "output-closed"])
def test_status_written_early_ends_the_run_there(channel: grpc.Channel, close: str) -> None:
    for _ in range(4):  # lands on every warm sandbox at least once
        result = outcome(channel, FAKE_STATUS.format(close=close), timeout=60)
        assert result.status == pb.STATUS_RUNTIME_ERROR, result.message
        assert result.execute.exit_code == 5
        assert result.execute.stdout == b"before\n"
    assert _job_processes(channel) == 1


# The same from a second thread, while the main thread ends alone (in /proc
# the process then looks like a zombie): the thread must not outlive the
# answer to leave files for the next job.
THREAD_STATUS = ("import ctypes, os, threading, time\n"
                 "def late():\n    os.closerange(0, 3)\n"
                 "    for fd in range(3, 64):\n        try: os.write(fd, bytes([0]))\n        except OSError: pass\n"
                 "    for i in range(400):\n"
                 "        for d in ('/dev/shm', '/var/tmp', '/run/lock'):\n"
                 "            try: os.close(os.open(f'{d}/late-{i}', os.O_CREAT | os.O_WRONLY, 0o644))\n"
                 "            except OSError: pass\n"
                 "        time.sleep(0.005)\n"
                 "threading.Thread(target=late).start()\nctypes.CDLL(None).pthread_exit(None)\n")
FIND_LATE = ("import os\nfound = []\nfor d in ('/dev/shm', '/var/tmp', '/run/lock'):\n"
             "    try: found += [n for n in os.listdir(d) if n.startswith('late-')]\n    except OSError: pass\n"
             "print(len(found))")


def test_thread_reporting_after_the_main_thread_ended_leaves_nothing(channel: grpc.Channel) -> None:
    # All attacks first, one per warm sandbox at least, so that the checks
    # land where a surviving thread would still be at work (for 2 s).
    for _ in range(4):
        outcome(channel, THREAD_STATUS, timeout=30)
    for _ in range(4):
        assert outcome(channel, FIND_LATE).execute.stdout == b"0\n"
    assert _job_processes(channel) == 1


def test_status_pipe_closed_leaves_the_real_exit(channel: grpc.Channel) -> None:
    result = outcome(channel, "import os, sys\nos.closerange(3, 64)\nprint('x')\nsys.exit(3)")
    assert result.status == pb.STATUS_RUNTIME_ERROR
    assert result.execute.exit_code == 3
    assert result.execute.stdout == b"x\n"


def test_tmpfs_fill_is_contained(channel: grpc.Channel) -> None:
    result = outcome(channel, "f = open('big', 'wb')\nwhile True: f.write(b'x' * (1 << 20))", timeout=10)
    assert result.status in (pb.STATUS_RUNTIME_ERROR, pb.STATUS_TIMEOUT)
    assert outcome(channel, "open('small', 'w').write('ok'); print(open('small').read())").execute.stdout == b"ok\n"


def test_random_state_differs_between_jobs(channel: grpc.Channel) -> None:
    draws = {outcome(channel, "import random; print(random.getrandbits(64))").execute.stdout for _ in range(6)}
    assert len(draws) == 6


def test_programs_fork_from_a_zygote_without_the_controllers_modules(channel: grpc.Channel) -> None:
    # The zygote is forked before the controller imports asyncio and itself,
    # so no worker copies (and tears down) the page tables of their memory.
    code = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'asyncio'"
            " or m in ('sandboxd.agent.controller', 'sandboxd.agent.runner')))")
    result = outcome(channel, code)
    assert result.status == pb.STATUS_OK, result
    assert result.execute.stdout == b"[]\n"


def test_files_in_and_out(channel: grpc.Channel) -> None:
    job = helpers.execute("open('out.txt', 'w').write(open('data/in.txt').read().upper())",
                          files=[pb.File(path="data/in.txt", content=b"abc")], collect_files=["out.txt"])
    result = helpers.run(channel, job)
    assert result.status == pb.STATUS_OK
    assert [(f.path, f.content) for f in result.execute.files] == [("out.txt", b"ABC")]


def test_collect_does_not_follow_symlinks(channel: grpc.Channel) -> None:
    job = helpers.execute("import os; os.symlink('/etc/shadow', 'out.txt')", collect_files=["out.txt"])
    result = helpers.run(channel, job)
    assert list(result.execute.files) == []


def test_collecting_a_symlink_chain_is_answered_on_the_first_sandbox(channel: grpc.Channel) -> None:
    """realpath of a 1,500-link chain raised RecursionError in the agent, which dropped its connection: the job
    was retried on three sandboxes, each lost, and answered SANDBOX_LOST (red-team finding)."""
    job = helpers.execute("import os\nfor i in range(1500):\n    os.symlink(f'l{i + 1}', f'l{i}')\n"
                          "open('l1500', 'w').write('x')", collect_files=["l0"])
    result = helpers.run(channel, job)
    assert result.status == pb.STATUS_OK and result.attempts == 1, result
    assert list(result.execute.files) == []


def test_a_job_that_stops_itself_under_ptrace_runs_to_its_deadline(channel: grpc.Channel) -> None:
    """PTRACE_TRACEME makes the zygote the job's tracer: its stop was reported as an exit (status 19), and the run
    ended while its process lived on, stopped."""
    result = outcome(channel, "import ctypes, os, signal\nprint('tracing', flush=True)\n"
                              "ctypes.CDLL(None).ptrace(0, 0, None, None)\nos.kill(os.getpid(), signal.SIGSTOP)\n"
                              "print('continued')", timeout=1.5)
    assert (result.status, result.limit_hit) == (pb.STATUS_TIMEOUT, pb.LIMIT_WALL_TIME), result
    assert result.execute.stdout == b"tracing\n"
    assert _job_processes(channel) == 1
