"""Per-run memory accounting against real processes on this machine (switching uids needs root)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.agent.host import usage
from sandboxd.agent.host.runner import (
    STARVED_MAX_PROCESSES,
    RunDeadline,
    RunOutcome,
    RunSpec,
    classify,
    crowded_out,
    others_took,
    starved_out,
    starved_reason,
)
from sandboxd.agent.host.tmpspace import has_room
from sandboxd.agent.protocol import DEADLINE_STRETCH

HOLDER_UID = 29_997  # outside the agent's job range, unused on a test machine
MIB = 1 << 20
# Holds argv[1] MiB of anonymous memory in each of argv[2] processes, then waits to be killed; with argv[3]
# "shared", the memory is allocated before the forks, so that all of them share the same pages.
HOLDER = """
import os, sys, time
size, processes, shared = int(sys.argv[1]) << 20, int(sys.argv[2]), sys.argv[3] == "shared"
if shared:
    held = bytearray(b"x") * size
for _ in range(processes - 1):
    if os.fork() == 0:
        break
if not shared:
    held = bytearray(b"x") * size
os.write(1, b"ready\\n")  # one write each: print()'s may interleave with a sibling's
time.sleep(120)
"""
SYSTEM_PYTHON = "/usr/bin/python3"
as_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                             reason=f"switching to another uid needs root, and {SYSTEM_PYTHON}")


# What a worker gives a job's process before it runs: a lower score is a run's attack (usage.WatchedRun.lowered).
A_JOBS_OOM_SCORE = f"open('/proc/self/oom_score_adj', 'w').write('{usage.protocol.JOB_OOM_SCORE_ADJ}')\n"


@contextlib.contextmanager
def _run_as_holder(program: str, args: list[str], processes: int) -> Iterator[subprocess.Popen[bytes]]:
    """`program`, which forks into `processes` processes of HOLDER_UID that each write "ready", until the block
    ends; then all of them are killed."""
    # The system's interpreter, from /: a CI clone in a 0700 temp folder is out of HOLDER_UID's reach.
    holder = subprocess.Popen([SYSTEM_PYTHON, "-c", A_JOBS_OOM_SCORE + program, *args], stdout=subprocess.PIPE, cwd="/",
                              user=HOLDER_UID, group=HOLDER_UID, extra_groups=[], start_new_session=True)
    try:
        assert holder.stdout is not None
        for _ in range(processes):
            assert holder.stdout.readline() == b"ready\n"
        yield holder
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        # Its forked children are reaped by init: the next test must not find them.
        deadline = time.monotonic() + 10
        while usage.processes_of({HOLDER_UID}) and time.monotonic() < deadline:
            time.sleep(0.01)


def holding(mib: int, processes: int, *, shared: bool = False) -> contextlib.AbstractContextManager[
        subprocess.Popen[bytes]]:
    """`processes` processes of HOLDER_UID holding `mib` MiB each (or the same `mib` MiB), until the block ends."""
    return _run_as_holder(HOLDER, [str(mib), str(processes), "shared" if shared else "own"], processes)


def test_oom_kills_read_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 75408\noom_kill 181\nunevictable_pgs_culled 0\n")
    assert usage.oom_kills(str(vmstat)) == 181
    # A kernel before 4.13 has no counter: unknown, not zero.
    vmstat.write_text("pgfault 75408\n")
    assert usage.oom_kills(str(vmstat)) is None
    assert usage.oom_kills(str(tmp_path / "absent")) is None
    assert isinstance(usage.oom_kills(), int)  # this kernel's


@as_root
def test_sandbox_usage_counts_every_process_and_its_threads() -> None:
    held, tasks = usage.sandbox_usage()
    with holding(48, 3):
        more_held, more_tasks = usage.sandbox_usage()
    # Other processes of this machine come and go meanwhile; three of 48 MiB stand out.
    assert more_held - held > 100 * MIB
    assert more_tasks >= 3 and tasks >= threading.active_count()


def test_private_memory_counts_anonymous_pages_and_nothing_of_a_gone_process() -> None:
    before = usage.private_memory(os.getpid())
    held = bytearray(b"x") * (32 * MIB)
    assert usage.private_memory(os.getpid()) >= before + 30 * MIB
    del held
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert usage.private_memory(gone.pid) == 0


def sweeps_of(limit: int, *, bounded_alone: bool) -> tuple[usage.WatchedRun, int]:
    """(the watched run after one sweep, how many times it was reported over)."""
    reports: list[int] = []

    async def scenario() -> usage.WatchedRun:
        watch = usage.UsageWatch()
        run = watch.watch(HOLDER_UID, limit, bounded_alone=bounded_alone, on_over=lambda: reports.append(1))
        await watch.sweep()
        await watch.sweep()  # reported once, not per sweep
        watch.unwatch(run)
        return run

    return asyncio.run(scenario()), len(reports)


@as_root
def test_a_run_whose_processes_hold_more_than_its_limit_together_is_reported_once() -> None:
    # Each of the three stays under 64 MiB, as RLIMIT_AS would keep each; together they hold 144 MiB.
    with holding(48, 3):
        run, reports = sweeps_of(64 * MIB, bounded_alone=True)
        assert reports == 1 and run.over
        assert run.peak >= 3 * 46 * MIB
        run, reports = sweeps_of(256 * MIB, bounded_alone=True)
        assert reports == 0 and not run.over and 3 * 46 * MIB <= run.peak < 256 * MIB


@as_root
def test_pages_the_processes_share_count_once() -> None:
    """Forked copies share their parent's pages until they write them: RssAnon counts them in each (a Python fork
    bomb's copies of a warm interpreter came to 2.4 GB, a job holding 150 sleeping children to 660 MiB)."""
    with holding(48, 3, shared=True):
        upper_bound = sum(usage.private_memory(pid) for pid in usage.processes_of({HOLDER_UID})[HOLDER_UID])
        assert upper_bound >= 3 * 46 * MIB
        run, reports = sweeps_of(64 * MIB, bounded_alone=True)
        assert (reports, run.over) == (0, False)
        assert 46 * MIB <= run.peak < 64 * MIB


