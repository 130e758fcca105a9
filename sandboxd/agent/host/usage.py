"""What each run holds in memory and how much CPU it got, measured from outside it; whether the OOM killer struck.

RLIMIT_AS bounds one process. A run of several processes (a C program
that forks four children of 200 MiB each, a Go child never waited for)
keeps each under the limit and holds 800 MiB under a 256 MiB one; Go, Java
and Node runs have no RLIMIT_AS at all, and their peak at exit is known
only after the fact. Either way a run can fill the sandbox's memory, and
the kernel's OOM killer then takes the biggest process, often an innocent
run beside it, which would be charged MEMORY_LIMIT.

A sandbox is one memory cgroup (v1 here, without delegation: the agent
cannot make one per run), so the agent measures runs itself. Each run has
a uid of its own: every WATCH_SECONDS, UsageWatch sums the memory of
each watched uid's processes and kills a run over its limit, which is
then answered MEMORY_LIMIT. A run of one process under RLIMIT_AS is
bounded already and costs the sweep one stat of /proc/<pid>.

Memory no process maps counts too: what the run pins in the kernel
(kernelmem: socket buffers, pipes, epoll and inotify watches, descriptors).
A wrong program can queue GiB in socketpair send buffers with 5 MiB resident:
counted by what it maps, it escapes the sweep, while the sandbox's cgroup is
charged and the OOM killer, which weighs processes by what they map, takes
the runs and sessions beside it. Each sweep adds what every watched run pins to what its
processes map, a lone process under RLIMIT_AS included once it pins more
than LONE_KERNEL_BYTES.

What a process holds is counted in two steps. First RssAnon + RssShmem
(/proc/<pid>/status, readable by anyone): an upper bound, since a forked
copy counts every page it still shares with its parent (a Python fork
bomb's 256 copies of a warm interpreter come to 2.4 GB). Only a run over
its limit by that bound is counted again, exactly: Pss_Anon + Pss_Shmem of
/proc/<pid>/smaps_rollup, where a shared page is split among its sharers.
The kernel shows that file only to the process's own uid (ptrace's read
check, by file system ids: setfsuid) and only while the process is
dumpable, which a worker sets again after taking its uid (worker.main).

The sweep counts at intervals, and a run can pin memory faster than it
looks: 8 processes queued 590 MiB in socket buffers between two sweeps
100 ms apart here. Where the sandbox fills before the sweep sees the run
over its limit, the OOM killer chooses, by what each process maps and its
OOM score. So a run seen pinning 1 / PINNING_LIMIT_SHARE of its limit in the
kernel, or holding Unix sockets enough to pin more than its limit if
each filled its send buffer (16 processes can open 8,000 empty ones, whose
count stretches the sweep's pause, then fill them at once), has its
processes' scores raised (protocol.PINNING_OOM_SCORE_ADJ) for the rest of
its life, and the OOM killer takes them, not the 150 MiB session beside
them. The same sweep puts back the score of any other
job's process that changed it (an exec'd program owns its /proc files and
may lower its score down to the agent's), and kills a run found below the
score it was given: the kernel must keep choosing a job's process, and the
biggest one. (Lowering in a loop, a pinning run sat at the agent's score
and the OOM killer took the agent.)

CPU is the sandbox's as a whole too (one CPU quota), and the scheduler
shares it per thread, not per run: beside a run of 250 busy processes, a
run that needs 0.1 s of CPU gets so little of it that it would be charged
TIMEOUT at its 3 s deadline. The same sweep reads each
watched process's /proc/<pid>/schedstat: the time it ran and the time it
waited on a run queue, ready to run, and /proc/<pid>/stat: its state
and what all its threads ran. A run's deadline moves on by the time it
was kept off a CPU it could have used (CpuShare.kept_off_seconds): its
wait, to no more than the sandbox's CPUs over its life less what its own
processes and threads ran, so that waiting behind itself earns nothing,
while waiting behind the other runs or behind the host's other load
(other containers, CI's jobs) does (runner.others_took). A run that ends
at its deadline having waited for a CPU at least half its time, and half
of its last RECENT_WAIT_SECONDS, while the other runs took several times
its CPU, or kept off more than its deadline could move for
(runner.starved_out), is not given the CPU to finish: it runs again
elsewhere. A session's cell, which cannot run
twice, is answered uncharged instead, judged by its share over the cell
alone (UsageWatch.mark). Its neighbours' share is counted from the watched
runs alone; the agent's own servers are not.

Limits: a run that grows by the sandbox's free memory between two sweeps
reaches the OOM killer first; then `runner.crowded_out` keeps the
innocent runs it kills from being charged. CPU that a process used and
took with it at an exit before any sweep saw it is not counted: a run
made only of processes that live less than WATCH_SECONDS takes the CPU
unseen, and its neighbour's timeout stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sandboxd.agent import protocol
from sandboxd.agent.host import kernelmem

# Between two sweeps while any run is watched. A sweep takes about 0.1 ms
# among 81 processes none of which is watched, 0.8 ms when all 81 are
# (an OOM score rewritten for each). A slower one (a fork bomb's 256
# processes, each counted exactly) stretches the pause, so that the sweeps
# take at most 1 / WATCH_DUTY_INVERSE of a core, up to WATCH_MAX_PAUSE.
WATCH_SECONDS = 0.05
WATCH_DUTY_INVERSE = 20
WATCH_MAX_PAUSE = 0.5
# What a lone process under RLIMIT_AS may pin in the kernel before its mapped memory is counted with it.
LONE_KERNEL_BYTES = 1 << 20
# What a job's process is given, and a pinning run's (the module's docstring); put back when changed.
JOB_OOM_SCORE_ADJ = str(protocol.JOB_OOM_SCORE_ADJ).encode()
PINNING_OOM_SCORE_ADJ = str(protocol.PINNING_OOM_SCORE_ADJ).encode()
# A run seen pinning more than 1 / PINNING_LIMIT_SHARE of its limit in the kernel (and more than
# LONE_KERNEL_BYTES) is pinning: a program's pipes and sockets come to a few hundred KiB.
PINNING_LIMIT_SHARE = 8
# The kernel's count of OOM kills. Host-wide: a sandbox restored from a
# snapshot sees another group than its own at /sys/fs/cgroup (CRIU remounts
# the template's cgroup mounts from its own cgroup), so its memcg's
# oom_control cannot be trusted. A kill elsewhere on the host during a run
# only makes a SIGKILL of that run look like the OOM killer's: at worst it
# is retried (crowded_out), never passed.
VMSTAT = "/proc/vmstat"
KIB = 1024
NS = 1e-9
# How far back a run's wait is measured at its end (CpuShare.waited_lately).
# A run starved at its deadline waits nearly all of it (1/32 of a CPU beside
# a run of 31 busy processes); one asleep there, none of it. But schedstat
# counts a wait only once the process gets the CPU, so the wait in progress
# at the deadline is missing, and beside 24 busy processes it can be a good
# part of a scheduling round: over 0.2 s, a run that waits 5.8 s of its
# 6.1 s can be seen waiting as little as half of its last 0.2 s (with the
# sweeps after its kill counted too; WatchedRun.close_looks); over 0.5 s,
# over 0.9 of it.
RECENT_WAIT_SECONDS = 0.5
# Looks kept per run: a deadline that moves looks every 10 ms at most
# (runner.DEADLINE_MIN_MOVE), so 64 looks cover RECENT_WAIT_SECONDS.
RECENT_LOOKS = 64
# /proc/<pid>/stat counts a process's CPU in clock ticks (utime, stime). Read
# for each watched process at each look beside its schedstat: about 13 us a read
# (schedstat's, 7 us), under load.
CLOCK_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
# schedstat counts a wait only once it ends, when the process runs: the wait
# in progress at a look is not in it (beside a host at load 20, a run that
# got 7% of a CPU had waits of tens of ms). A process ready to run (state R)
# at two looks at least this far apart whose main thread ran nothing between
# them waited all that time; a running one's count moves at each scheduler
# tick (4 ms at HZ=250, 10 ms at 100), so a shorter gap could be a tick's lag.
WAITING_NOW_MIN_SECONDS = 0.02


def _read(path: str, size: int = 1 << 16) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def oom_kills(path: str = VMSTAT) -> int | None:
    """How many processes the OOM killer has killed on this host so far; None where the kernel does not say."""
    # One look for its line rather than a parse of all ~190: 16 of the 47 us a
    # read took here, where the agent reads it up to twice per run.
    _, found, rest = (b"\n" + (_read(path) or b"")).partition(b"\noom_kill ")
    value = rest.partition(b"\n")[0].strip()
    return int(value) if found and value.isdigit() else None


def sandbox_usage() -> tuple[int, int]:
    """(bytes the sandbox's processes hold privately, how many tasks they are), from /proc.

    Read from the processes rather than the cgroup's files, which a restored
    sandbox cannot see (VMSTAT). Each process's private memory counts in
    full, pages it shares with a fork's parent included: an over-count.
    What Unix sockets hold in the kernel counts too (kernelmem.socket_memory).
    """
    held = tasks = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        status = _read(f"/proc/{name}/status", 4096)
        if status:
            held += _status_private_bytes(status)
            tasks += _status_field(status, b"\nThreads:") or 1
    return held + sum(kernelmem.socket_memory().values()), tasks


def _status_field(status: bytes, field: bytes) -> int:
    start = status.find(field)
    if start < 0:
        return 0
    end = status.find(b"\n", start + 1)
    try:
        return int(status[start + len(field):end].split()[0])
    except (ValueError, IndexError):
        return 0


def _status_private_bytes(status: bytes) -> int:
    return (_status_field(status, b"\nRssAnon:") + _status_field(status, b"\nRssShmem:")) * KIB


def private_memory(pid: int) -> int:
    """Bytes of `pid`'s memory that no file backs (RssAnon + RssShmem); 0 once it is gone."""
    status = _read(f"/proc/{pid}/status", 4096)
    return _status_private_bytes(status) if status else 0


def schedstat(pid: int) -> tuple[int, int] | None:
    """(ns `pid` has run, ns it has waited on a run queue ready to run) over its life; None once it is gone."""
    text = _read(f"/proc/{pid}/schedstat", 128)
    fields = text.split() if text else []
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def process_stat(pid: int) -> tuple[bytes, int] | None:
    """(`pid`'s state letter, ns all its threads have run, to the clock tick) from /proc/<pid>/stat; None once it is
    gone."""
    text = _read(f"/proc/{pid}/stat", 1024)
    # "pid (comm) S ...": the command may hold spaces and parentheses. After it, proc(5)'s fields 3 (state), 14 and 15
    # (utime and stime, the threads' own and those of threads gone) are the 1st, 12th and 13th.
    fields = text[text.rfind(b")") + 2:].split() if text else []
    if len(fields) < 13 or not (fields[11].isdigit() and fields[12].isdigit()):
        return None
    return fields[0], (int(fields[11]) + int(fields[12])) * CLOCK_TICK_NS


def runnable_job_tasks() -> int:
    """Threads of processes not the agent's (not root's) that run or wait for a CPU right now."""
    runnable = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == 0:
                continue
            threads = os.listdir(f"/proc/{name}/task")
        except OSError:
            continue
        for thread in threads:
            stat = _read(f"/proc/{name}/task/{thread}/stat", 512)
            # "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last ")".
            if stat and stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R":
                runnable += 1
    return runnable


def proportional_memory(pid: int) -> int | None:
    """`pid`'s share of the memory no file backs (Pss_Anon + Pss_Shmem); None if the kernel does not show it to us."""
    rollup = _read(f"/proc/{pid}/smaps_rollup", 4096)
    if not rollup or b"\nPss_Anon:" not in rollup:
        return None
    return (_status_field(rollup, b"\nPss_Anon:") + _status_field(rollup, b"\nPss_Shmem:")) * KIB


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def _file_system_ids(uid: int) -> Iterator[None]:
    """This thread's file system uid and gid set to `uid` (a job's gid is its uid) until the block ends."""
    own_uid, own_gid = os.getuid(), os.getgid()
    _libc.setfsgid(uid)
    _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(own_uid)
        _libc.setfsgid(own_gid)


def memory_of_run(uid: int, pids: list[int]) -> int:
    """What the processes `pids` of `uid` hold together, shared pages split among their sharers.

    A process whose share cannot be read (one that is not dumpable) counts
    its whole private memory.
    """
    held = 0
    with _file_system_ids(uid):
        for pid in pids:
            share = proportional_memory(pid)
            held += share if share is not None else private_memory(pid)
    return held


def kernel_use(runs: dict[int, list[int]]) -> dict[int, tuple[int, int]]:
    """For each run (uid: its pids), (what it pins in the kernel: its Unix sockets and its other descriptors, by
    kernelmem; what its Unix sockets could pin: each a full send buffer)."""
    sockets, counts, unix_inodes = kernelmem.socket_use()
    full = kernelmem.full_send_buffer()
    use: dict[int, tuple[int, int]] = {}
    for uid, pids in runs.items():
        with _file_system_ids(uid):
            pinned = kernelmem.descriptor_memory(pids, unix_inodes=unix_inodes)
        use[uid] = sockets.get(uid, 0) + pinned, counts.get(uid, 0) * full
    return use


def processes_of(uids: set[int]) -> dict[int, list[int]]:
    """The pids of each of `uids`, from one listing of /proc (zombies included: they hold nothing)."""
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
        except FileNotFoundError:
            continue
        if uid in uids:
            found.setdefault(uid, []).append(int(name))
    return found


def hold_oom_score(pid: int, score: bytes = JOB_OOM_SCORE_ADJ, floor: int | None = None) -> bool:
    """Set `pid`'s OOM score adjustment to `score` if it is not that already (a run may have changed it); whether
    it was below `floor`.

    Raising needs no privilege, nor does lowering down to what the process's
    oom_score_adj_min allows (0: no one here has CAP_SYS_RESOURCE).
    """
    path = f"/proc/{pid}/oom_score_adj"
    current = _read(path)
    if current is None or current.strip() == score:
        return False
    with contextlib.suppress(OSError), open(path, "wb") as adjust:
        adjust.write(score)
    try:
        return floor is not None and int(current) < floor
    except ValueError:
        return False


@dataclass
class WatchedRun:
    uid: int
    # What its processes may hold together; 0: not held (its CPU is still counted).
    limit: int
    # One process under RLIMIT_AS is bounded by it; only a second one is counted.
    bounded_alone: bool
    on_over: Callable[[], None] | None
    # UsageWatch.cpu_ns when the watch began: what all watched runs had run by then.
    all_cpu_ns_at_start: int = 0
    peak: int = 0
    # The most of `peak`'s kind that its processes pinned in the kernel (kernel_use) at one sweep.
    peak_kernel: int = 0
    over: bool = False
    # Set once a sweep saw it pin more than its share in the kernel (PINNING_LIMIT_SHARE), or hold Unix sockets
    # enough to pin past its limit (each a full send buffer) before the next sweep: its processes are the OOM
    # killer's first choice from then on (oom_first). Only what it pinned makes an OOM kill its own doing.
    pinning: bool = False
    oom_first: bool = False
    # The pids a sweep raised (oom_first), and whether a sweep found one of its processes below the score it was
    # given (JOB_OOM_SCORE_ADJ, or PINNING_OOM_SCORE_ADJ once raised): it is then killed as over its limit.
    raised: set[int] = field(default_factory=set)
    lowered: bool = False
    # Set while all its processes are stopped (a session between cells): what they map or pin cannot grow, and
    # a sweep does not count it. kernel_use costs 0.3 ms of a sweep per run (0.08 ms and 1 ms for the one
    # sock_diag dump with 8 and 64 runs, here): 5 ms a sweep for 64 idle sessions, which counted nothing new.
    paused: bool = False
    # What its processes ran and waited on a run queue, summed over every process a sweep saw.
    cpu_ns: int = 0
    waited_ns: int = 0
    # Each process's schedstat as last seen, so that a sweep adds only what is new.
    seen: dict[int, tuple[int, int]] = field(default_factory=dict)
    # The most processes a look (a sweep, count_now) found it running at once.
    most_processes: int = 0
    # Called after each sweep has counted its CPU.
    on_counted: Callable[[], None] | None = None
    # (time.monotonic(), waited_ns) at each look (a sweep, count_now), the newest last; the first is the
    # watch's start.
    looks: deque[tuple[float, int]] = field(
        default_factory=lambda: deque([(time.monotonic(), 0)], maxlen=RECENT_LOOKS))
    # Set at its deadline's look (close_looks): what it waited lately is what stood then.
    looks_closed: bool = False
    # What all its processes' threads ran (process_stat, at least what schedstat counts of their main threads),
    # summed like cpu_ns: the CPU its own processes could have kept one another waiting for.
    all_threads_ns: int = 0
    # Each process's all_threads_ns as last seen.
    seen_all_threads: dict[int, int] = field(default_factory=dict)
    # Each process seen ready to run (state R): what its main thread had run then, and since when it was seen so.
    ready_since: dict[int, tuple[int, float]] = field(default_factory=dict)
    # The wait in progress at the last look, summed over its processes (WAITING_NOW_MIN_SECONDS), and how many of
    # its processes were ready to run (running or waiting) then.
    waiting_now_ns: int = 0
    ready_now: int = 0
    # What of its wait counts as others' (credit_wait), and waited_ns and the others' CPU as of the last look.
    credited_ns: int = 0
    waited_at_look_ns: int = 0
    others_at_look_ns: int = 0
    # When the watch began (time.monotonic()), and the time of the last look, closed or not.
    started_at: float = field(default_factory=time.monotonic)
    counted_at: float = field(default_factory=time.monotonic)

    def pins(self, kernel: int) -> bool:
        """Whether pinning `kernel` bytes in the kernel is pinning (PINNING_LIMIT_SHARE)."""
        return kernel > max(LONE_KERNEL_BYTES, self.limit // PINNING_LIMIT_SHARE)

    def count_cpu(self, pid: int, ran_ns: int, waited_ns: int) -> int:
        """Add what `pid` ran and waited since the last look; returns the CPU added (ns)."""
        seen_ran, seen_waited = self.seen.get(pid, (0, 0))
        if ran_ns < seen_ran:  # the pid was taken again, by another process of the run
            seen_ran, seen_waited = 0, 0
        self.seen[pid] = (ran_ns, waited_ns)
        self.cpu_ns += ran_ns - seen_ran
        self.waited_ns += max(0, waited_ns - seen_waited)
        return ran_ns - seen_ran

    def count_threads(self, pid: int, ran_ns: int, state: bytes, all_threads_ns: int, now: float) -> None:
        """Add what `pid`'s threads ran since the last look (`ran_ns`: its main thread's, by schedstat), and the wait
        in progress if it is `state` R at `now` with its main thread's count unmoved (WAITING_NOW_MIN_SECONDS)."""
        all_threads_ns = max(all_threads_ns, ran_ns)
        seen = self.seen_all_threads.get(pid, 0)
        if all_threads_ns < seen:  # the pid was taken again (count_cpu)
            seen = 0
        self.seen_all_threads[pid] = all_threads_ns
        self.all_threads_ns += all_threads_ns - seen
        if state != b"R":
            self.ready_since.pop(pid, None)
            return
        self.ready_now += 1
        ready = self.ready_since.get(pid)
        if ready is None or ready[0] != ran_ns:
            self.ready_since[pid] = (ran_ns, now)
        elif now - ready[1] >= WAITING_NOW_MIN_SECONDS:
            self.waiting_now_ns += int((now - ready[1]) * 1e9)

    def credit_wait(self, cpus: float, all_runs_ns: int) -> None:
        """Count what its processes waited since the last look as others' doing, once a look has counted them all;
        `all_runs_ns`: what the watched runs, this one with them, have run since its watch began.

        Where more of its processes were ready to run at the look than the
        sandbox has CPUs (`cpus`), they waited for one another: only what
        the other runs ran meanwhile counts, and the wait in progress not at
        all. Processes that live less than a sweep escape every count of
        CPU (an autoreaped child's is nowhere once it is gone), but a run
        that keeps its main process waiting behind a stream of them has
        them at every look.
        """
        waited, others = self.waited_ns - self.waited_at_look_ns, all_runs_ns - self.cpu_ns - self.others_at_look_ns
        self.waited_at_look_ns, self.others_at_look_ns = self.waited_ns, all_runs_ns - self.cpu_ns
        if self.ready_now > max(1.0, cpus):
            waited = min(waited, max(0, others))
            self.waiting_now_ns = 0
        self.credited_ns += max(0, waited)

    def look(self, now: float) -> None:
        """Note what its processes have waited by `now`, once a look has counted them all."""
        self.counted_at = now
        if not self.looks_closed:
            self.looks.append((now, self.waited_ns))

    def close_looks(self) -> None:
        """Keep the looks as they are (at its deadline, before its kill): the sweeps while its processes die add
        time without wait, which under load can be most of RECENT_WAIT_SECONDS."""
        self.looks_closed = True

    def waited_since(self, span: float) -> float | None:
        """The share of the last `span` seconds to the newest look that its processes waited for a CPU (summed over
        them: past 1 for several waiting at once), from the newest look at least `span` older, or the oldest kept;
        None where no time lies between them."""
        now, waited_now = self.looks[-1]
        then, waited_then = self.looks[0]
        for look_time, look_waited in reversed(self.looks):
            if now - look_time >= span:
                then, waited_then = look_time, look_waited
                break
        if now <= then:
            return None
        return (waited_now - waited_then) * NS / (now - then)


@dataclass(frozen=True)
class CpuMark:
    """Where a run's CPU counts stood at one moment (UsageWatch.mark), to measure from there."""

    all_cpu_ns: int
    cpu_ns: int
    waited_ns: int
    # When (time.monotonic()), what all the run's threads had run then (WatchedRun.all_threads_ns), and what of
    # its wait counted as others' (WatchedRun.credited_ns).
    at: float = 0.0
    all_threads_ns: int = 0
    credited_ns: int = 0


@dataclass(frozen=True)
class CpuShare:
    """What a run got of the sandbox's CPU over its life, and what the other watched runs got meanwhile."""

    ran_seconds: float
    waited_seconds: float
    others_ran_seconds: float
    # The most processes the run had at once (the waits above are summed over them).
    most_processes: int = 1
    # The share of its last RECENT_WAIT_SECONDS up to the last look (its deadline's count_now, or a sweep
    # when the judge gave up on it) that it waited for a CPU, summed over its processes; None: too young to tell.
    waited_lately: float | None = None
    # The time it was kept off a CPU it could have used, by the other runs or by the host's other load: what it
    # waited (the wait in progress at the last look too), to no more than the sandbox's CPUs over its life less
    # what all its threads ran (UsageWatch.cpus). On a CPU of its own it waits for nobody; behind its own threads
    # or processes, it waits while the CPUs are its own; and while more of its processes were ready to run than
    # there are CPUs, only what the other runs ran counts (WatchedRun.credit_wait).
    kept_off_seconds: float = 0.0


class UsageWatch:
    """Sweeps the watched runs' processes while there are any (see the module's docstring)."""

    def __init__(self) -> None:
        self._runs: dict[int, WatchedRun] = {}
        self._task: asyncio.Task[None] | None = None
        # The sandbox's CPUs (its quota), from the daemon's hello: what its runs can have at once. 1 while unknown.
        self.cpus = 1.0
        # The CPU every watched run's processes ran while watched, summed: a run's neighbours got
        # what this grew by during its life, less its own.
        self.cpu_ns = 0

    def watch(self, uid: int, limit: int = 0, *, bounded_alone: bool = False,
              on_over: Callable[[], None] | None = None,
              on_counted: Callable[[], None] | None = None) -> WatchedRun:
        """Count the CPU of `uid`'s processes (`on_counted()` after each sweep has), and hold them to `limit` bytes
        together (0: any); `on_over()` once they pass it."""
        run = WatchedRun(uid, limit, bounded_alone, on_over, all_cpu_ns_at_start=self.cpu_ns, on_counted=on_counted)
        self._runs[uid] = run
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sweeping())
        return run

    def unwatch(self, run: WatchedRun) -> None:
        if self._runs.get(run.uid) is run:
            del self._runs[run.uid]

    def share_of(self, run: WatchedRun, since: CpuMark | None = None) -> CpuShare:
        """`run`'s CPU so far (or since `since`, a `mark`), as of the last sweep (or `count_now`)."""
        since = since or CpuMark(run.all_cpu_ns_at_start, 0, 0, run.started_at)
        ran, waited = run.cpu_ns - since.cpu_ns, run.waited_ns - since.waited_ns
        others = self.cpu_ns - since.all_cpu_ns - ran
        room = self.cpus * max(0.0, run.counted_at - since.at) - (run.all_threads_ns - since.all_threads_ns) * NS
        kept_off = max(0.0, min((run.credited_ns - since.credited_ns + run.waiting_now_ns) * NS, room))
        return CpuShare(ran * NS, waited * NS, max(0, others) * NS, run.most_processes,
                        run.waited_since(RECENT_WAIT_SECONDS), kept_off)

    def mark(self, run: WatchedRun) -> CpuMark:
        """Where `run` and the others stand now, as of the last sweep: for a share over part of its life (a
        session's cell)."""
        return CpuMark(self.cpu_ns, run.cpu_ns, run.waited_ns, run.counted_at, run.all_threads_ns, run.credited_ns)

    def count_now(self, run: WatchedRun) -> None:
        """Count `run`'s CPU up to this moment (at its deadline, before it is killed): a sweep may be 50 ms old."""
        pids = processes_of({run.uid}).get(run.uid, [])
        run.most_processes = max(run.most_processes, len(pids))
        now, run.waiting_now_ns, run.ready_now = time.monotonic(), 0, 0
        for pid in pids:
            self._count_cpu(run, pid, now)
        run.credit_wait(self.cpus, self.cpu_ns - run.all_cpu_ns_at_start)
        run.look(now)

    async def count_pinned_now(self, run: WatchedRun) -> None:
        """Count what `run`'s processes pin in the kernel now, as a sweep would: once the OOM killer took one of
        them, what the rest still pin, before they are killed, tells whether the run was filling the sandbox."""
        pids = processes_of({run.uid}).get(run.uid, [])
        if not pids:
            return
        kernel, _ = (await asyncio.to_thread(kernel_use, {run.uid: pids})).get(run.uid, (0, 0))
        run.peak = max(run.peak, kernel + sum(private_memory(pid) for pid in pids))
        run.peak_kernel = max(run.peak_kernel, kernel)
        run.pinning = run.pinning or run.pins(kernel)

    def _count_cpu(self, run: WatchedRun, pid: int, now: float) -> None:
        times = schedstat(pid)
        if times is not None:
            self.cpu_ns += run.count_cpu(pid, *times)
            stat = process_stat(pid)
            if stat is not None:
                run.count_threads(pid, times[0], *stat, now)

    async def _sweeping(self) -> None:
        while self._runs:
            started = time.monotonic()
            await self.sweep()
            spent = time.monotonic() - started
            await asyncio.sleep(min(WATCH_MAX_PAUSE, max(WATCH_SECONDS, spent * WATCH_DUTY_INVERSE)))

    async def sweep(self) -> None:
        processes = processes_of(set(self._runs))
        held_to_limit: list[tuple[WatchedRun, list[int]]] = []
        for run in list(self._runs.values()):
            pids = processes.get(run.uid, [])
            run.most_processes = max(run.most_processes, len(pids))
            now, run.waiting_now_ns, run.ready_now = time.monotonic(), 0, 0
            score = PINNING_OOM_SCORE_ADJ if run.oom_first else JOB_OOM_SCORE_ADJ
            for pid in pids:
                floor = protocol.PINNING_OOM_SCORE_ADJ if pid in run.raised else protocol.JOB_OOM_SCORE_ADJ
                if hold_oom_score(pid, score, floor) and run.limit:
                    run.lowered = True
                self._count_cpu(run, pid, now)
            if run.oom_first:
                run.raised.update(pids)
            if run.lowered and not run.over:
                # Below the score it was given, the OOM killer takes its neighbours, or the agent, first.
                run.over = True
                if run.on_over is not None:
                    run.on_over()
            run.credit_wait(self.cpus, self.cpu_ns - run.all_cpu_ns_at_start)
            run.look(now)
            if len(run.seen) > len(pids):
                # Those gone are reaped: a session forking all its life would otherwise keep every pid it had.
                run.seen = {pid: run.seen[pid] for pid in pids if pid in run.seen}
                run.seen_all_threads = {pid: run.seen_all_threads[pid] for pid in pids if pid in run.seen_all_threads}
                run.ready_since = {pid: run.ready_since[pid] for pid in pids if pid in run.ready_since}
            if run.on_counted is not None:
                run.on_counted()
            if run.limit and not run.over and pids and not run.paused:
                held_to_limit.append((run, pids))
        if not held_to_limit:
            return
        # Off the loop: a run of 256 processes of 512 descriptors each is 131,072 links to read.
        pinned = await asyncio.to_thread(kernel_use, {run.uid: pids for run, pids in held_to_limit})
        for run, pids in held_to_limit:
            if self._runs.get(run.uid) is not run:
                continue  # the run ended meanwhile; its uid may run the next case by now
            kernel, could_pin = pinned.get(run.uid, (0, 0))
            mapped = 0
            # A lone process under RLIMIT_AS maps no more than its limit: only what it pins beyond its
            # descriptors' usual few (a pipe of 64 KiB each for stdout and stderr) makes its mapped memory count.
            if not (run.bounded_alone and len(pids) <= 1 and kernel <= LONE_KERNEL_BYTES):
                mapped = sum(private_memory(pid) for pid in pids)
            if mapped and mapped + kernel > run.limit:
                # Off the loop: for a fork bomb's 256 copies this reads for tens of milliseconds.
                mapped = await asyncio.to_thread(memory_of_run, run.uid, pids)
                if self._runs.get(run.uid) is not run:
                    continue
            held = mapped + kernel
            run.peak = max(run.peak, held)
            run.peak_kernel = max(run.peak_kernel, kernel)
            run.pinning = run.pinning or run.pins(kernel)
            if not run.oom_first and (run.pinning or could_pin > run.limit):
                run.oom_first = True
                run.raised.update(pids)
                for pid in pids:
                    hold_oom_score(pid, PINNING_OOM_SCORE_ADJ)
            if held > run.limit and not run.over:
                run.over = True
                if run.on_over is not None:
                    run.on_over()
