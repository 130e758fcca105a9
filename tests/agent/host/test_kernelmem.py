"""What a run pins in the kernel, counted from outside it against real sockets and pipes on this machine."""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import socket

import pytest

from sandboxd.agent.host import kernelmem, usage
from tests.agent.host.test_usage import HOLDER_UID, MIB, _run_as_holder, as_root

# A process of HOLDER_UID that fills argv[1] socketpairs' send buffers (as large as wmem_max lets them), then
# closes the sending ends when argv[2] is "close" (what they queued is then charged to no live sender), and waits.
SOCKET_PINNER = """
import os, socket, sys, time
pairs = []
for _ in range(int(sys.argv[1])):
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
    a.setblocking(False)
    try:
        while True:
            a.send(b"x" * (1 << 16))
    except BlockingIOError:
        pass
    pairs.append((a, b))
if sys.argv[2] == "close":
    for a, _ in pairs:
        a.close()
os.write(1, b"ready\\n")
time.sleep(120)
"""


def _queued(sender: socket.socket) -> int:
    sender.setblocking(False)
    queued = 0
    try:
        while True:
            queued += sender.send(b"x" * (1 << 16))
    except BlockingIOError:
        return queued


def test_a_sockets_queued_bytes_are_its_creators_whether_its_sender_lives_or_not() -> None:
    before = kernelmem.socket_memory().get(os.getuid(), 0)
    sender, receiver = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
    with receiver:
        queued = _queued(sender)
        alive = kernelmem.socket_memory()[os.getuid()] - before
        assert queued + 2 * kernelmem.SOCKET_BYTES <= alive <= queued + (1 << 20)
        sender.close()
        orphaned = kernelmem.socket_memory()[os.getuid()] - before
        assert queued <= orphaned <= kernelmem.full_send_buffer() + kernelmem.SOCKET_BYTES


def test_one_byte_skbs_of_a_gone_sender_count_at_their_true_size() -> None:
    """One byte takes an skb of 768 bytes: the receiver's queue shows 278 bytes where 213 KB are pinned."""
    before = kernelmem.socket_memory().get(os.getuid(), 0)
    sender, receiver = socket.socketpair()
    sender.setblocking(False)
    sent = 0
    try:
        while True:
            sent += sender.send(b"x")
    except BlockingIOError:
        pass
    with receiver:
        sender.close()
        counted = kernelmem.socket_memory()[os.getuid()] - before
        assert counted >= min(sent * kernelmem.SKB_BYTES_PER_BYTE, kernelmem.full_send_buffer())


def test_a_connection_never_accepted_counts_as_a_full_send_buffer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It has no inode, so the dump shows it only as the listener's backlog, though its sender may have filled it
    and closed (8 MiB here, for each of up to somaxconn connections)."""
    path = str(tmp_path / "listener")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(4)
        before = kernelmem.socket_memory().get(os.getuid(), 0)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
        client.close()
        assert kernelmem.socket_memory()[os.getuid()] - before >= kernelmem.full_send_buffer()


def test_pipes_count_their_capacity_once_and_watches_their_number() -> None:
    reader, writer = os.pipe()
    epoll = select.epoll()
    targets = [os.eventfd(0) for _ in range(50)]
    try:
        before = kernelmem.descriptor_memory([os.getpid()])
        fcntl.fcntl(writer, kernelmem.F_GETPIPE_SZ - 1, 1 << 20)  # F_SETPIPE_SZ
        resized = kernelmem.descriptor_memory([os.getpid()])
        assert resized - before == (1 << 20) - kernelmem.DEFAULT_PIPE_BYTES
        for target in targets:
            epoll.register(target)
        watched = kernelmem.descriptor_memory([os.getpid()])
        assert watched - resized == 50 * kernelmem.EPOLL_WATCH_BYTES
    finally:
        for fd in (reader, writer, *targets):
            os.close(fd)
        epoll.close()


def test_a_named_pipe_counts_as_a_pipe_once_however_many_ends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Red team: a FIFO in the run's folder counted as a file (FILE_BYTES) whatever its buffer held."""
    path = str(tmp_path / "fifo")
    os.mkfifo(path)
    before = kernelmem.descriptor_memory([os.getpid()])
    ends = [os.open(path, os.O_RDWR | os.O_NONBLOCK) for _ in range(2)]
    try:
        fcntl.fcntl(ends[0], kernelmem.F_GETPIPE_SZ - 1, 1 << 20)  # F_SETPIPE_SZ
        held = kernelmem.descriptor_memory([os.getpid()]) - before
        assert held == kernelmem.PIPE_BYTES + (1 << 20)
    finally:
        for end in ends:
            os.close(end)


