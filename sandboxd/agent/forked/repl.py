"""A Python session's interpreter: cells in, notebook-style results out.

This runs inside a session's worker process, under the session's uid, for
the session's whole life: the namespace it keeps is the state that persists
between cells. Each cell arrives over the worker's control channel with a
fresh stdout and stderr pipe; the result (the repr of the last expression,
or the error) goes back over a separate results socket.

Nothing here is trusted by the controller beyond what it cannot avoid: the
cell runs in this process, so it can write anything to the results socket.
That only misreports its own session's output; the deadline, the output cap
and the session's death are judged from outside.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import os
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

from sandboxd.agent.protocol import VALUE_PREVIEW_CHARS, send_frame


def run_cell(code: str, namespace: dict[str, Any], filename: str = "<cell>") -> dict[str, Any]:
    """Run one cell in `namespace`; returns {"status", "value", "message"}.

    Like a notebook: a cell whose last statement is an expression reports
    that expression's repr (None reports nothing) and binds it to ``_``.
    Errors print their traceback to stderr, from the cell's first frame on.
    Statuses: ok, runtime_error, memory_limit, interrupted (the controller's
    SIGINT at the deadline) and exited (SystemExit; the session lives on).
    """
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            del tree.body[-1]
        body = compile(tree, filename, "exec")
        tail = compile(last, filename, "eval") if last is not None else None
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        return _error(exc, skip_frames=False)
    try:
        exec(body, namespace)
        if tail is None:
            return {"status": "ok", "value": "", "message": ""}
        value = eval(tail, namespace)
        if value is None:
            return {"status": "ok", "value": "", "message": ""}
        namespace["_"] = value
        text = repr(value)
        if len(text) > VALUE_PREVIEW_CHARS:
            text = text[:VALUE_PREVIEW_CHARS] + f"... [{len(text) - VALUE_PREVIEW_CHARS} more characters]"
        return {"status": "ok", "value": text, "message": ""}
    except KeyboardInterrupt:
        return {"status": "interrupted", "value": "", "message": "interrupted"}
    except SystemExit as exc:
        return {"status": "exited", "value": "", "message": f"SystemExit({exc.code!r})"}
    except BaseException as exc:  # every error of a cell is its result
        return _error(exc, skip_frames=True)


def _error(exc: BaseException, *, skip_frames: bool) -> dict[str, Any]:
    # The cell's own frames only: ours (run_cell) would confuse the model.
    tb = exc.__traceback__.tb_next if skip_frames and exc.__traceback__ is not None else None
    with contextlib.suppress(BaseException):
        traceback.print_exception(type(exc), exc, tb)
    status = "memory_limit" if isinstance(exc, MemoryError) else "runtime_error"
    try:
        message = f"{type(exc).__name__}: {exc}"[:2000]
    except BaseException:  # a hostile __str__
        message = type(exc).__name__
    return {"status": status, "value": "", "message": message}


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _swap_stdio(out_fd: int, err_fd: int) -> None:
    _flush()
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    if out_fd > 2:
        os.close(out_fd)
    if err_fd > 2 and err_fd != out_fd:
        os.close(err_fd)


def end_if_forked(own_pid: int) -> None:
    """As python.harness.end_if_forked, which this module does not import: the sessions zygote stays lean."""
    if os.getpid() != own_pid:
        _flush()
        os._exit(0)


def serve(channel: socket.socket, results: socket.socket, receive: Any, *, final: bool = False) -> NoReturn:
    """The session loop: one cell per frame on `channel` until it closes.

    `receive(channel)` returns (cell, fds) with fds = [stdout, stderr]. SIGINT
    is blocked outside cells, so the controller's interrupt at a deadline can
    only land inside the cell it was meant for; one that arrives late is
    discarded before the next cell starts. `final`: a session's final check
    (sessions.py), which must not pick up the session's files as modules
    (`import json` finding a json.py there), nor hand its channels to what it
    runs (a program of the session's writing an answer on the results socket,
    which came over SCM_RIGHTS without close-on-exec, before the check's own).
    """
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    devnull = os.open(os.devnull, os.O_WRONLY)
    if final:
        channel.set_inheritable(False)
        results.set_inheritable(False)
    else:
        sys.path[0:0] = [os.getcwd()]
    own_pid = os.getpid()
    while True:
        try:
            cell, fds = receive(channel)
        except (EOFError, OSError):
            os._exit(0)
        _swap_stdio(fds[0], fds[1])
        while signal.sigtimedwait({signal.SIGINT}, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        try:
            result = run_cell(str(cell.get("code", "")), namespace, f"<cell {cell.get('seq', 0)}>")
        except KeyboardInterrupt:
            # Between run_cell's own handlers and here.
            result = {"status": "interrupted", "value": "", "message": "interrupted"}
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        # A child the cell forked (os.fork) ends with the cell: it shares this loop's channels, and its result
        # and its reads of the next cell interleaved with its parent's (the session's own answers garbled).
        end_if_forked(own_pid)
        # Hand the pipes back (end of file for the controller) before the
        # result, so the cell's output is complete when the result arrives.
        _swap_stdio(devnull, devnull)
        devnull = os.open(os.devnull, os.O_WRONLY)
        result["seq"] = cell.get("seq", 0)
        try:
            send_frame(results, result)
        except OSError:
            os._exit(0)
