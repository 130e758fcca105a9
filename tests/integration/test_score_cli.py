"""`sandboxd score FILE.jsonl` end to end: the installed CLI, a real daemon, mixed math and code rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ROWS: list[dict[str, Any]] = [
    {"id": "m-right", "kind": "math", "completion": "so the answer is \\boxed{72}", "ground_truth": "72"},
    {"id": "m-wrong", "kind": "math", "completion": "\\boxed{71}", "ground_truth": "72", "failure_value": 0.0},
    # kind inferred from ground_truth; a number as ground truth
    {"id": "m-inferred", "completion": "half: \\boxed{\\frac{1}{2}}", "ground_truth": 0.5},
    {"id": "c-right", "kind": "code", "completion": ADD,
     "tests": {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}},
    {"id": "c-wrong", "kind": "code", "completion": ADD.replace("a + b", "a * b"),
     "tests": {"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]}, "reward_mode": "fraction"},
    # kind inferred from tests; MBPP shape
    {"id": "c-mbpp", "completion": "```python\ndef add(a, b):\n    return a + b\n```",
     "tests": {"test_list": ["assert add(1, 2) == 3"]}},
    {"id": "c-timeout", "kind": "code", "completion": "```python\nwhile True:\n    pass\n```",
     "tests": {"inputs": [""], "outputs": ["x\n"]}, "timeout": 1.0},
    {"id": "c-none", "kind": "code", "completion": "I would rather not write code.",
     "tests": {"inputs": [""], "outputs": [""]}},
]  # fmt: skip
EXPECTED = {  # id -> (status, reward)
    "m-right": ("OK", 1.0),
    "m-wrong": ("WRONG_ANSWER", 0.0),
    "m-inferred": ("OK", 1.0),
    "c-right": ("OK", 1.0),
    "c-wrong": ("WRONG_ANSWER", 0.5),
    "c-mbpp": ("OK", 1.0),
    "c-timeout": ("TIMEOUT", -1.0),
    "c-none": ("NO_ANSWER", -1.0),
}


def sandboxd(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sandboxd", *args], input=stdin, capture_output=True, text=True, timeout=300
    )


def write_rows(path: Path, rows: list[Any], blank_after: int | None = None) -> None:
    lines = [json.dumps(r) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "   ")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.docker
def test_score_file_end_to_end(daemon: DaemonProcess, tmp_path: Path) -> None:
    source, output = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    write_rows(source, ROWS, blank_after=3)  # a blank line is skipped
    done = sandboxd("score", str(source), "-o", str(output), "--address", daemon.address)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""

    scored = [json.loads(line) for line in output.read_text().splitlines()]
    assert [s["id"] for s in scored] == [r["id"] for r in ROWS], "input order"
    for row, line in zip(ROWS, scored, strict=True):
        assert {k: v for k, v in line.items() if k != "result"} == row, "every input key is kept as it was"
        result = line["result"]
        assert (result["status"], result["reward"]) == EXPECTED[row["id"]], (row["id"], result)
        assert result["is_infrastructure_failure"] is False and result["error"] is None
        assert result["client_attempts"] == 1 and result["timings"]["total_seconds"] > 0
        # The daemon's count of sandboxes tried: none for an answer it could decide without one.
        assert (result["attempts"] == 0) == (row["id"] == "c-none"), (row["id"], result["attempts"])
    by_id = {s["id"]: s["result"] for s in scored}
    assert by_id["c-right"]["details"]["tests_passed"] == by_id["c-right"]["details"]["tests_total"] == 2
    assert by_id["c-wrong"]["details"]["tests_passed"] == 1
    assert by_id["m-right"]["details"]["extracted_answer"] == "72"
    # Its CPU-time limit is its wall-clock one: either may end a busy loop first (as test_isolation accepts).
    assert by_id["c-timeout"]["limit_hit"] in ("WALL_TIME", "CPU_TIME")

    # Progress on stderr (tqdm: "8/8"), then the summary.
    assert f"{len(ROWS)}/{len(ROWS)}" in done.stderr, done.stderr
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith(f"scored {len(ROWS)} rows: mean reward "), summary
    mean = sum(r for _, r in EXPECTED.values()) / len(EXPECTED)
    assert f"mean reward {mean:.4f}" in summary and "OK 4" in summary and "infrastructure failures 0" in summary

    # Default output is stdout; --quiet drops the progress bar and the summary; stdin as '-'.
    quiet = sandboxd("score", "-", "--quiet", "--address", daemon.address, stdin=source.read_text())
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    again = [json.loads(line) for line in quiet.stdout.splitlines()]
    assert [(s["id"], s["result"]["status"], s["result"]["reward"]) for s in again] == [
        (s["id"], s["result"]["status"], s["result"]["reward"]) for s in scored
    ]


# -- bad input: reported with its line, before any RPC (no daemon needed) ---------


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"kind": "math", "completion": "1", "ground_truth": "1"}', "", "{not json"], "rows.jsonl:3: not JSON"),
        (['{"kind": "math", "completion": "1", "ground_truth": "1"}', '{"kind": "math", "completion": "1"}'],
         "rows.jsonl:2: row 1: a math row needs 'ground_truth'"),
        (['{"completion": "x"}'], "rows.jsonl:1: row 0: kind must be 'code' or 'math'"),
        (['["a list"]'], "rows.jsonl:1: row 0: expected an object"),
        (['{"kind": "code", "completion": "x", "tests": {"inputs": ["1"]}, "timeout": -1}'], "rows.jsonl:1: row 0:"),
    ],
)  # fmt: skip
def test_bad_rows_name_their_line(tmp_path: Path, lines: list[str], message: str) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(lines) + "\n")
    output = tmp_path / "out.jsonl"
    done = sandboxd("score", str(source), "-o", str(output), "--address", "unix:///nonexistent/sandboxd.sock")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert message in done.stderr and done.stderr.startswith("sandboxd: error: "), done.stderr
    assert not output.exists(), "nothing is written for a file that cannot be scored"


def test_missing_file_and_unwritable_output(tmp_path: Path) -> None:
    missing = sandboxd("score", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "No such file" in missing.stderr, missing.stderr
    source = tmp_path / "rows.jsonl"
    write_rows(source, ROWS[:1])
    unwritable = sandboxd("score", str(source), "-o", str(tmp_path / "no" / "dir" / "out.jsonl"),
                          "--address", "unix:///nonexistent/sandboxd.sock")  # fmt: skip
    assert unwritable.returncode == 2 and "cannot write" in unwritable.stderr, unwritable.stderr


def test_empty_file_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "empty.jsonl"
    source.write_text("\n\n")
    done = sandboxd("score", str(source), "--address", "unix:///nonexistent/sandboxd.sock")
    assert done.returncode == 0 and done.stdout == "" and "no rows to score" in done.stderr


def test_a_misspelt_option_is_named_before_any_work(tmp_path: Path) -> None:
    """A key that looks like an option but is not one took the default in silence
    (a typo'd ``timeout_seconds`` ran every job at 10 s); the caller's own keys are not reported."""
    source = tmp_path / "rows.jsonl"
    write_rows(source, [
        {"id": 1, "kind": "math", "completion": "\\boxed{1}", "ground_truth": "1", "timeout_seconds": 30},
        {"id": 2, "kind": "math", "completion": "\\boxed{1}", "ground_truth": "1", "timeout_seconds": 30,
         "language": "python"},
        {"id": 3, "completion": ADD, "tests": {"inputs": ["1 2\n"], "outputs": ["3\n"]}, "prompt": "add",
         "memory": 1 << 20},
    ])  # fmt: skip
    done = sandboxd("score", str(source), "--address", "unix:///nonexistent/sandboxd.sock")
    warnings = [line for line in done.stderr.splitlines() if line.startswith("sandboxd: warning: ")]
    assert warnings == [
        f"sandboxd: warning: {source}: 'timeout_seconds' is not a job option (did you mean 'timeout'?); "
        "ignored (2 rows, the first at line 1)",
        f"sandboxd: warning: {source}: 'language' is not an option of math rows; ignored (line 2)",
        f"sandboxd: warning: {source}: 'memory' is not a job option (did you mean 'memory_bytes'?); ignored (line 3)",
    ], done.stderr
    assert done.returncode == 1, "the rows are still scored: here no daemon answers"