def _holders_pin() -> int:
    """What HOLDER_UID's processes pin in the kernel now, as a sweep counts it."""
    return usage.kernel_use({HOLDER_UID: usage.processes_of({HOLDER_UID})[HOLDER_UID]})[HOLDER_UID][0]


def _swept(limit: int) -> usage.WatchedRun:
    async def scenario() -> usage.WatchedRun:
        watch = usage.UsageWatch()
        run = watch.watch(HOLDER_UID, limit, bounded_alone=True)
        await watch.sweep()
        watch.unwatch(run)
        return run

    return asyncio.run(scenario())


@as_root
def test_a_paused_run_is_not_counted_until_it_runs_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session between cells has every process stopped: nothing it holds can grow, and counting it (the
    sock_diag dump and a walk of its descriptors) cost 0.3 ms a sweep per session, every 50 ms for an hour."""
    counted: list[dict[int, list[int]]] = []
    measure = usage.kernel_use

    def counting(runs: dict[int, list[int]]) -> dict[int, tuple[int, int]]:
        counted.append(runs)
        return measure(runs)

    monkeypatch.setattr(usage, "kernel_use", counting)

    async def scenario() -> tuple[bool, int, bool]:
        watch = usage.UsageWatch()
        run = watch.watch(HOLDER_UID, 1 << 20, bounded_alone=True)
        run.paused = True
        await watch.sweep()
        paused = (run.over, len(counted))
        run.paused = False
        await watch.sweep()
        watch.unwatch(run)
        return *paused, run.over

    with _run_as_holder(SOCKET_PINNER, ["12", "open"], 1):
        assert asyncio.run(scenario()) == (False, 0, True)


@as_root
@pytest.mark.parametrize("senders", ["open", "close"])
def test_a_lone_process_holding_socket_buffers_is_over_its_limit(senders: str) -> None:
    """The red team's attack, small: one process under RLIMIT_AS (not measured before) queues 12 socketpairs'
    buffers (at least 4.9 MiB, 96 MiB where wmem_max is 4 MiB) with 10 MiB resident."""
    with _run_as_holder(SOCKET_PINNER, ["12", senders], 1):
        pinned = _holders_pin()
        assert pinned >= 12 * min(kernelmem.full_send_buffer(), 400 << 10)
        run = _swept(pinned // 2)
        assert run.over and run.peak >= pinned and run.peak_kernel >= pinned
        assert not _swept(pinned + 64 * MIB).over


@as_root
def test_a_run_seen_pinning_a_share_of_its_limit_is_the_oom_killers_first_choice() -> None:
    """A run can pin faster than the sweep looks (590 MiB between two sweeps here), so the sandbox may fill while
    it is under its limit: from the sweep that sees it pin 1/8 of its limit in the kernel, its processes carry
    the highest OOM score, which they keep however they lower it. One pinning less keeps a job's."""
    with _run_as_holder(SOCKET_PINNER, ["12", "open"], 1) as holder:
        score = f"/proc/{holder.pid}/oom_score_adj"
        pinned = _holders_pin()
        calm = _swept(pinned * usage.PINNING_LIMIT_SHARE + 64 * MIB)
        assert not calm.pinning and not calm.oom_first and not calm.over
        with open(score) as adj:
            assert adj.read().strip() == "750"

        async def scenario() -> tuple[usage.WatchedRun, str]:
            watch = usage.UsageWatch()
            run = watch.watch(HOLDER_UID, pinned * 2, bounded_alone=True)
            await watch.sweep()
            with open(score, "w") as adj:  # the run's own trick: it owns the file
                adj.write("0")
            await watch.sweep()
            watch.unwatch(run)
            with open(score) as adj:
                return run, adj.read().strip()

        run, after = asyncio.run(scenario())
        # Put back, and the run killed for lowering it (as over its limit).
        assert run.pinning and run.oom_first and run.lowered and run.over and after == "1000"


