"""Sessions inside one sandbox: a uid, a work dir and, for Python, a live interpreter each.

A sandbox holds many sessions at once (sessions.per_sandbox); what keeps
them apart is what keeps jobs apart: a uid of its own per session, a work
dir only that uid can enter, no shared writable folder, and processes that
other uids can neither signal nor trace.

Python: one worker forked from the zygote at open, kept for the session's
life; its namespace is the state. A cell past its deadline is interrupted
(SIGINT, a KeyboardInterrupt in the cell) and the session lives on; a cell
that ignores the interrupt for SESSION_INTERRUPT_GRACE seconds takes the
session down with it. Bash: each cell is a fresh `bash` that first restores
the state (variables, exported environment, functions, options, working
directory) the previous cell saved on exit, so a timeout kills that cell
only and no shell lingers between cells.

Between cells a session takes no more than its share of the sandbox: a
Python session's processes (the interpreter with its threads, and whatever
a cell left running) are stopped (SIGSTOP) from the end of one cell to the
start of the next, so they take no CPU from the other sessions' cells; and
what a session's files hold of /tmp (and /dev/shm) after a cell is held to
its share, 1 / sessions.per_sandbox of the tmpfs's bytes and entries, or the
session ends there (its files removed before the cell's answer).

A final cell (RunCell's `final`) checks what a session left behind where its
own code cannot fake the verdict: every process of the session's uid is
killed first, then the cell runs in a fresh process (a Python interpreter
forked from the zygote that ran none of the session's cells, or a bash that
restores none of its state), and the session ends with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import stat
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sandboxd.agent.host import tree, usage
from sandboxd.agent.host.cleanup import _as_uid, kill_uid, sigkill_uid
from sandboxd.agent.host.offloop import off_loop
from sandboxd.agent.host.runner import LOWERED_MESSAGE, OutputBudget, PipeReader, RunSpec, classify, starved_reason
from sandboxd.agent.host.servers import ResidentWorker
from sandboxd.agent.host.usage import CpuShare, WatchedRun, _file_system_ids
from sandboxd.agent.messages import SandboxFull
from sandboxd.agent.protocol import VALUE_PREVIEW_CHARS, BadRequest

if TYPE_CHECKING:
    from sandboxd.agent.host.jobhost import JobHost

SESSION_INTERRUPT_GRACE = 2.0
# Output still arriving after a cell's result (a child holding the pipe).
CELL_DRAIN_SECONDS = 0.5
# files_changed lists at most this many paths; the scan stops there too.
MAX_SCANNED_ENTRIES = 2000
RESULT_FRAME_BYTES = 1 << 20
# repl.VALUE_PREVIEW_CHARS and the note on what was cut.
MAX_VALUE_CHARS = VALUE_PREVIEW_CHARS + 64
BASH_STATE_FILE = ".sandboxd-bash-state"
# Listings of a session's processes while stopping them (pause_uid): each round stops those a listing found that
# the last did not (children forked before their parent's stop). A fork bomb that outruns this many rounds is
# stopped at once by kill(-1) as the uid, which costs a fork of the controller.
PAUSE_ROUNDS = 16
# Restores the previous cell's state, runs the cell (from stdin, so that the
# controller never writes into the session's folder), saves the state on any
# exit. Bash's own read-only and per-process variables are not saved.
BASH_WRAPPER = r"""
__sandboxd_state=$1
if [ -f "$__sandboxd_state" ]; then source "$__sandboxd_state" >/dev/null 2>&1; fi
__sandboxd_save() {
  local __sandboxd_status=$? __sandboxd_name
  {
    for __sandboxd_name in $(compgen -v); do
      case $__sandboxd_name in
        BASH*|EUID|UID|PPID|SHELLOPTS|FUNCNAME|GROUPS|PIPESTATUS|RANDOM|SRANDOM|SECONDS|LINENO|HISTCMD|\
DIRSTACK|EPOCHREALTIME|EPOCHSECONDS|COMP_*|OPTIND|OPTARG|OPTERR|SHLVL|_|__sandboxd_*) continue ;;
      esac
      declare -p "$__sandboxd_name" 2>/dev/null
    done
    declare -f
    shopt -p
    printf 'cd -- %q\n' "$PWD"
  } > "$__sandboxd_state.tmp" 2>/dev/null && mv -f "$__sandboxd_state.tmp" "$__sandboxd_state"
  exit $__sandboxd_status
}
trap __sandboxd_save EXIT
__sandboxd_cell=$(cat)
eval "$__sandboxd_cell"
"""
# A final bash cell: the cell from stdin, as above, in a shell that restores nothing the session's cells saved.
BASH_FINAL = r"""
__sandboxd_cell=$(cat)
eval "$__sandboxd_cell"
"""


def scan(workdir: str) -> dict[str, tuple[int, int]]:
    """path -> (mtime_ns, size) for the files under `workdir`, links not followed (tree.walk); those deeper
    than tree.MAX_RELPATH_BYTES are not listed.

    At most MAX_SCANNED_ENTRIES entries are looked at, folders included: the
    walk runs on the controller's event loop, and a tree of empty folders
    must not stall every other job of the sandbox.
    """
    found: dict[str, tuple[int, int]] = {}
    with contextlib.closing(tree.walk(workdir)) as entries:
        for folder, name, info in itertools.islice(entries, MAX_SCANNED_ENTRIES):
            if folder is None or stat.S_ISDIR(info.st_mode):
                continue  # a folder, or too deep for a reply to name
            relpath = folder + name
            if not relpath.startswith(BASH_STATE_FILE):
                found[relpath] = (info.st_mtime_ns, info.st_size)
    return found


def changed_files(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """Created, modified or deleted paths, as reply_name gives them, sorted."""
    return sorted({reply_name(path) for path in before.keys() | after.keys() if before.get(path) != after.get(path)})


def reply_name(path: str) -> str:
    """A path from the file system as valid UTF-8, for a reply: bytes that are not UTF-8 written out as \\xNN.

    Python hands a name that is not UTF-8 over with its bad bytes as lone
    surrogates (surrogateescape); the daemon could not put those in a
    protobuf string, and a cell that made `b"bad\\xff"` failed with UNKNOWN.
    """
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def pause_uid(uid: int) -> bool:
    """SIGSTOP every process of `uid`; False if some could not be (no pid left to fork kill(-1)'s helper with).

    The agent may signal any process (it is root, the sessions are not). A
    process forking while it is stopped gets its child out, unstopped (a
    stop is no fatal signal: the kernel does not abort that fork), so the
    uid is listed again until a listing finds no process not yet stopped;
    one that has a stop pending forks no more. The stop itself may land
    later (a process off the CPU under the sandbox's quota takes it when it
    next runs): it runs no more code of its own either way.
    """
    stopped: set[int] = set()
    for _ in range(PAUSE_ROUNDS):
        new = set(usage.processes_of({uid}).get(uid, [])) - stopped
        if not new:
            return True
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    try:
        _as_uid(uid, lambda: os.kill(-1, signal.SIGSTOP))  # every process of uid but the helper itself, at once
    except BlockingIOError:
        return False
    return True


def resume_uid(uid: int) -> None:
    """SIGCONT every process of `uid` (stopped by pause_uid: none of them can fork meanwhile)."""
    for pid in usage.processes_of({uid}).get(uid, []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def files_held(uid: int, workdir: str, shared_folders: Iterable[str], pids: Iterable[int],
               most_entries: int) -> tuple[int, int]:
    """(bytes, entries) that `uid`'s files take of the sandbox's tmpfs mounts, counted up to `most_entries + 1`.

    Its work dir; what it made in the folders every uid may write to
    (/dev/shm); and the files its processes `pids` hold open that are
    deleted, which keep their space and inode until closed (on those mounts:
    a memfd is memory, held to the session's memory limit; seen only in a
    process that is dumpable: a file system uid of the session's reads its
    /proc/<pid>/fd, as for usage.memory_of_run). A file's bytes count once
    whatever its links; each link is an entry, as tmpfs counts them. In a
    thread: a session can make as many entries as the tmpfs holds.
    """
    held_bytes = entries = 0
    seen: set[tuple[int, int]] = set()

    def count(info: os.stat_result) -> None:
        nonlocal held_bytes, entries
        entries += 1
        if (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            held_bytes += info.st_blocks * 512

    tops: list[str] = [workdir]
    devices = set()
    for folder in [workdir, *shared_folders]:
        with contextlib.suppress(OSError):
            devices.add(os.stat(folder).st_dev)
    for folder in shared_folders:
        with contextlib.suppress(OSError), os.scandir(folder) as listing:
            for entry in listing:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        tops.append(entry.path)
    for top in tops:
        try:
            count(os.lstat(top))
        except OSError:
            continue
        with contextlib.closing(tree.walk(top)) as below:
            for _, _, info in below:
                count(info)
                if entries > most_entries:
                    return held_bytes, entries
    with _file_system_ids(uid):
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    info = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if info.st_nlink == 0 and stat.S_ISREG(info.st_mode) and info.st_dev in devices:
                    count(info)
                    if entries > most_entries:
                        return held_bytes, entries
    return held_bytes, entries


class Session:
    """One session's uid and folder; subclasses run its cells."""

    language = ""

    def __init__(self, controller: JobHost, uid: int, workdir: str, limits: dict[str, Any]) -> None:
        self.controller = controller
        self.uid = uid
        self.workdir = workdir
        self.limits = limits
        self.alive = True
        self.cells_run = 0
        # Set when a cell left more than the session's share of /tmp: its files go before that cell's answer.
        self.over_files_share = False
        self._lock = asyncio.Lock()
        # Its share of the tmpfs (limits["tmpfs_share"], 1 / sessions.per_sandbox; 0: no share kept).
        fraction = float(limits.get("tmpfs_share") or 0.0)
        self.files_share_bytes = self.files_share_entries = 0
        if fraction > 0:
            with contextlib.suppress(OSError):
                fs = os.statvfs(os.path.dirname(workdir))
                self.files_share_bytes = int(fs.f_blocks * fs.f_frsize * fraction)
                self.files_share_entries = int(fs.f_files * fraction)

    async def start(self) -> None:
        """Make the session ready for its first cell."""

    async def run_cell(self, code: str, timeout: float, output_limit: int, *, final: bool = False) -> dict[str, Any]:
        """Run one cell; a `final` one in a fresh process once the session's are killed, and end the session."""
        if not self.alive:
            return {"status": "internal", "message": "the session is closed", "alive": False}
        if self._lock.locked():
            return {"status": "busy", "message": "a cell is already running in this session", "alive": True}
        async with self._lock:
            before = scan(self.workdir)
            started = time.monotonic()
            try:
                if final:
                    # Nothing the session started may run beside the check, or outlive it: a thread or process
                    # left behind could print a verdict, rewrite a file the check reads, or trace the check.
                    await kill_uid(self.uid, self.controller.reap)
                    result = await self._run_final_cell(code, timeout, output_limit)
                else:
                    result = await self._run_cell(code, timeout, output_limit)
            except SandboxFull as exc:
                # The others took the sandbox's memory, CPU or pids (runner.crowded_out, starved_out): a
                # stateless run would go to another sandbox, a cell cannot, so it is answered uncharged.
                result = {"status": "internal", "limit": "", "value": "", "stdout": "", "stderr": "",
                          "message": f"{exc}; " + ("the session was closed" if final else
                                                   "the cell was not charged and can be run again")}
            result["time_seconds"] = time.monotonic() - started
            self.cells_run += 1
            if final:
                self.close()
            if self.alive and not await self._between_cells():
                result["message"] = (f"{result.get('message') or ''}; " if result.get("message") else "") + \
                    "the session's processes could not be stopped until its next cell (no pid left to do it " \
                    "with); the session was closed"
            if self.alive:
                over = await self._over_files_share()
                if over:
                    self.over_files_share = True
                    self.close()
                    result.update(status="runtime_error", limit="file_size", message=over)
            result["alive"] = self.alive
            if self.alive:
                result["files_changed"] = changed_files(before, scan(self.workdir))
            return result

    async def _between_cells(self) -> bool:
        """Hold what the session leaves running to no CPU until its next cell (PythonSession); False if that failed
        and the session was closed."""
        return True

    async def _over_files_share(self) -> str:
        """Why the session's files hold more than its share of the tmpfs, or "" if they do not."""
        if not self.files_share_bytes and not self.files_share_entries:
            return ""
        pids = usage.processes_of({self.uid}).get(self.uid, [])
        held_bytes, entries = await off_loop(
            files_held, self.uid, self.workdir, self.controller.shared_writable, pids,
            self.files_share_entries or (1 << 62))
        if self.files_share_entries and entries > self.files_share_entries:
            held = f"more than {self.files_share_entries} entries (files, folders, links)"
        elif self.files_share_bytes and held_bytes > self.files_share_bytes:
            held = f"{held_bytes >> 20} MiB, more than {self.files_share_bytes >> 20} MiB"
        else:
            return ""
        return (f"the session's files held {held} of the sandbox's /tmp after the cell: each session's share is "
                f"1 / sessions.per_sandbox of it; the session was closed and its files removed")

    async def _run_cell(self, code: str, timeout: float, output_limit: int) -> dict[str, Any]:
        raise NotImplementedError

    async def _run_final_cell(self, code: str, timeout: float, output_limit: int) -> dict[str, Any]:
        """Run a final cell in a fresh process; the session's own processes are gone."""
        raise NotImplementedError

    def ended_between_cells(self) -> str:
        """Why the session can run no more cells though none of its cells failed, or "" while it can."""
        return ""

    def close(self) -> None:
        """Kill whatever runs under the session's uid and remove its files."""
        self.alive = False


class BashSession(Session):
    language = "bash"

    async def _run_cell(self, code: str, timeout: float, output_limit: int) -> dict[str, Any]:
        return await self._run_bash(["-c", BASH_WRAPPER, "sandboxd-session", f"{self.workdir}/{BASH_STATE_FILE}"],
                                    code, timeout, output_limit, self.controller.env(self.workdir))

    async def _run_final_cell(self, code: str, timeout: float, output_limit: int) -> dict[str, Any]:
        return await self._run_bash(["-c", BASH_FINAL], code, timeout, output_limit, final_env(self.controller,
                                                                                                self.workdir))

    async def _run_bash(self, args: list[str], code: str, timeout: float, output_limit: int,
                        env: dict[str, str]) -> dict[str, Any]:
        controller = self.controller
        limits = dict(self.limits, timeout=timeout)
        spec = RunSpec(
            mode="exec", uid=self.uid, cwd=self.workdir, timeout=timeout, output_limit=output_limit,
            argv=["bash", "--noprofile", "--norc", *args],
            stdin=code.encode(), rlimits=controller.rlimits(limits, address_space=True),
            env=env, memory_limit=int(limits.get("memory") or 0),
        )
        outcome = await controller.runner.run(spec)
        status, limit, message = classify(outcome, spec)
        return {"status": status, "limit": limit, "message": message, "value": "",
                "stdout": outcome.stdout.decode("utf-8", "replace"),
                "stderr": outcome.stderr.decode("utf-8", "replace")}


class PythonSession(Session):
    language = "python"

    def __init__(self, controller: JobHost, uid: int, workdir: str, limits: dict[str, Any]) -> None:
        super().__init__(controller, uid, workdir, limits)
        self.interpreter = ResidentWorker(controller.runner, RESULT_FRAME_BYTES)
        self._seq = 0
        self._watched: WatchedRun | None = None
        self._over_memory = False
        # The host's OOM kill count when the interpreter was last known alive: a SIGKILL with no OOM kill
        # since is the session's own (os.kill(os.getpid(), 9)), not a memory limit.
        self._oom_kills_alive: int | None = None

    async def start(self) -> None:
        controller = self.controller
        await self._start_interpreter("py_session", controller.env(self.workdir))
        # For the session's life, cells and what they leave running between them alike: its memory is held
        # to its limit, and its CPU counts as the other runs' for the runs beside it (runner.starved_out).
        memory_limit = int(self.limits.get("memory") or 0)
        self._watched = controller.runner.usage.watch(
            self.uid, memory_limit + controller.runner.warm_memory() if memory_limit else 0, bounded_alone=True,
            on_over=self._memory_exceeded)
        self._oom_kills_alive = usage.oom_kills()
        if not await self._between_cells():
            raise SandboxFull("no pid was left to stop the session's interpreter with until its first cell")

    async def _start_interpreter(self, mode: str, env: dict[str, str]) -> None:
        # The interpreter lives as long as the session: its CPU rlimit is the
        # session's lifetime, its address space the session's memory limit.
        rlimits = self.controller.rlimits(dict(self.limits, timeout=self.limits["lifetime"]), address_space=True)
        await self.interpreter.start(RunSpec(mode=mode, uid=self.uid, cwd=self.workdir, timeout=0,
                                             output_limit=0, rlimits=rlimits, env=env))

    async def _run_final_cell(self, code: str, timeout: float, output_limit: int) -> dict[str, Any]:
        # The session's interpreter was killed with the rest of its uid; the check gets one of its own, forked
        # from the zygote (repl.serve's `final`), answering on the same terms as a cell.
        self.interpreter.close()
        self.interpreter = ResidentWorker(self.controller.runner, RESULT_FRAME_BYTES)
        self._seq = 0
        await self._start_interpreter("py_final", final_env(self.controller, self.workdir))
        self._oom_kills_alive = usage.oom_kills()
        return await self._run_cell(code, timeout, output_limit)

    async def _between_cells(self) -> bool:
        if pause_uid(self.uid):
            if self._watched is not None:
                self._watched.paused = True
            return True
        self.close()
        return False

    @property
    def _lowered(self) -> bool:
        """Whether the memory watch killed it for lowering its OOM score (usage.WatchedRun.lowered)."""
        return self._watched is not None and self._watched.lowered

    def _memory_exceeded(self) -> None:
        self._over_memory = True
        sigkill_uid(self.uid)  # the interpreter with the rest: the cell in flight, if any, sees it exit

    async def _run_cell(self, code: str, timeout: float, output_limit: int) -> dict[str, Any]:
        interrupted_for = ""
        watch, watched = self.controller.runner.usage, self._watched
        mark = watch.mark(watched) if watched is not None else None
        share: CpuShare | None = None

        def interrupt(reason: str) -> None:
            nonlocal interrupted_for
            if not interrupted_for and self.interpreter.alive:
                interrupted_for = reason
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.interpreter.pid, signal.SIGINT)

        def on_timeout() -> None:
            nonlocal share
            if watched is not None:
                # What the cell got of the CPU up to its deadline, and the others meanwhile (runner.starved_out).
                watch.count_now(watched)
                share = watch.share_of(watched, since=mark)
            interrupt("wall_time")

        if watched is not None:
            watched.paused = False  # before they run again: nothing they do goes uncounted
        resume_uid(self.uid)  # stopped since the last cell (or the open): _between_cells
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        budget = OutputBudget(output_limit, lambda: interrupt("output"))
        stdout, stderr = PipeReader(out_r, budget), PipeReader(err_r, budget)
        self._seq += 1
        try:
            reply = await self.interpreter.request({"code": code, "seq": self._seq}, timeout=timeout,
                                                   fds=(out_w, err_w), on_timeout=on_timeout,
                                                   grace=SESSION_INTERRUPT_GRACE)
            if reply is not None:
                await asyncio.wait([stdout.eof, stderr.eof], timeout=CELL_DRAIN_SECONDS)
        finally:
            stdout.close()
            stderr.close()
        output = {"stdout": bytes(stdout.data).decode("utf-8", "replace"),
                  "stderr": bytes(stderr.data).decode("utf-8", "replace")}
        starved = starved_reason(share, timeout) if interrupted_for == "wall_time" else ""
        if reply is None:
            return dict(output, **self._died(interrupted_for, timeout, starved))
        if reply.get("seq") != self._seq:
            # The interpreter answers each cell once, under its seq. Another frame was written to the
            # results socket by a cell (which can forge its own result, but not this): every later cell
            # would get the answer of the one before, so the session cannot go on.
            self.close()
            return dict(output, status="runtime_error", limit="", value="",
                        message="a cell wrote to the session's results socket; the session was closed")
        self._oom_kills_alive = usage.oom_kills()
        status = str(reply.get("status", ""))
        # The interpreter cuts its values there; a forged result must not be longer (docs/sessions.md).
        value = str(reply.get("value", ""))[:MAX_VALUE_CHARS]
        message = str(reply.get("message", ""))[:2000]
        if starved:
            # Not the cell's doing, as for a bash cell (Session.run_cell); but this one ran until interrupted.
            return dict(output, status="internal", limit="", value="",
                        message=f"{starved}; the cell was interrupted at {timeout:g} s (what it did until then "
                                "stays) and not charged; the session lives on")
        if interrupted_for == "wall_time":
            return dict(output, status="timeout", limit="wall_time", value="",
                        message=f"cell interrupted after {timeout:g} s wall clock; the session lives on")
        if interrupted_for == "output":
            return dict(output, status="output_limit", limit="output", value="",
                        message=f"more than {output_limit} bytes of output; cell interrupted")
        if status == "ok":
            return dict(output, status="ok", limit="", value=value, message="")
        if status == "exited":
            clean = message in ("SystemExit(None)", "SystemExit(0)")
            return dict(output, status="ok" if clean else "runtime_error", limit="", value="", message=message)
        if status == "memory_limit":
            return dict(output, status="memory_limit", limit="memory", value="", message=message)
        if status == "interrupted":
            message = "KeyboardInterrupt"
        return dict(output, status="runtime_error", limit="", value="", message=message)

    def ended_between_cells(self) -> str:
        # A thread or process the session left running ended the interpreter (os._exit from a timer), or the
        # memory watch killed it: until a next cell, the daemon listed it alive and it held its slot.
        if self._lock.locked() or self.interpreter.alive:
            return ""  # a cell in flight answers for itself
        if self._over_memory and self._lowered:
            return f"its processes were {LOWERED_MESSAGE} between cells"
        if self._over_memory:
            return (f"its processes held more than its memory limit of {int(self.limits['memory']) >> 20} MiB "
                    "together between cells, and its interpreter was killed")
        return f"its interpreter {self.interpreter.describe_exit()[0]} between cells"

    def _died(self, interrupted_for: str, timeout: float, starved: str) -> dict[str, Any]:
        """The interpreter is gone or would not stop: the session ends here. `starved`: why the cell's deadline
        was the others' doing (starved_reason), or ""."""
        detail, killed = self.interpreter.describe_exit()
        self.close()
        if starved:
            # Kept off the CPU, it may have had none to take its KeyboardInterrupt in time either.
            return {"status": "internal", "limit": "", "value": "",
                    "message": f"{starved}; the cell did not stop within {SESSION_INTERRUPT_GRACE:g} s of its "
                               "interrupt and the session was closed, not charged"}
        if interrupted_for == "wall_time":
            return {"status": "timeout", "limit": "wall_time", "value": "",
                    "message": f"cell ignored the interrupt at {timeout:g} s; the session was closed"}
        if killed and not self._over_memory and self._oom_kills_alive is not None \
                and usage.oom_kills() == self._oom_kills_alive:
            killed = False  # no OOM kill on the host since it was last alive: it killed itself
        status, limit = ("memory_limit", "memory") if killed else ("runtime_error", "")
        if self._over_memory:
            detail = (f"was killed: the session's processes held more than its memory limit of "
                      f"{int(self.limits['memory']) >> 20} MiB together")
            if self._lowered:
                detail = f"was {LOWERED_MESSAGE}"
        return {"status": status, "limit": limit, "value": "",
                "message": f"the session's interpreter {detail}; the session was closed"}

    def close(self) -> None:
        super().close()
        if self._watched is not None:
            self.controller.runner.usage.unwatch(self._watched)
        self.interpreter.close()


def final_env(controller: JobHost, workdir: str) -> dict[str, str]:
    """A final cell's environment: a cell's, and a Python it starts reads no site-packages from the session's
    folder (its HOME) either."""
    return dict(controller.env(workdir), PYTHONNOUSERSITE="1")


SESSION_TYPES: dict[str, type[Session]] = {"python": PythonSession, "bash": BashSession}


async def open_session(controller: JobHost, language: str, files: list[tuple[str, bytes]],
                       limits: dict[str, Any]) -> Session:
    """A started session of `language` with `files` in its folder; the uid is released on failure."""
    kind = SESSION_TYPES.get(language)
    if kind is None:
        raise BadRequest(f"sessions speak {', '.join(SESSION_TYPES)}, not {language!r}")
    uid = controller.uids.take()
    try:
        workdir = await controller.make_workdir(uid)
        await controller.write_files(workdir, uid, files)
        session = kind(controller, uid, workdir, limits)
        await session.start()
    except BaseException:
        controller.release_later(uid)
        raise
    return session
