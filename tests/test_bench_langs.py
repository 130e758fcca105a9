"""The `langs` benchmark's baseline judge (bench/langs.py) judges: it passes a right program and fails a wrong one."""

from __future__ import annotations

import json
import subprocess
import sys

from bench import langs


def _judge(source: str) -> dict[str, object]:
    job = json.loads(langs._baseline_job("python", langs.make_cases()))
    job["source"] = source
    job["run"] = [sys.executable, "-B", "main.py"]  # the host's interpreter, not the image's python3
    done = subprocess.run([sys.executable, "-c", langs.DRIVER], input=json.dumps(job).encode(),
                          capture_output=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_cases_are_fixed_and_grow_to_ten_thousand_lines() -> None:
    cases = langs.make_cases()
    assert cases == langs.make_cases()
    assert [int(stdin.split("\n", 1)[0]) for stdin, _ in cases] == [1, 3, 10, 1000, 10_000]
    assert all(len(out.splitlines()) == int(stdin.split("\n", 1)[0]) for stdin, out in cases)


def test_the_driver_passes_the_python_solution_on_every_case() -> None:
    assert _judge(langs.SOLUTIONS["python"]) == {"compile_seconds": 0.0, "passed": 5}


def test_the_driver_fails_a_wrong_solution() -> None:
    wrong = langs.SOLUTIONS["python"].replace("+ int(words[2 + 2 * i])", "- int(words[2 + 2 * i])")
    assert wrong != langs.SOLUTIONS["python"]
    assert _judge(wrong)["passed"] == 0


def test_every_language_the_daemon_runs_has_a_solution() -> None:
    from sandboxd.verifiers.code import LANGUAGES

    assert set(langs.SOLUTIONS) == set(LANGUAGES)