# A process of HOLDER_UID holding argv[1] empty socketpairs.
EMPTY_SOCKETS = """
import os, socket, sys, time
pairs = [socket.socketpair() for _ in range(int(sys.argv[1]))]
os.write(1, b"ready\\n")
time.sleep(120)
"""


@as_root
def test_a_run_holding_sockets_enough_to_pin_past_its_limit_is_the_oom_killers_first_choice_uncharged() -> None:
    """Empty sockets pin little, but filled at once between two sweeps they pin each a full send buffer: a run
    holding enough to pass its limit so is the OOM killer's first choice, though not pinning (an OOM kill is not
    yet its own doing). Fewer keep a job's score."""
    with _run_as_holder(EMPTY_SOCKETS, ["40"], 1) as holder:
        room = 80 * kernelmem.full_send_buffer()
        few = _swept(room * 2)
        with open(f"/proc/{holder.pid}/oom_score_adj") as adj:
            assert (few.oom_first, adj.read().strip()) == (False, "750")
        many = _swept(room // 2)
        with open(f"/proc/{holder.pid}/oom_score_adj") as adj:
            assert (many.oom_first, many.pinning, many.over, adj.read().strip()) == (True, False, False, "1000")


@as_root
def test_what_a_runs_processes_still_pin_is_counted_at_once_when_asked() -> None:
    """When the OOM killer took one process of a run, its others' pinned memory says whether it was filling them."""
    with _run_as_holder(SOCKET_PINNER, ["12", "open"], 1):
        pinned = _holders_pin()

        async def scenario(limit: int) -> usage.WatchedRun:
            watch = usage.UsageWatch()
            run = watch.watch(HOLDER_UID, limit, bounded_alone=True)
            await watch.count_pinned_now(run)
            watch.unwatch(run)
            return run

        filling = asyncio.run(scenario(pinned * 2))
        assert filling.pinning and filling.peak_kernel >= pinned and not filling.over
        assert not asyncio.run(scenario(pinned * usage.PINNING_LIMIT_SHARE + 64 * MIB)).pinning


# A process of HOLDER_UID holding a netlink sock_diag socket (what the seccomp profile leaves a run) that asked
# for its own Unix socket's details argv[1] times and never read the replies.
DIAG_PINNER = """
import os, socket, struct, sys, time
diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)
diag.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
diag.setblocking(False)
a, b = socket.socketpair()
request = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, os.fstat(a.fileno()).st_ino, 0x70, 0xFFFFFFFF,
                      0xFFFFFFFF)
for i in range(int(sys.argv[1])):
    diag.send(struct.pack("=IHHII", 16 + len(request), 20, 1, i, 0) + request)
os.write(1, b"ready\\n")
time.sleep(120)
"""


@as_root
def test_a_socket_not_unix_counts_as_a_full_receive_buffer() -> None:
    """A sock_diag socket queued 8 MiB of replies it never read (where rmem_max is 4 MiB), which the Unix dump
    does not see."""
    with _run_as_holder(DIAG_PINNER, ["20000"], 1):
        pinned = _holders_pin()
        assert pinned >= kernelmem.full_receive_buffer()
        assert _swept(pinned // 2).over
