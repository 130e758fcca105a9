"""The Python corpus (tests/verifiers/corpus) end to end: every case a job through the real daemon.

All correct programs go in one batch (``SandboxClient.score_batch``) and must score 1.0; all attacks in
another, and none may score 1.0 or come back with an infrastructure status (a trainer might skip those).
Each prints a per-category table of passes (``pytest -s``). tests/verifiers/test_corpus.py checks the same
cases against real pytest and through the harness on the host.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sandboxd_client import SandboxClient, code_job
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from tests.conftest import DaemonProcess
from tests.verifiers.corpus import CATEGORIES, SHAPES, Case, job_tests, load

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code.rstrip()}\n```\n"


def _code_tests(case: Case) -> pb.CodeTests:
    fields: dict[str, Any] = job_tests(case)
    if "dataset_json" in fields:
        return pb.CodeTests(dataset_json=json.dumps(fields["dataset_json"]))
    return pb.CodeTests(fn_name=fields["fn_name"], function=[
        pb.FunctionCase(args_json=call["args_json"], expected_json=call["expected_json"])
        for call in fields["function"]])


def _jobs(cases: tuple[Case, ...]) -> list[pb.Job]:
    jobs = []
    for index, case in enumerate(cases):
        job = code_job(_fenced(case.solution), _code_tests(case), timeout=case.timeout)
        job.index = index
        jobs.append(job)
    return jobs


def _table(cases: tuple[Case, ...], passed: list[bool]) -> str:
    counts: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for case, ok in zip(cases, passed, strict=True):
        for key in ((case.category, case.shape), (case.category, "all"), ("all", case.shape), ("all", "all")):
            counts[key][0] += ok
            counts[key][1] += 1
    columns = (*SHAPES, "all")
    categories = sorted({case.category for case in cases},
                        key=lambda c: CATEGORIES.index(c) if c in CATEGORIES else len(CATEGORIES))
    lines = ["scored 1.0".ljust(14) + "".join(column.rjust(11) for column in columns)]
    for category in (*categories, "all"):
        cells = [f"{counts[category, c][0]}/{counts[category, c][1]}" if counts[category, c][1] else "-"
                 for c in columns]
        lines.append(category.ljust(14) + "".join(cell.rjust(11) for cell in cells))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[SandboxClient]:
    with SandboxClient(daemon.address, deadline_margin=600) as client:
        yield client


def test_every_correct_program_scores_one(client: SandboxClient) -> None:
    cases = load("python")
    results = client.score_batch(_jobs(cases))
    passed = [result.reward == 1.0 for result in results]
    print(f"\nThe correct corpus through the daemon:\n{_table(cases, passed)}")
    failures = [f"{case.id}: {result.status.name} {result.message[:300]}"
                for case, result in zip(cases, results, strict=True) if result.reward != 1.0]
    assert not failures, f"{len(failures)} of {len(cases)} correct programs did not score 1.0:\n" + "\n".join(failures)


def test_no_attack_scores_one(client: SandboxClient) -> None:
    cases = load("attacks")
    results = client.score_batch(_jobs(cases))
    print(f"\nThe attacks through the daemon:\n{_table(cases, [r.reward == 1.0 for r in results])}")
    broken = [f"{case.id} ({case.why}): {result.status.name} reward {result.reward} {result.message[:300]}"
              for case, result in zip(cases, results, strict=True)
              if result.reward == 1.0 or result.ok or result.is_infrastructure_failure]
    assert not broken, "attacks that passed or broke the sandbox:\n" + "\n".join(broken)
