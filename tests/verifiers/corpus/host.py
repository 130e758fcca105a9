"""Run corpus cases through sandboxd's own two-process harness on this machine, without Docker.

``python -m tests.verifiers.corpus.host KIND OUT [ID...]`` is one judge process, as the agent's resident judge
is: for each case it makes the plan as the daemon does (:func:`~sandboxd.verifiers.code.normalize_tests`,
:func:`~sandboxd.verifiers.code.assemble_program`, :func:`sandboxd.jobs.harness_arguments`), starts a fresh
candidate process (:func:`~sandboxd.verifiers.python.harness.serve_candidate`, in a work dir of its own) and runs
:func:`~sandboxd.verifiers.python.harness.run_tests` here, as the controller asks its judge. One JSON line per case
goes to OUT: ``{"id", "passed", "status", "message", "passed_count", "total"}`` (``"status": "judge_error"``
when the judge itself raised). No uids, seccomp or limits: this checks what the harness decides, not the
sandbox.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from sandboxd.agent.messages import JudgeArguments
from sandboxd.jobs import harness_arguments
from sandboxd.verifiers.code import assemble_program, normalize_tests
from sandboxd.verifiers.python.harness import run_tests
from tests.verifiers.corpus import Case, job_tests, load

REPO = Path(__file__).resolve().parents[3]
CANDIDATE_MAIN = (
    "import socket, sys; from sandboxd.verifiers.python.harness import serve_candidate; "
    "serve_candidate(open(sys.argv[1]).read(), socket.socket(fileno=int(sys.argv[2])), "
    "implicit_imports=sys.argv[3] == '1')"
)
# The agent's default tolerance for function tests.
TOLERANCE = 1e-6


def judge(case: Case, workdir: Path) -> dict[str, Any]:
    """The harness's verdict on ``case``, its candidate run in ``workdir``."""
    plan = normalize_tests(job_tests(case))
    program = assemble_program(case.solution, plan)
    # Typed as the judge's arguments (agent/forked/judgeserver.py), checked against run_tests's; no folder is shared.
    harness: JudgeArguments = {**harness_arguments(plan, TOLERANCE, False), "call_timeout": case.timeout, "files": ""}
    if plan.kind == "assert":
        harness["program"] = program
    source = workdir.parent / f"{workdir.name}.py"
    source.write_text(program)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env_path = str(REPO)
    with open(workdir.parent / f"{workdir.name}.out", "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", CANDIDATE_MAIN, str(source), str(child.fileno()),
             "1" if plan.kind == "function" else "0"],
            pass_fds=[child.fileno()], stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "HOME": str(workdir)})
    child.close()
    try:
        return run_tests(plan.kind, parent, **harness)
    finally:
        parent.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a candidate stuck in a loop does not see end of file
            process.kill()
            process.wait()


def run(cases: list[Case], out: Path) -> None:
    """Judge ``cases`` one after another in this process, one JSON line each to ``out``."""
    with tempfile.TemporaryDirectory(prefix="corpus-host-") as root, out.open("w") as sink:
        for number, case in enumerate(cases):
            workdir = Path(root, f"case-{number}")
            workdir.mkdir()
            try:
                verdict = judge(case, workdir)
                entry = {"id": case.id, "passed": bool(verdict["passed"]), "status": verdict["status"],
                         "message": str(verdict["message"])[:500], "passed_count": verdict["passed_count"],
                         "total": verdict["total"]}
            except Exception:  # the judge's own failure is a verdict of its own here
                entry = {"id": case.id, "passed": False, "status": "judge_error",
                         "message": traceback.format_exc()[-500:], "passed_count": 0, "total": 0}
            sink.write(json.dumps(entry) + "\n")
            sink.flush()


def main() -> None:
    kind, out, *ids = sys.argv[1:]
    cases = [case for case in load(kind) if not ids or case.id in ids]
    run(cases, Path(out))


if __name__ == "__main__":
    main()