@as_root
def test_a_single_process_under_rlimit_as_is_not_measured_and_one_without_is() -> None:
    """Only what a lone process under RLIMIT_AS pins in the kernel counts (here its stdout pipe), up to
    LONE_KERNEL_BYTES; its mapped memory is RLIMIT_AS's to bound."""
    with holding(48, 1):
        run, reports = sweeps_of(16 * MIB, bounded_alone=True)
        assert reports == 0 and run.peak == run.peak_kernel < usage.LONE_KERNEL_BYTES
        run, reports = sweeps_of(16 * MIB, bounded_alone=False)  # Go, Java, Node: no RLIMIT_AS
        assert reports == 1 and run.peak >= 46 * MIB


@as_root
def test_a_lowered_oom_score_is_put_back_by_the_sweep() -> None:
    """An exec'd program owns its /proc files and may lower its score to the agent's: the OOM killer would then
    take an innocent run beside it first."""
    with holding(1, 1) as holder:
        Path(f"/proc/{holder.pid}/oom_score_adj").write_text("0")
        run, reports = sweeps_of(1 << 40, bounded_alone=True)
        assert Path(f"/proc/{holder.pid}/oom_score_adj").read_text().strip() == "750"
        # And killed for it (as over its limit): lowering in a loop, a run sat at the agent's score.
        assert (run.lowered, run.over, reports) == (True, True, 1)
        run, reports = sweeps_of(1 << 40, bounded_alone=True)  # put back, and not lowered since
        assert (run.lowered, reports) == (False, 0)


# Each of argv[2] processes runs argv[1] seconds of CPU, whatever the load, then says "ready" and sleeps; with
# argv[1] 0, says "ready" and runs until killed.
SPINNER = """
import os, sys, time
seconds, processes = float(sys.argv[1]), int(sys.argv[2])
for _ in range(processes - 1):
    if os.fork() == 0:
        break
if not seconds:
    os.write(1, b"ready\\n")
    while True:
        pass
while time.process_time() < seconds:
    pass
os.write(1, b"ready\\n")
time.sleep(120)
"""
IDLE_UID = HOLDER_UID - 1


