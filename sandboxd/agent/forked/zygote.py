"""The zygote: a warm, pristine process whose only job is to fork workers.

It is forked by the agent's entry point before any job exists, and before
the controller's own modules are imported (see spawn). It imports and warms
the verifier libraries (this is the state the CRIU snapshot captures), and
then serves two requests over a SOCK_SEQPACKET pair: fork a worker, and
reseed after a restore. A new worker announces itself to the controller
with its own channel, before it has seen any job. The zygote reaps its
workers and reports each exit status with the worker's resource usage,
which is how the controller learns how a run ended without trusting
anything the run said. (A Python run may be answered on its own status
report first: see runner.Runner.run.)
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import random
import re
import select
import signal
import socket
import sys
import traceback
from typing import NoReturn

from sandboxd.agent.forked import worker
from sandboxd.agent.protocol import (
    EXITED,
    FORK_FAILED,
    FORKED,
    OP_EXITED,
    OP_FORK,
    OP_FORK_FAILED,
    OP_FORKED,
    OP_RESEED,
    READY,
    REQUEST,
)

# The signal module's own signal(), without the wrapper that turns the handler
# it replaces into a Handlers member: in a fresh worker, replacing the zygote's
# SIGCHLD handler (a function, not a member) goes through enum's ValueError
# path, 69 page faults (about 4 us each) for that one call.
_raw_signal = importlib.import_module("_signal")


def spawn(warm_modules: list[str]) -> tuple[socket.socket, int]:
    """Fork the zygote; returns the controller's end of its channel and its pid.

    Called by the agent's entry point before it imports the controller and
    asyncio, so the zygote holds only the interpreter, the worker and the
    warmed modules. Every worker's fork copies its zygote's page tables and
    its exit tears them down. Forked before those imports, a zygote holds
    about a third less (10.5 MB against 15.4), and a print(1) job costs a
    worker about 75 fewer page faults and 0.5-1 ms less CPU.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ours.close()
        main(theirs, warm_modules)
    theirs.close()
    return ours, pid


def main(control: socket.socket, warm_modules: list[str]) -> NoReturn:
    try:
        # Nothing the agent's entry point had open may reach a worker: only
        # the zygote's channel stays (a worker gets stdio and its own channel).
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd != control.fileno():
                with contextlib.suppress(OSError):
                    os.close(fd)
        _warm(warm_modules)
        # Each worker gets the environment its job names. Emptied here once,
        # so that a worker's clearing has nothing to undo (a worker's
        # environment step takes about 15% less).
        os.environ.clear()
        # Move everything warmed into the permanent generation: a worker's
        # collections then skip the inherited heap instead of walking (and
        # copy-on-write faulting) it: fork + math verify + exit take about a
        # third less time (26 ms against 40 in the python image).
        gc.collect()
        _fill_free_blocks()
        _fill_free_blocks()  # the first pass's own list takes some
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        control.send(READY)
        _serve(control)
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _warm(module_names: list[str]) -> None:
    for name in module_names:
        module = importlib.import_module(name)
        warm = getattr(module, "warm", None)
        if callable(warm):
            warm()


# Objects that use up the allocator's free blocks (see _fill_free_blocks); never freed.
_FILLER: list[object] = []
_ALLOCATOR_CLASS = re.compile(rb"^\s*\d+\s+(\d+)\s+\d+\s+\d+\s+(\d+)\s*$", re.MULTILINE)


