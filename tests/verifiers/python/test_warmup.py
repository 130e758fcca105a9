"""Tests of the zygote's warm-up (sandboxd.verifiers.python.warmup)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

# ---- the warm-up, in the zygote: the candidate's side of small jobs run before any worker is forked ----

# Each script runs in a fresh interpreter: warm() forks judges, and what it must leave behind is a process's state.
WARM_AND_CHECK = """
import builtins, json, sys
from sandboxd.verifiers.python import candidate, harness
before = (builtins.input, builtins.print, builtins.open, sys.stdin, sys.stdout, sys.stderr)
passed = harness.warm(3)
after = (builtins.input, builtins.print, builtins.open, sys.stdin, sys.stdout, sys.stderr)
print(json.dumps({"passed": passed, "restored": before == after, "module": harness.CANDIDATE_MODULE in sys.modules,
                  "implicit": len(candidate._implicit_names)}))
"""

# The minor page faults of candidates forked after (or without) the warm-up, as a zygote forks them.
FAULTS_OF_FORKED_CANDIDATES = """
import gc, json, os, socket, sys
from sandboxd.verifiers.python import harness, warmup
if sys.argv[1] == "warm":
    harness.warm()
gc.collect()
gc.freeze()
faults = []
for _ in range(6):
    for candidate, judge in warmup._warm_jobs():
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            harness.serve_candidate(channel=theirs, **candidate)
        theirs.close()
        assert harness.run_tests(channel=ours, **judge)["passed"]
        ours.close()
        faults.append(os.wait4(pid, 0)[2].ru_minflt)
print(json.dumps(sorted(faults)[len(faults) // 2]))
"""


def _run_fresh(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_warm_up_jobs_pass_and_leave_nothing_of_theirs_behind() -> None:
    report = json.loads(_run_fresh(WARM_AND_CHECK))
    assert report == {"passed": 3 * 2, "restored": True, "module": False, "implicit": 0}


def test_a_candidate_forked_after_the_warm_up_copies_fewer_pages() -> None:
    # Page faults, not time: what the warm-up saves is the copy of each code object's page that quickening wrote,
    # which does not depend on the machine's load (about 60 of 715 for a HumanEval candidate on the host).
    cold = json.loads(_run_fresh(FAULTS_OF_FORKED_CANDIDATES, "cold"))
    warm = json.loads(_run_fresh(FAULTS_OF_FORKED_CANDIDATES, "warm"))
    assert warm < cold - 20, (cold, warm)


def test_a_warm_up_job_that_fails_ends_the_warm_up_without_raising(capfd: pytest.CaptureFixture[str]) -> None:
    script = ("from sandboxd.verifiers.python import harness, warmup\n"
              "jobs = warmup._warm_jobs\n"
              "def failing():\n"
              "    (candidate, judge), rest = jobs()[0], jobs()[1:]\n"
              "    return [({**candidate, 'code': 'def shift(xs, k):\\n    return xs\\n'}, judge), *rest]\n"
              "warmup._warm_jobs = failing\n"
              "print(harness.warm(2))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert "a warm-up job (assert) did not pass" in done.stderr