def spinning(seconds: float, processes: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """`processes` processes of HOLDER_UID that have each run `seconds` of CPU (0: that run until the block ends)."""
    return _run_as_holder(SPINNER, [str(seconds), str(processes)], processes)


def test_schedstat_reads_what_a_process_ran_and_waited_and_nothing_of_a_gone_one() -> None:
    own = usage.schedstat(os.getpid())
    assert own is not None and own[0] > 0 and own[1] >= 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert usage.schedstat(gone.pid) is None


def test_process_stat_reads_a_process_state_and_what_all_its_threads_ran() -> None:
    """schedstat counts a process's main thread only: a thread that spins is in /proc/<pid>/stat's count."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        started = usage.process_stat(os.getpid())
        assert started is not None
        while (now := usage.process_stat(os.getpid())) is not None and now[1] - started[1] < 0.2e9:
            stop.wait(0.01)
    finally:
        stop.set()
        spinner.join()
    own = usage.schedstat(os.getpid())
    assert now is not None and own is not None and now[0] == b"R"  # it is reading: running
    assert now[1] - started[1] >= 0.2e9 and now[1] > own[0]
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert usage.process_stat(gone.pid) is None


def test_a_run_counts_only_what_its_processes_ran_since_the_last_look() -> None:
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None)
    assert run.count_cpu(5, 100, 10) == 100
    assert run.count_cpu(5, 150, 30) == 50
    assert run.count_cpu(6, 40, 0) == 40
    # Pid 5 taken again by another process of the run: what it ran counts from zero.
    assert run.count_cpu(5, 20, 5) == 20
    assert (run.cpu_ns, run.waited_ns) == (210, 35)


@as_root
def test_a_runs_cpu_is_its_own_and_its_neighbours_others() -> None:
    async def scenario() -> tuple[usage.CpuShare, usage.CpuShare]:
        watch = usage.UsageWatch()
        idle = watch.watch(IDLE_UID)  # a run that sleeps beside the busy one
        busy = watch.watch(HOLDER_UID)
        with spinning(0.2, 2):
            await watch.sweep()  # a process seen for the first time counts all it ran
            counted = busy.cpu_ns
            await watch.sweep()  # and then only what it ran since: they sleep now
            assert busy.cpu_ns - counted < 0.05e9
        await watch.sweep()  # its processes are gone: forgotten, what they ran kept
        assert (busy.seen, busy.cpu_ns) == ({}, counted)
        watch.unwatch(busy)
        watch.unwatch(idle)
        return watch.share_of(idle), watch.share_of(busy)

    idle, busy = asyncio.run(scenario())
    # Each spun 0.2 s by its own clock; schedstat's count came to 0.398 s for the two once (full unit run).
    assert busy.ran_seconds >= 0.38 and busy.others_ran_seconds == 0
    assert idle.ran_seconds == 0 and idle.others_ran_seconds == pytest.approx(busy.ran_seconds)


@as_root
def test_the_sandbox_has_no_room_while_job_threads_crowd_its_cpus(tmp_path: Path) -> None:
    with spinning(0, 4):
        assert usage.runnable_job_tasks() >= 4
        assert not has_room(str(tmp_path), cpus=1.0)
        assert has_room(str(tmp_path), cpus=1000.0)
        assert has_room(str(tmp_path))  # CPUs unknown: not judged


def test_starved_only_waiting_most_of_its_time_while_the_others_ran_several_times_its_cpu() -> None:
    def share(ran: float, waited: float, others: float, processes: int = 1) -> usage.CpuShare:
        return usage.CpuShare(ran_seconds=ran, waited_seconds=waited, others_ran_seconds=others,
                              most_processes=processes)

    # Beside a run of 30 busy processes in a one-CPU sandbox: 1/31 of it.
    assert starved_out(share(0.06, 1.9, 1.9), 2.0)
    # Beside one busy run of its own size, or on a host loaded at its limit: the others ran what it ran.
    assert not starved_out(share(1.0, 1.0, 1.0), 2.0)
    assert not starved_out(share(0.5, 1.5, 0.5), 2.0)
    # Sleeping beside a busy neighbour: it waited on no run queue.
    assert not starved_out(share(0.001, 0.01, 2.0), 2.0)
    # Its own 30 threads kept its main one waiting: their CPU is its own.
    assert not starved_out(share(2.0, 50.0, 0.0), 2.0)
    # A run that ran nothing at all (a sweep never saw it) is judged as one that ran 1 ms.
    assert starved_out(share(0.0, 1.5, 0.01), 2.0)
    assert not starved_out(share(0.0, 1.5, 0.002), 2.0)
    assert not starved_out(None, 2.0)
    # A fork bomb beside another (bare CI): its summed waits are mostly behind itself, and its CPU escaped the count.
    assert not starved_out(share(0.12, 73.28, 1.59, processes=256), 2.07)
    assert starved_out(share(0.06, 1.9, 1.9, processes=2), 2.0)  # bash and the program it runs
    assert starved_reason(share(0.06, 1.9, 1.9), 2.0) == ("other runs took the sandbox's CPU: in 2.00 s this run ran "
                                                         "0.06 s and waited 1.90 s for a CPU, while they ran 1.90 s")
    assert starved_reason(share(1.0, 1.0, 1.0), 2.0) == starved_reason(None, 2.0) == ""


def test_starved_only_still_waiting_at_its_deadline() -> None:
    """A sleeper whose start waited over half its time beside a run of 31 busy processes (bare CI), then slept
    through its deadline, was retried as starved: a CPU would not have saved it."""
    def share(waited_lately: float | None) -> usage.CpuShare:
        return usage.CpuShare(ran_seconds=0.06, waited_seconds=1.9, others_ran_seconds=1.9,
                              waited_lately=waited_lately)

    assert starved_out(share(0.97), 2.0)  # 1/32 of a CPU up to the end
    assert starved_out(share(1.9), 2.0)  # two processes waiting at once: their waits are summed
    assert not starved_out(share(0.0), 2.0)  # asleep at the end
    assert not starved_out(share(0.3), 2.0)
    assert starved_out(share(None), 2.0)  # too young for its end to be told: its life decides
    assert starved_reason(share(0.0), 2.0) == ""


def test_a_runs_recent_wait_is_measured_back_from_its_newest_look() -> None:
    ms = 1_000_000
    span = 0.2  # the span these looks are laid out for
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None)
    run.looks.clear()
    # It waited 45 ms of every 50 for a second, then slept for half a second.
    for step in range(21):
        run.waited_ns = 45 * ms * step
        run.look(100.0 + 0.05 * step)
    assert run.waited_since(span) == pytest.approx(0.9)
    for step in range(1, 11):
        run.look(101.0 + 0.05 * step)
    assert run.waited_since(span) == 0.0
    # Looks closer together than the span: measured from the newest one at least the span older.
    run.waited_ns += 10 * ms
    run.look(101.51)
    assert run.waited_since(span) == pytest.approx(0.01 / 0.21)
    # Fewer looks kept than the span: from the oldest kept.
    young = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None)
    young.looks.clear()
    young.look(5.0)
    assert young.waited_since(span) is None  # no time between its looks
    young.waited_ns = 40 * ms
    young.look(5.05)
    assert young.waited_since(span) == pytest.approx(0.8)


def test_a_runs_looks_closed_at_its_deadline_keep_what_it_waited_then() -> None:
    """The sweeps while a killed run's processes die add time without wait: they must not dilute the wait that
    stood at its deadline (bare CI: a run that waited 5.8 s of its 6.1 s was seen waiting 0.46 of its last 0.2 s,
    and charged TIMEOUT)."""
    ms = 1_000_000
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None)
    run.looks.clear()
    for step in range(21):  # waiting 45 ms of every 50 up to its deadline, at 101.0
        run.waited_ns = 45 * ms * step
        run.look(100.0 + 0.05 * step)
    run.close_looks()
    for step in range(1, 11):  # then killed, and looked at for another half second
        run.look(101.0 + 0.05 * step)
    assert run.waited_since(usage.RECENT_WAIT_SECONDS) == pytest.approx(0.9)


@as_root
def test_a_deadline_look_tells_waiting_processes_from_sleeping_ones() -> None:
    """Through /proc: processes that spun on a crowded CPU and then slept waited nothing lately; processes that
    still spin three to a CPU wait most of the time."""
    async def scenario() -> tuple[float | None, float | None]:
        watch = usage.UsageWatch()
        run = watch.watch(HOLDER_UID)
        crowd = 3 * (os.cpu_count() or 1)
        with spinning(0.05, crowd):
            await watch.sweep()  # all have spun, waiting for one another
            await asyncio.sleep(2 * usage.RECENT_WAIT_SECONDS)
            watch.count_now(run)
            asleep = watch.share_of(run).waited_lately
        with spinning(0, crowd):
            for _ in range(4):
                await watch.sweep()
                await asyncio.sleep(usage.RECENT_WAIT_SECONDS / 2)
            watch.count_now(run)
            spinning_now = watch.share_of(run).waited_lately
        watch.unwatch(run)
        return asleep, spinning_now

    asleep, spinning_now = asyncio.run(scenario())
    assert asleep is not None and asleep < 0.05, asleep
    assert spinning_now is not None and spinning_now >= 0.5, spinning_now


def test_a_share_since_a_mark_counts_from_there() -> None:
    """A session's cell is judged by what it and the others ran during the cell, not over the session's life."""
    watch = usage.UsageWatch()
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None)
    second = 1_000_000_000
    watch.cpu_ns += run.count_cpu(5, 1 * second, second // 5)  # earlier cells: it ran 1 s, waited 0.2 s
    watch.cpu_ns += 3 * second  # the others, meanwhile
    mark = watch.mark(run)
    watch.cpu_ns += run.count_cpu(5, 11 * second // 10, 19 * second // 10)  # the cell: ran 0.1 s, waited 1.7 s
    watch.cpu_ns += 18 * second // 10
    cell = watch.share_of(run, since=mark)
    assert (cell.ran_seconds, cell.waited_seconds, cell.others_ran_seconds) == pytest.approx((0.1, 1.7, 1.8))
    assert starved_out(cell, 2.0)
    life = watch.share_of(run)
    assert (life.ran_seconds, life.waited_seconds, life.others_ran_seconds) == pytest.approx((1.1, 1.9, 4.8))


MS = 1_000_000


def kept_off(processes: list[tuple[int, int, int]], *, seconds: float = 1.0, cpus: float = 1.0, ready: int = 0,
             others_ms: int = 0) -> float:
    """What share_of says others kept a run off the CPU after `seconds` of watch, on `cpus` CPUs, its processes
    having (ms) run on their main thread, waited on a run queue, and run on all their threads; the first `ready`
    of them ready to run at the look, and the other runs having run `others_ms`."""
    watch = usage.UsageWatch()
    watch.cpus = cpus
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None, started_at=100.0)
    watch.cpu_ns += others_ms * MS
    for pid, (ran, waited, all_threads) in enumerate(processes, start=5):
        watch.cpu_ns += run.count_cpu(pid, ran * MS, waited * MS)
        run.count_threads(pid, ran * MS, b"R" if pid - 5 < ready else b"S", all_threads * MS, 100.0 + seconds)
    run.credit_wait(watch.cpus, watch.cpu_ns)
    run.look(100.0 + seconds)
    return watch.share_of(run).kept_off_seconds


def test_a_run_is_kept_off_the_cpu_by_its_neighbours_and_by_the_hosts_load_but_not_by_itself() -> None:
    # Beside a busy loop in a one-CPU sandbox: half of it (the red team's case, a 0.53 s program at its 1 s).
    assert kept_off([(500, 500, 500)]) == pytest.approx(0.5)
    # Beside a busy loop on a host at load 20 (two CPUs): it ran 69 ms and waited 981 ms in 1.05 s, its neighbour
    # ran 29 ms. Only the neighbour's 29 ms moved its deadline, and it was charged TIMEOUT at 1.03 s.
    assert kept_off([(69, 981, 69)], seconds=1.05) == pytest.approx(0.981)
    assert kept_off([(1000, 0, 1000)]) == 0.0  # alone: it had the CPU
    assert kept_off([(0, 0, 0)]) == 0.0  # asleep: it waited for no CPU
    # Behind its own threads (its main thread waited, its other threads had the CPU), or its own processes.
    assert kept_off([(100, 900, 1000)]) == 0.0
    assert kept_off([(250, 750, 250)] * 4) == 0.0
    # Four processes of its own, and the host took half the CPU: that half, not their summed waits.
    assert kept_off([(125, 875, 125)] * 4) == pytest.approx(0.5)
    # A sandbox of half a CPU throttles a lone busy run half the time: its own quota, not others'.
    assert kept_off([(500, 500, 500)], cpus=0.5) == 0.0
    assert kept_off([(250, 750, 250)], cpus=0.5) == pytest.approx(0.25)
    # On two CPUs two busy processes wait for nobody but the host.
    assert kept_off([(1000, 0, 1000)] * 2, cpus=2.0) == 0.0
    assert kept_off([(500, 500, 500)] * 2, cpus=2.0) == pytest.approx(1.0)  # summed over them, as their waits are


def test_a_run_crowded_by_its_own_processes_at_a_look_earns_only_what_the_others_ran() -> None:
    """Processes that live less than a sweep escape every count of CPU: a busy main process beside a stream of
    autoreaped 10 ms children waited most of its time behind them, and they were nowhere in the count of its CPU.
    But a stream keeps some of them at every look: more of its processes ready to run than the sandbox has CPUs."""
    # Its main process ran 0.25 s and waited 0.75 s behind three children that the counts missed but for 30 ms:
    # by the CPU counted, the sandbox's CPU was others' for 0.72 s.
    crowded = [(250, 750, 250), (10, 10, 10), (10, 10, 10), (10, 10, 10)]
    assert kept_off(crowded) == pytest.approx(0.72)
    assert kept_off(crowded, ready=4) == 0.0  # but all four were ready to run at the look
    assert kept_off(crowded, ready=4, others_ms=200) == pytest.approx(0.2)  # what a neighbour ran meanwhile
    assert kept_off(crowded, ready=2, cpus=2.0) == pytest.approx(0.78)  # as many as the CPUs: not crowded
    assert kept_off([(500, 500, 500)], ready=1) == pytest.approx(0.5)  # one, waiting or running: not crowded


def test_the_wait_in_progress_counts_once_a_ready_process_has_not_run_for_two_looks() -> None:
    """schedstat counts a wait once it ends: a process ready to run (R) whose count did not move between two looks
    waited all that time, and it counts before it gets the CPU; then its wait counts once, as schedstat's."""
    watch = usage.UsageWatch()
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None, started_at=100.0)

    def look(now: float, ran_ms: int, waited_ms: int, state: bytes) -> float:
        run.waiting_now_ns, run.ready_now = 0, 0
        watch.cpu_ns += run.count_cpu(5, ran_ms * MS, waited_ms * MS)
        run.count_threads(5, ran_ms * MS, state, ran_ms * MS, now)
        run.credit_wait(watch.cpus, watch.cpu_ns)
        run.look(now)
        return watch.share_of(run).kept_off_seconds

    assert look(100.5, 50, 100, b"R") == pytest.approx(0.1)  # it ran then: its wait from then on is not known
    assert look(100.6, 50, 100, b"R") == pytest.approx(0.2)  # ready, and it ran nothing since: it waited
    assert look(100.9, 50, 100, b"R") == pytest.approx(0.5)
    assert look(101.0, 60, 500, b"R") == pytest.approx(0.5)  # it ran: its wait is schedstat's, counted once
    assert look(101.5, 60, 500, b"S") == pytest.approx(0.5)  # asleep: not waiting
    # A running process's count moves only at the scheduler's tick: two looks that close tell nothing.
    assert look(101.6, 70, 500, b"R") == pytest.approx(0.5)
    assert look(101.61, 70, 500, b"R") == pytest.approx(0.5)
    # Not past the sandbox's CPU less its own, whatever it seems to wait.
    assert look(103.0, 70, 500, b"R") == pytest.approx(min(0.5 + 1.4, 3.0 - 0.07))