def _fill_free_blocks() -> None:
    """Take the free blocks of the small-object allocator's partly used pools.

    After the warm-up they lie scattered over pages that every worker shares
    with the zygote, and a worker's first allocation in each such page
    copies it (a copy-on-write fault, about 4 µs). With them taken, a
    worker's allocations fill fresh pools a page at a time: about 40 fewer
    page faults per worker (7% of a print(1) job's), for about 0.3 MB more
    in the zygote.

    The free counts per size class come from sys._debugmallocstats(),
    CPython's allocator report; a report of another shape fills nothing.
    """
    report = os.memfd_create("mallocstats")
    saved_stderr = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(report, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    text = os.pread(report, 1 << 20, 0)
    os.close(report)
    for size, free in _ALLOCATOR_CLASS.findall(text):
        _FILLER.extend(_block(int(size)) for _ in range(int(free)))


def _block(size: int) -> object:
    """A new object that the allocator serves from its `size`-byte class."""
    if size <= 16:
        return object()
    if size <= 32:
        return float(len(_FILLER)) + 0.5
    return bytes(size - 33)  # a bytes object of length n takes 33 + n bytes


# The zygote's SIGCHLD wake-up pipe (read end, write end); a worker closes both.
_wakeup: tuple[int, int] | None = None


def _serve(control: socket.socket) -> None:
    """Fork a worker per request, and report every child's exit, until the controller hangs up.

    Every fork write-protects the zygote's pages until the child's exit, so
    each page this loop writes to between forks (a refcount, a new object)
    costs a copy (about 4 us). It therefore reads fixed-size requests
    into one buffer, leaves the worker's channel and its announcement to the
    child, and reaps from the SIGCHLD handler: about a third of the page
    faults and half the zygote's CPU per fork of a loop that selects, makes
    a socketpair and replies per fork.

    It waits in poll() on the channel and a wake-up pipe that the signal
    writes to (signal.set_wakeup_fd), not in recv_into alone: Python runs a
    handler between bytecodes, so a SIGCHLD that comes after the last check
    and before the blocking call begins would wait for the controller's next
    request. The exit would go unreported while the controller waits for
    it, and after 5 s it takes the sandbox for damaged ("a worker did not
    exit after SIGKILL"), as on jobs of a few hundred cases on a loaded
    machine. The pipe makes poll() return at once instead.
    """
    global _wakeup
    request = bytearray(REQUEST.size)
    forked: dict[int, int] = {}  # pid -> tag, until its exit is reported
    reaped_untagged: dict[int, tuple[int, float, int]] = {}  # pid -> its exit, until its tag is known
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _wakeup = (wake_read, wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: _reap(control, forked, reaped_untagged))
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    _reap(control, forked, reaped_untagged)
    channel = control.fileno()
    poller = select.poll()
    poller.register(channel, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    drain = bytearray(64)
    while True:
        # The handler runs as poll() returns; the pipe only ends the wait.
        requested = False
        for fd, _events in poller.poll():
            if fd == wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.readv(wake_read, [drain])
            else:
                requested = True
        if not requested:
            continue
        if control.recv_into(request) != REQUEST.size:
            return  # the controller hung up (or broke the protocol)
        op, tag = REQUEST.unpack(request)
        if op == OP_FORK:
            try:
                pid = _fork_worker(control, tag)
            except OSError as exc:
                # Sessions may hold every pid of the sandbox: the zygote
                # must not die of the next fork, and with it every session.
                control.send(FORK_FAILED.pack(OP_FORK_FAILED, tag, exc.errno or 0))
                continue
            forked[pid] = tag
            # The handler may have reaped it already (killed at once, before
            # this line could write its tag down): reported here, with its tag.
            early_exit = reaped_untagged.pop(pid, None)
            if early_exit is not None:
                del forked[pid]
                control.send(EXITED.pack(OP_EXITED, tag, pid, *early_exit))
        elif op == OP_RESEED:
            random.seed()


def _fork_worker(control: socket.socket, tag: int) -> int:
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        _raw_signal.signal(signal.SIGCHLD, _raw_signal.SIG_DFL)
        if _wakeup is not None:
            # Not the job's to read (the zygote's wake-ups) or to write.
            signal.set_wakeup_fd(-1)
            os.close(_wakeup[0])
            os.close(_wakeup[1])
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(control, [FORKED.pack(OP_FORKED, tag, os.getpid())], [ours.fileno()])
        control.close()
        ours.close()
    except BaseException:
        # What the zygote could not do for a worker damages the sandbox,
        # as when the zygote itself did this work.
        traceback.print_exc()
        os.kill(zygote_pid, signal.SIGKILL)
        os._exit(1)
    worker.main(theirs)


def _reap(control: socket.socket, forked: dict[int, int], reaped_untagged: dict[int, tuple[int, float, int]]) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
            # A worker that made the zygote its tracer (PTRACE_TRACEME) reports
            # its stops here without WUNTRACED. Not an exit: the run goes on to
            # its deadline, and the process is there for the uid sweep.
            continue
        exit_report = (status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)
        tag = forked.pop(pid, None)
        if tag is None:
            reaped_untagged[pid] = exit_report  # _serve reports it once its tag is written down
        else:
            control.send(EXITED.pack(OP_EXITED, tag, pid, *exit_report))
