"""The Python corpus (tests/verifiers/corpus): correct programs pass, attacks never do.

Three checks per case:

- under real pytest, program and tests in one process (tests.verifiers.corpus.validate), each correct
  program passes and each attack does what its ``naive`` field says (fooled or not): the corpus is right
  independently of sandboxd;
- through sandboxd's two-process harness on this machine (tests.verifiers.corpus.host, the agent's path
  without Docker), each correct program passes and no attack does.

Each runner is one subprocess per group of cases (attacks: one per case), started once for the cases this
session selected; a case's test reads its verdict. A per-category table of the harness's verdicts is printed
(``pytest -s``).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandboxd.verifiers.code import normalize_tests
from tests.conftest import docker_available
from tests.verifiers.corpus import CATEGORIES, SHAPES, Case, job_tests, load

REPO = Path(__file__).resolve().parents[2]
CORRECT = {case.id: case for case in load("python")}
ATTACKS = {case.id: case for case in load("attacks")}
# Seconds for one runner subprocess: the whole correct corpus takes 35-40 s on 2 busy CPUs here.
RUNNER_TIMEOUT = 900


def test_the_corpus_is_large_and_spread_over_categories_and_shapes() -> None:
    assert len(CORRECT) >= 250
    spread = collections.Counter((case.category, case.shape) for case in CORRECT.values())
    for category in CATEGORIES:
        shapes = [shape for shape in SHAPES if spread[category, shape] >= 3]
        # JSON carries no callables nor an environment to patch: categories 4 and 7 have no function cases.
        assert len(shapes) >= 3, f"{category}: {dict((s, spread[category, s]) for s in SHAPES)}"
    assert {case.category for case in ATTACKS.values()} and all(case.why and case.naive in ("pass", "fail")
                                                                for case in ATTACKS.values())


@pytest.mark.parametrize("case", [*CORRECT.values(), *ATTACKS.values()], ids=lambda case: case.id)
def test_every_case_is_a_valid_job(case: Case) -> None:
    plan = normalize_tests(job_tests(case))
    assert plan.kind == ("function" if case.shape == "function" else "assert")


def _run(module: str, kind: str, ids: list[str], out: Path) -> dict[str, dict[str, Any]]:
    """The runner's line for each case it finished (a runner that died leaves the rest out: their tests fail)."""
    subprocess.run([sys.executable, "-m", module, kind, str(out), *ids], cwd=REPO, timeout=RUNNER_TIMEOUT,
                   env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    lines = out.read_text().splitlines() if out.exists() else []
    return {entry["id"]: entry for entry in map(json.loads, lines)}


def _selected(request: pytest.FixtureRequest, test: Callable[..., None], table: dict[str, Case]) -> list[str]:
    """Ids of the cases of ``test`` that this session runs (all of them, or those -k chose)."""
    ids = []
    for item in request.session.items:
        if getattr(item, "function", None) is test:
            case = item.callspec.params["case"]  # type: ignore[attr-defined]
            if case.id in table:
                ids.append(case.id)
    return ids


@pytest.fixture(scope="module")
def real_pytest(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("real-pytest")
    outcomes = {}
    for kind, test, table in (("python", test_correct_programs_pass_under_real_pytest, CORRECT),
                              ("attacks", test_attacks_do_under_real_pytest_what_they_say, ATTACKS)):
        ids = _selected(request, test, table)
        if ids:
            outcomes.update(_run("tests.verifiers.corpus.validate", kind, ids, folder / f"{kind}.jsonl"))
    return outcomes


def _table(verdicts: dict[str, dict[str, Any]], cases: dict[str, Case]) -> str:
    counts: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for case_id, verdict in verdicts.items():
        case = cases[case_id]
        for key in ((case.category, case.shape), (case.category, "all"), ("all", case.shape), ("all", "all")):
            counts[key][0] += bool(verdict["passed"])
            counts[key][1] += 1
    columns = (*SHAPES, "all")
    lines = ["passed/cases".ljust(14) + "".join(column.rjust(11) for column in columns)]
    for category in (*sorted({case.category for case in cases.values()}, key=_category_order), "all"):
        cells = [f"{counts[category, c][0]}/{counts[category, c][1]}" if counts[category, c][1] else "-"
                 for c in columns]
        lines.append(category.ljust(14) + "".join(cell.rjust(11) for cell in cells))
    return "\n".join(lines)


def _category_order(category: str) -> int:
    return CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES)


@pytest.fixture(scope="module")
def host_harness(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if docker_available() and not os.environ.get("SANDBOXD_CORPUS_ON_HOST"):
        # tests/integration/test_corpus.py sends every case through a real daemon, the agent's own path: the same
        # verdicts at 75 s less of the suite's time. Without an engine (or with SANDBOXD_CORPUS_ON_HOST), here.
        pytest.skip("judged through the daemon in tests/integration/test_corpus.py")
    folder = tmp_path_factory.mktemp("host-harness")
    verdicts: dict[str, dict[str, Any]] = {}
    correct = _selected(request, test_correct_programs_pass_through_the_harness, CORRECT)
    if correct:
        verdicts.update(_run("tests.verifiers.corpus.host", "python", correct, folder / "python.jsonl"))
        print(f"\nThe harness on the correct corpus:\n{_table(verdicts, CORRECT)}")
    # One judge process per attack: an attack that broke its judge must not decide the next one's verdict.
    for number, case_id in enumerate(_selected(request, test_no_attack_passes_through_the_harness, ATTACKS)):
        verdicts.update(_run("tests.verifiers.corpus.host", "attacks", [case_id], folder / f"attack-{number}.jsonl"))
    return verdicts


@pytest.mark.timeout(RUNNER_TIMEOUT + 60)
@pytest.mark.parametrize("case", CORRECT.values(), ids=lambda case: case.id)
def test_correct_programs_pass_under_real_pytest(case: Case, real_pytest: dict[str, Any]) -> None:
    outcome = real_pytest.get(case.id, {"exit": None, "passed": 0, "failed": 0})
    if not (outcome["exit"] == 0 and outcome["passed"] >= 1 and not outcome["failed"]):
        pytest.fail(f"{case.id} ({case.source}) fails under real pytest: {outcome}", pytrace=False)


@pytest.mark.timeout(RUNNER_TIMEOUT + 60)
@pytest.mark.parametrize("case", ATTACKS.values(), ids=lambda case: case.id)
def test_attacks_do_under_real_pytest_what_they_say(case: Case, real_pytest: dict[str, Any]) -> None:
    """``naive = "pass"``: plain pytest in one process is fooled (exit status 0), which is why it is an attack."""
    outcome = real_pytest.get(case.id, {"exit": None})
    if (outcome["exit"] == 0) is not (case.naive == "pass"):
        pytest.fail(f"{case.id} ({case.source}) says naive = {case.naive!r}; real pytest: {outcome}", pytrace=False)


@pytest.mark.timeout(RUNNER_TIMEOUT + 60)
@pytest.mark.parametrize("case", CORRECT.values(), ids=lambda case: case.id)
def test_correct_programs_pass_through_the_harness(case: Case, host_harness: dict[str, Any]) -> None:
    verdict = host_harness.get(case.id)
    if verdict is None or not verdict["passed"]:
        pytest.fail(f"{case.id} ({case.source}) does not pass through the harness: {verdict}", pytrace=False)


@pytest.mark.timeout(len(ATTACKS) * 30 + 60)
@pytest.mark.parametrize("case", ATTACKS.values(), ids=lambda case: case.id)
def test_no_attack_passes_through_the_harness(case: Case, host_harness: dict[str, Any]) -> None:
    verdict = host_harness.get(case.id)
    if verdict is None or verdict["status"] == "judge_error":
        pytest.fail(f"{case.id}: the attack broke the judge: {verdict}", pytrace=False)
    if verdict["passed"]:
        pytest.fail(f"{case.id} passed through the harness ({case.why}): {verdict}", pytrace=False)