def test_a_cells_kept_off_time_counts_from_its_mark() -> None:
    watch = usage.UsageWatch()
    run = usage.WatchedRun(uid=1, limit=0, bounded_alone=False, on_over=None, started_at=100.0)
    watch.cpu_ns += run.count_cpu(5, 1000 * MS, 200 * MS)  # earlier cells: it ran 1 s and waited 0.2 s in 2 s
    run.count_threads(5, 1000 * MS, b"S", 1000 * MS, 102.0)
    run.credit_wait(watch.cpus, watch.cpu_ns)
    run.look(102.0)
    mark = watch.mark(run)
    watch.cpu_ns += run.count_cpu(5, 1100 * MS, 1900 * MS)  # the cell: ran 0.1 s, waited 1.7 s in 2 s
    run.count_threads(5, 1100 * MS, b"R", 1100 * MS, 104.0)
    run.credit_wait(watch.cpus, watch.cpu_ns)
    run.look(104.0)
    assert watch.share_of(run, since=mark).kept_off_seconds == pytest.approx(1.7)
    assert watch.share_of(run).kept_off_seconds == pytest.approx(1.9)


def test_a_deadline_moves_by_the_time_others_kept_the_run_off_the_cpu_and_no_further() -> None:
    def share(kept_off: float, processes: int = 1) -> usage.CpuShare:
        return usage.CpuShare(ran_seconds=0.1, waited_seconds=kept_off, others_ran_seconds=0.0,
                              most_processes=processes, kept_off_seconds=kept_off)

    assert others_took(share(0.5), 2.0) == 0.5
    assert others_took(share(0.0), 2.0) == 0.0
    assert others_took(share(5.0), 2.0) == 2.0  # no further than asked
    assert others_took(share(5.0, processes=STARVED_MAX_PROCESSES + 1), 2.0) == 0.0  # a fork bomb
    assert others_took(None, 2.0) == 0.0

    deadline = RunDeadline(started=100.0, timeout=1.0)
    assert deadline.at == 101.0
    assert deadline.move(share(0.5))
    assert (deadline.at, deadline.moved_seconds) == (101.5, 0.5)
    # It waited through its moved deadline too: it moves again, by what they have taken since.
    assert deadline.move(share(0.75))
    assert deadline.at == 101.75
    assert not deadline.move(share(0.755))  # less than DEADLINE_MIN_MOVE more: it ends
    assert deadline.at == 101.75
    # Up to the stretch; past it, the run did not have its timeout.
    assert not deadline.past_stretch
    assert deadline.move(share(2.0))
    assert deadline.at == 100.0 + DEADLINE_STRETCH and not deadline.past_stretch
    assert not deadline.move(share(2.5))
    assert deadline.at == 100.0 + DEADLINE_STRETCH and deadline.past_stretch


