"""What a worker process does between its fork from the zygote and its exit.

Workers are forked before they are needed (a fork costs about a millisecond
here) and wait as root; a worker takes the job's uid right after parsing the
job's frame, so nothing the job does runs with the zygote's privileges. The
job arrives over the worker's control channel together with the file
descriptors it should use (stdin as a memfd, stdout and stderr as pipes the
controller reads, and for the two-process Python harness the socket to the
other side).

Modes that run candidate code close the control channel first: the only
things a candidate can influence are its exit status and what it writes to
its pipes, and the controller judges both from outside. A Python program's
worker also holds a status pipe, on which it reports its exit status just
before exiting (see _flush_and_exit); writing it early ends the run.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import os
import random  # noqa: F401 - for its fork hook, which reseeds it in every worker (see _reseed)
import resource
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

from sandboxd.agent.forked.serving import memory_bytes
from sandboxd.agent.landlock import scope_abstract_sockets
from sandboxd.agent.protocol import JOB_OOM_SCORE_ADJ, RESIDENT_OOM_SCORE_ADJ, recv_frame_fds

# Exit status of a worker whose own setup failed before any of the job ran
# (its traceback goes to the run's stderr).
HARNESS_FAILURE_EXIT = 121
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
MAX_FDS_PER_JOB = 8
# Above any descriptor a process can hold here, where RLIMIT_NOFILE has no hard limit.
MAX_FD = 1 << 20
# The highest nice, on top of SCHED_IDLE (see _below_the_agent).
WORKER_NICE = 19

RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "nproc": resource.RLIMIT_NPROC,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
    "stack": resource.RLIMIT_STACK,
}

# Looked up here, in the zygote: in each worker the lookup (dlsym) searched the
# symbol tables of every loaded library, page faults in a fresh fork.
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl

# A worker's own seccomp filter, on top of the sandbox's (sandboxd/seccomp.py),
# for the modes that run candidate code (CANDIDATE_MODES): memfd_create(2) is
# answered ENOSYS. A memfd's pages are charged to the sandbox's memory but,
# until mapped, to no process: RLIMIT_AS does not see them and neither does
# the OOM killer's choice: 40 memfds of 60 MiB under a 256 MiB limit make
# the OOM killer take the innocent runs beside them first. The
# agent keeps the call (a run's stdin is a memfd it writes), so the filter is
# the worker's, installed after its job arrives; it outlives exec. ENOSYS, as
# for the sandbox's other refusals: software that probes for memfd falls back
# (to /dev/shm, which is capped). Built here, in the zygote, like the Landlock
# attribute below. seccomp_data (include/uapi/linux/seccomp.h): nr at byte 0,
# arch at byte 4.
CANDIDATE_MODES = frozenset({"python", "exec", "py_callee", "py_session", "py_final"})
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
# machine: (native audit arch, its memfd_create, 32-bit compat audit arch, its memfd_create)
MEMFD_CREATE_BY_MACHINE = {
    "x86_64": (0xC000003E, 319, 0x40000003, 356),
    "aarch64": (0xC00000B7, 279, 0x40000028, 385),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _memfd_filter(machine: str) -> _SockFprog | None:
    """The BPF program that answers memfd_create ENOSYS and allows the rest; None on another machine."""
    if machine not in MEMFD_CREATE_BY_MACHINE:
        return None
    native, native_nr, compat, compat_nr = MEMFD_CREATE_BY_MACHINE[machine]
    load, jump_eq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    # Jump offsets count from the next instruction; 8 allows, 9 refuses.
    program = [
        (load, 0, 0, 4),
        (jump_eq, 0, 3, native),
        (load, 0, 0, 0),
        (jump_eq, 5, 0, native_nr),
        (jump_eq, 4, 3, native_nr | X32_SYSCALL_BIT if machine == "x86_64" else native_nr),
        (jump_eq, 0, 2, compat),
        (load, 0, 0, 0),
        (jump_eq, 1, 0, compat_nr),
        (ret, 0, 0, SECCOMP_RET_ALLOW),
        (ret, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
    ]
    instructions = (_SockFilter * len(program))(*(_SockFilter(*insn) for insn in program))
    fprog = _SockFprog(len(program), instructions)
    fprog._instructions = instructions  # kept alive with the program
    return fprog


_MEMFD_FILTER = _memfd_filter(os.uname().machine)


def refuse_memfd() -> bool:
    """Install the worker's memfd_create filter (needs no_new_privs or CAP_SYS_ADMIN); False if not installed."""
    if _MEMFD_FILTER is None:
        return False
    return _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_MEMFD_FILTER), 0, 0) == 0


