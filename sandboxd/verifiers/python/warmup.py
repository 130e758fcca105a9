"""The harness's warm-up, in the zygote: the candidate's side of small jobs run before any worker is forked
(:func:`warm`), each against a judge in a child process.

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import builtins
import os
import socket
import sys
import traceback
from typing import Any

from .candidate import CANDIDATE_MODULE, _implicit_names, _serve
from .judge import run_tests
from .wire import MAX_FRAME_BYTES

# Small jobs of the shapes the datasets use, whose candidate side the zygote runs before it forks any worker: a
# HumanEval-style assert job (its prompt assembled with the completion) and a LeetCode-style function-call job.
_WARM_PROMPT = 'from typing import List\n\n\ndef shift(xs: List[int], k: int) -> List[int]:\n    """Add k."""\n'
_WARM_COMPLETION = _WARM_PROMPT + "    return [x + k for x in xs]\n"
_WARM_TEST = ("def check(candidate):\n    assert candidate([1, 2], 1) == [2, 3]\n    assert candidate([], 3) == []\n"
              "    assert abs(candidate([0.5], 1)[0] - 1.5) < 1e-6\n    assert candidate(['a'], 'b') == ['ab']\n"
              "    assert candidate([True], 1) == [2]\n")
_WARM_CASES = ({"args": [[1, 2], 1], "expected": [2, 3]}, {"args": [[], 3], "expected": []},
               {"args": [["a"], "b"], "expected": ["ab"]})
# Runs of each: CPython quickens a code object after its first few runs (PEP 659), and its inline caches then settle.
WARM_UP_RUNS = 10


def _warm_jobs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the candidate's arguments of :func:`_serve`, the judge's of :func:`run_tests`) of each warm-up job."""
    assembly = {"head": "", "prompt": _WARM_PROMPT, "prompt_head": _WARM_PROMPT.partition("def ")[0],
                "entry_point": "shift"}
    return [
        ({"code": _WARM_COMPLETION, "assembly": assembly},
         {"plan_kind": "assert", "program": _WARM_COMPLETION, "assembly": assembly, "assert_code": _WARM_TEST,
          "entry_point": "shift", "setup_code": _WARM_PROMPT}),
        ({"code": _WARM_COMPLETION, "assembly": None, "implicit_imports": True},
         {"plan_kind": "function", "fn_name": "shift", "cases": list(_WARM_CASES)}),
    ]


def warm(runs: int = WARM_UP_RUNS) -> int:
    """Run the candidate's side of the warm-up jobs ``runs`` times each in this process, each against a judge in a
    child process; the number of runs whose verdict passed.

    The zygote calls it (``--warm``) before it freezes its heap and forks
    workers. CPython 3.11 counts a code object's first runs in the code
    object and then rewrites its bytecode in place with inline caches: done
    in every candidate, those writes fall on pages each worker shares with
    the zygote, one copy-on-write fault each (on the host, a HumanEval
    candidate takes about 715 faults cold, 650 warmed). Done here, the
    workers inherit the quickened code. Leaves nothing of the jobs behind
    (builtins, stdio, ``sys.modules``); a run that fails ends the warm-up
    (reported on stderr, never raised: a zygote without it is only slower).
    """
    saved = (builtins.input, builtins.print, builtins.open, sys.stdin, sys.stdout, sys.stderr)
    passed, failure = 0, ""
    try:
        for _ in range(runs):
            for candidate, judge in _warm_jobs():
                if not _warm_run(candidate, judge):
                    raise RuntimeError(f"a warm-up job ({judge['plan_kind']}) did not pass")
                passed += 1
    except Exception:
        failure = traceback.format_exc()
    finally:
        builtins.input, builtins.print, builtins.open, sys.stdin, sys.stdout, sys.stderr = saved
        sys.modules.pop(CANDIDATE_MODULE, None)
        _implicit_names.clear()
    if failure:  # on the zygote's own stderr, now that the candidate's is gone
        sys.stderr.write(f"python harness warm-up stopped after {passed} runs:\n{failure}")
    return passed


def _warm_run(candidate: dict[str, Any], judge: dict[str, Any]) -> bool:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                ours.close()
                verdict = run_tests(channel=theirs, **judge)
                status = 0 if verdict["passed"] else 1
            finally:
                os._exit(status)
        theirs.close()
        try:
            _serve(channel=ours, max_frame_bytes=MAX_FRAME_BYTES, **candidate)
        finally:
            # Reaped here whatever the candidate's side did (its end closed, the judge ends): no zombie is left
            # for the zygote's own reaping to take for a worker's.
            ours.close()
            passed = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return passed