def test_starved_when_kept_off_longer_than_its_deadline_could_move_for() -> None:
    """Beside a host at load 20 the sandbox's runs all get a sliver of the CPU: the other runs' CPU tells nothing,
    the time the run was kept off does. A run kept off more than 1 - 1 / DEADLINE_STRETCH of its time, at its
    deadline moved by the whole stretch, did not have its timeout of time to run: it is retried."""
    def share(ran: float, kept_off: float, lately: float | None = 0.95, processes: int = 1) -> usage.CpuShare:
        return usage.CpuShare(ran_seconds=ran, waited_seconds=kept_off, others_ran_seconds=ran,
                              most_processes=processes, waited_lately=lately, kept_off_seconds=kept_off)

    stretched = DEADLINE_STRETCH * 1.0  # a 1 s timeout moved as far as it goes
    assert starved_out(share(0.2, 2.8), stretched)  # 7% of a CPU up to the end
    assert starved_out(share(0.2, 2.8, lately=None), stretched)
    assert not starved_out(share(0.2, 2.8, lately=0.1), stretched)  # asleep at the end: a CPU would not save it
    assert not starved_out(share(0.2, 2.8, processes=STARVED_MAX_PROCESSES + 1), stretched)
    # A busy loop beside another, host or none: its deadline moved by what it waited, and it had its timeout.
    assert not starved_out(share(1.0, 1.0), 2.0)
    assert not starved_out(share(1.0, 2.0), 3.0)  # a third of the CPU: its timeout of it, at the stretch
    assert starved_reason(share(0.2, 2.8), 3.0) == (
        "the host's other load and the sandbox's other runs took its CPU: in 3.00 s this run ran 0.20 s and was kept "
        "off a CPU for 2.80 s, more than its deadline could move for (3 times its timeout); the other runs ran 0.20 s")
    # Its judge's word for a call whose deadline moved by the whole stretch, a call among others that ran.
    assert not starved_out(share(1.0, 2.0), 5.0)
    assert starved_out(share(1.0, 2.0), 5.0, past_stretch=True)
    assert not starved_out(share(1.0, 2.0, lately=0.1), 5.0, past_stretch=True)