def main(channel: socket.socket) -> NoReturn:
    """Entry point in a child of the zygote, forked ahead of need.

    The worker waits as root in the zygote's clean state. The job's frame is
    parsed by this code alone; the worker then takes the job's uid before
    anything of the job runs.
    """
    try:
        # Everything that does not depend on the job is done while the
        # worker waits as a spare, off the job's path.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # When a sandbox runs out of memory the kernel must pick a job's
        # process, never the controller or the zygote (raising needs no privilege).
        _set_oom_score_adj(JOB_OOM_SCORE_ADJ)
        os.setsid()
        os.setgroups([])
        scope_abstract_sockets()
        _below_the_agent()
        # Seeded here, from this process's own draw of urandom: spares forked
        # before a snapshot are dropped on the restored agent's hello.
        _reseed()
        # The spare's address space is the zygote's until the job runs.
        mapped, _resident = memory_bytes()
        job, fds = _receive_job(channel)
        # Programs get the default SIGPIPE, as under a shell. Our own resident
        # servers must see a closed socket as an error, not be killed by it: a
        # judge's candidate that hung up fails its test ("died"), and a
        # server whose results socket closed exits as the controller meant.
        trusted = job["mode"] in ("py_judge", "math_server")
        signal.signal(signal.SIGPIPE, signal.SIG_IGN if trusted else signal.SIG_DFL)
        if trusted:
            # A long-lived server at 1000 (the math server is the biggest
            # process) would be killed when a job fills the sandbox's memory,
            # and an innocent job blamed. Lowering to a value >= 0 needs no privilege.
            _set_oom_score_adj(RESIDENT_OOM_SCORE_ADJ)
        if job["mode"] in CANDIDATE_MODES:
            refuse_memfd()
        uid = int(job["uid"])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # Again: the kernel clears it on a credential change.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if job["mode"] == "py_final":
            # A session's final check (sessions.py): what it runs of the
            # session's (a program in its folder) is of the same uid, and a
            # dumpable check it could trace, or read the descriptors of
            # (/proc/<pid>/fd), and answer for. Its memory then counts whole
            # (usage.memory_of_run); what it execs is dumpable again.
            _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        elif job["mode"] in CANDIDATE_MODES:
            # So is dumpability, without which the agent cannot read how much
            # of its memory the run shares (usage.memory_of_run). An exec'd
            # program is dumpable anyway. No core is written (RLIMIT_CORE 0),
            # and only processes of this run's uid may trace it.
            _prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        _apply_limits(job.get("rlimits", {}), mapped)
        os.umask(0o077)
        os.chdir(job["cwd"])
        # The zygote emptied the environment (zygote.main): only the job's goes
        # in, item by item. clear() and update() went through MutableMapping's
        # generic code, about 40 more page faults in a fresh worker.
        for key, value in job.get("env", {}).items():
            os.environ[key] = value
        # A Python-harness candidate's stdio is the harness's own (python.candidate installs it at once): text files
        # made here for it would only be thrown away, about 95 page faults and 0.2 ms of each candidate's CPU.
        _install_stdio(fds, wrap=job["mode"] != "py_callee")
    except BaseException:
        traceback.print_exc()
        os._exit(HARNESS_FAILURE_EXIT)
    mode = job["mode"]
    if mode == "python":
        channel.close()
        _run_python(job["code"], job.get("argv", ["main.py"]), fds[job["status_fd"]] if "status_fd" in job else -1)
    elif mode == "exec":
        channel.close()
        _run_exec(job["argv"])
    elif mode == "py_callee":
        channel.close()
        from sandboxd.verifiers.python import harness

        harness.serve_candidate(job["code"], socket.socket(fileno=fds[3]), assembly=job.get("assembly"),
                                files=job["cwd"] if job.get("share_files") is True else "",
                                implicit_imports=job.get("implicit_imports") is True)
    elif mode == "py_judge":
        from sandboxd.agent.forked import judgeserver

        judgeserver.serve(channel, socket.socket(fileno=fds[3]), _receive_job)
    elif mode == "math_server":
        from sandboxd.agent.forked import mathserver

        mathserver.serve(channel, socket.socket(fileno=fds[3]))
    elif mode in ("py_session", "py_final"):
        from sandboxd.agent.forked import repl

        repl.serve(channel, socket.socket(fileno=fds[3]), _receive_job, final=mode == "py_final")
    os._exit(HARNESS_FAILURE_EXIT)


def _below_the_agent() -> None:
    """Give this worker's processes the lowest CPU weight within the sandbox, for good.

    Within the sandbox's cgroup the CPU is shared by weight: a fork bomb's
    256 processes at the controller's nice (0) leave the controller 1/257 of
    it, and under load on the host it misses the daemon's deadline, so the
    bomb would be answered SANDBOX_LOST (an infrastructure failure a trainer
    drops) instead of its penalty. SCHED_IDLE weighs 3 against the
    controller's 1024 (and the zygote's); nice 19 (weight 15) alone is not
    enough for two bombs in one sandbox, 512 processes. Every worker gets it, our resident servers too: a judge
    running a dataset's tests, or a math server on a slow answer, must not
    take the CPU from a neighbour's candidate either. Only the sandbox's own
    processes are behind it: other sandboxes are other cgroups. Hard limits
    of 0 keep a run from taking the weight back: RLIMIT_NICE for a lower nice
    or leaving SCHED_IDLE, RLIMIT_RTPRIO for a real-time policy (the sandbox
    has no CAP_SYS_NICE). Docker's defaults are 0 too, but a host's may not be.
    """
    os.setpriority(os.PRIO_PROCESS, 0, WORKER_NICE)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))


def _set_oom_score_adj(value: int) -> None:
    # Not open(): a text file's objects cost a fresh worker 64 page faults
    # (about 4 us each here); these calls, a few.
    with contextlib.suppress(OSError):
        oom = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(oom, str(value).encode())
        finally:
            os.close(oom)


def _receive_job(channel: socket.socket) -> tuple[dict[str, Any], list[int]]:
    try:
        return recv_frame_fds(channel, MAX_FDS_PER_JOB)
    except EOFError:
        raise EOFError("controller closed the channel") from None


def _reseed() -> None:
    # Every clone restored from one snapshot, and every worker forked from one
    # zygote, starts with the same generator state; a job must not be able to
    # predict another's random numbers. `random` reseeds itself in every forked
    # child (its own os.register_at_fork hook); numpy's generator does not.
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


def _apply_limits(rlimits: dict[str, int], mapped: int) -> None:
    """Set `rlimits`; `mapped` is the address space the process maps before its job."""
    for name, value in rlimits.items():
        if name == "as_extra":
            # Address space is the memory limit on top of what the warm
            # interpreter already maps (sympy and numpy map hundreds of MB).
            resource.setrlimit(resource.RLIMIT_AS, (mapped + value, mapped + value))
            continue
        soft = hard = value
        if name == "cpu":
            # SIGXCPU at the soft limit, SIGKILL one second later.
            hard = value + 1
        resource.setrlimit(RLIMITS[name], (soft, hard))


def _install_stdio(fds: list[int], *, wrap: bool = True) -> None:
    """The run's stdin, stdout and stderr as fds 0-2, and (`wrap`) as sys.stdin, sys.stdout and sys.stderr."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target, inheritable=True)
    for fd in fds[:3]:
        if fd > 2:
            os.close(fd)
    if not wrap:
        return
    sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def _flush_and_exit(status: int, status_fd: int = -1) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if status_fd >= 0:
        # Tell the controller the run is over before the exit, which takes
        # 1-2 ms (a forked interpreter's memory torn down, then the
        # zygote's reap). Every other descriptor is closed first, so the
        # run's pipes are at end of file when the byte arrives. The program
        # could write this byte itself; that ends its run with that status,
        # as os._exit() would (see runner.Runner.run).
        with contextlib.suppress(OSError):
            os.closerange(0, status_fd)
            # No descriptor reaches the hard RLIMIT_NOFILE (512 for jobs), which
            # a job cannot raise: a bound for kernels without close_range(2).
            highest = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            os.closerange(status_fd + 1, MAX_FD if highest == resource.RLIM_INFINITY else min(highest, MAX_FD))
            os.write(status_fd, bytes([status & 0xFF]))
    os._exit(status)


def _run_python(code: str, argv: list[str], status_fd: int = -1) -> NoReturn:
    """Run candidate Python in this (warm) interpreter with `python main.py` semantics."""
    sys.argv = list(argv)
    sys.path[0:0] = [os.getcwd()]
    namespace = {"__name__": "__main__", "__file__": argv[0], "__builtins__": builtins}
    status = 0
    program_pid = os.getpid()
    try:
        exec(compile(code, argv[0], "exec"), namespace)
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:
        # Show the traceback from the candidate's first frame, as `python main.py` would.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        status = 1
    # A child the program forked (os.fork) that ends here ends alone, as under `python main.py`: only the
    # program's own process reports the run's status. A child that falls off the end, calls sys.exit() or
    # raises would otherwise write its status for the run and end it, its parent killed mid-way: a correct
    # program that forks would be scored on its child's exit.
    _flush_and_exit(status, status_fd if os.getpid() == program_pid else -1)


def _run_exec(argv: list[str]) -> NoReturn:
    try:
        os.execvpe(argv[0], argv, dict(os.environ))
    except OSError as exc:
        print(f"cannot execute {argv[0]}: {exc}", file=sys.stderr)
        _flush_and_exit(127)