def _outcome(wait_status: int, *, killed_for: str = "", oom_kills: int | None = 1, max_rss: int = 0,
             peak: int = 0, cpu_seconds: float = 0.1, kernel: int = 0, pinning: bool = False) -> RunOutcome:
    return RunOutcome(wait_status=wait_status, stdout=b"", stderr=b"", stdout_truncated=False,
                      stderr_truncated=False, killed_for=killed_for, wall_seconds=0.2, cpu_seconds=cpu_seconds,
                      max_rss_bytes=max_rss, peak_memory_bytes=peak, peak_kernel_bytes=kernel, pinning=pinning,
                      oom_kills=oom_kills)


SIGKILLED = signal.SIGKILL  # a wait status: terminated by signal 9


def test_a_sigkill_is_the_oom_killers_only_when_it_killed_meanwhile() -> None:
    spec = RunSpec(mode="python", uid=1, cwd="/", timeout=1.0, output_limit=1, rlimits={"cpu": 2},
                   memory_limit=256 * MIB)
    assert classify(_outcome(SIGKILLED, oom_kills=1), spec)[:2] == ("memory_limit", "memory")
    assert classify(_outcome(SIGKILLED, oom_kills=None), spec)[:2] == ("memory_limit", "memory")
    # os.kill(os.getpid(), SIGKILL) with no OOM kill in the sandbox: the program's own doing.
    assert classify(_outcome(SIGKILLED, oom_kills=0), spec) == ("runtime_error", "", "killed by signal SIGKILL")
    assert classify(_outcome(SIGKILLED, oom_kills=0, cpu_seconds=2.0), spec)[:2] == ("timeout", "cpu_time")
    over = classify(_outcome(SIGKILLED, killed_for="memory", peak=300 * MIB), spec)
    assert over == ("memory_limit", "memory", "its processes held 300 MiB together, over the limit of 256 MiB")


def test_crowded_out_only_under_its_own_limit_and_under_half_the_sandbox() -> None:
    sandbox = 2048 * MIB
    assert crowded_out(_outcome(SIGKILLED, max_rss=200 * MIB), 512 * MIB, sandbox)
    # No OOM kill meanwhile, or unknown, or killed by us: the run's own end.
    assert not crowded_out(_outcome(SIGKILLED, oom_kills=0, max_rss=200 * MIB), 512 * MIB, sandbox)
    assert not crowded_out(_outcome(SIGKILLED, oom_kills=None, max_rss=200 * MIB), 512 * MIB, sandbox)
    assert not crowded_out(_outcome(SIGKILLED, killed_for="memory", peak=600 * MIB), 512 * MIB, sandbox)
    # Over its own limit (its processes together), or alone holding half the sandbox: its own doing.
    assert not crowded_out(_outcome(SIGKILLED, peak=600 * MIB), 512 * MIB, sandbox)
    assert not crowded_out(_outcome(SIGKILLED, max_rss=1100 * MIB), 2048 * MIB, sandbox)
    assert not crowded_out(_outcome(SIGKILLED, max_rss=200 * MIB), 512 * MIB, None)


def test_a_pinning_run_the_oom_killer_took_under_its_limit_is_charged() -> None:
    """The OOM killer took it first because it pinned memory in the kernel (usage.PINNING_OOM_SCORE_ADJ): its own
    doing, though the sweep last saw it under its limit. It is not retried."""
    spec = RunSpec(mode="python", uid=1, cwd="/", timeout=1.0, output_limit=1, rlimits={}, memory_limit=256 * MIB)
    pinner = _outcome(SIGKILLED, peak=200 * MIB, kernel=190 * MIB, pinning=True)
    assert not crowded_out(pinner, 256 * MIB, 2048 * MIB)
    assert classify(pinner, spec) == ("memory_limit", "memory", (
        "killed by the out-of-memory killer while its processes pinned memory in the kernel: they were last seen "
        "holding 200 MiB together (190 MiB of it in the kernel: socket buffers, pipes and other descriptors)"))
    assert crowded_out(_outcome(SIGKILLED, peak=200 * MIB, kernel=190 * MIB), 256 * MIB, 2048 * MIB)
