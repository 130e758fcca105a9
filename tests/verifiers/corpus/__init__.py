"""The Python code corpus: correct programs and attacks, each with its tests in a real dataset's shape.

Cases live in TOML files, one per category, under ``python/`` (correct programs: every one must score 1.0)
and ``attacks/`` (wrong programs that lie, reach for the judge or cheat the runner: none may score 1.0).
Each file sets ``category`` and holds ``[[case]]`` tables:

- ``name`` (unique in its file; a case's id is ``category/name``), ``shape``, ``solution`` (the program);
- ``shape = "humaneval"``: ``test`` defines ``check(candidate)``, ``entry_point`` names the candidate;
- ``shape = "mbpp"``: ``test_list`` (bare ``assert`` lines), optional ``test_imports`` and ``test_setup``
  (MBPP's ``test_setup_code``);
- ``shape = "function"``: ``fn_name`` (``"f"`` or LeetCode's ``"Solution.method"``) and ``cases``, a JSON
  array of ``[args, expected]`` pairs (or ``cases_py``, a Python expression that makes that list, for
  arguments too large to write out); ``format`` says how the job carries them: ``"explicit"`` (the API's
  ``fn_name`` + ``function``, the default), ``"apps"`` (verl/APPS ``inputs``/``outputs``, each output
  wrapped in a one-element list as APPS stores it) or ``"lcb"`` (LiveCodeBench's functional cases);
- ``shape = "pytest"``: ``test`` is a KodCode-style test file (``from solution import ...``).

An attack also says ``why`` (what it tries and why the program is wrong) and ``naive``: what the same files
do under plain pytest in one process (``"pass"`` where naive execution is fooled, ``"fail"`` where it is not),
which the validator checks (tests/verifiers/test_corpus.py).

:func:`job_tests` gives a case's tests as the API's ``CodeTests`` fields (what :func:`normalize_tests`
takes); :func:`pytest_files` gives the files that run the same tests under real pytest, the program as
``solution.py``, independently of sandboxd.
"""

from __future__ import annotations

import functools
import json
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent
SHAPES = ("humaneval", "mbpp", "function", "pytest")
FORMATS = ("explicit", "apps", "lcb")
# The order the reports list categories in.
CATEGORIES = ("numpy", "consumed", "write_back", "passed_in", "module", "large", "environment", "plain")


@dataclass(frozen=True)
class Case:
    """One program with its tests."""

    id: str
    category: str
    shape: str
    solution: str
    source: str  # the TOML file it came from, relative to ROOT
    test: str = ""
    entry_point: str = ""
    test_list: tuple[str, ...] = ()
    test_imports: tuple[str, ...] = ()
    test_setup: str = ""
    fn_name: str = ""
    format: str = "explicit"
    cases_text: str = ""
    cases_py: str = ""
    why: str = ""
    naive: str = ""
    timeout: float = 10.0
    extra: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def calls(self) -> list[tuple[list[Any], Any]]:
        """Function cases as (args, expected) pairs."""
        raw = eval(self.cases_py, {}) if self.cases_py else json.loads(self.cases_text)  # the corpus is ours
        return [(list(args), expected) for args, expected in raw]


_KEYS = {"name", "shape", "solution", "test", "entry_point", "test_list", "test_imports", "test_setup", "fn_name",
         "format",
         "cases", "cases_py", "why", "naive", "timeout"}


def _case(raw: dict[str, Any], category: str, source: str) -> Case:
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{source}: case {raw.get('name')!r} has unknown keys {sorted(unknown)}")
    shape = raw["shape"]
    if shape not in SHAPES:
        raise ValueError(f"{source}: case {raw['name']!r}: unknown shape {shape!r}")
    case = Case(
        id=f"{category}/{raw['name']}", category=category, shape=shape, solution=textwrap.dedent(raw["solution"]),
        source=source, test=textwrap.dedent(raw.get("test", "")), entry_point=raw.get("entry_point", ""),
        test_list=tuple(raw.get("test_list", ())), test_imports=tuple(raw.get("test_imports", ())),
        test_setup=textwrap.dedent(raw.get("test_setup", "")),
        fn_name=raw.get("fn_name", ""), format=raw.get("format", "explicit"), cases_text=raw.get("cases", ""),
        cases_py=raw.get("cases_py", ""), why=raw.get("why", ""), naive=raw.get("naive", ""),
        timeout=float(raw.get("timeout", 10.0)),
    )
    required = {"humaneval": ("test", "entry_point"), "mbpp": ("test_list",), "function": ("fn_name",),
                "pytest": ("test",)}[shape]
    missing = [key for key in required if not getattr(case, key)]
    if shape == "function" and not (case.cases_text or case.cases_py):
        missing.append("cases")
    if case.format not in FORMATS:
        raise ValueError(f"{source}: {case.id}: unknown format {case.format!r}")
    if missing:
        raise ValueError(f"{source}: {case.id}: shape {shape} needs {missing}")
    return case


@functools.cache
def load(kind: str = "python") -> tuple[Case, ...]:
    """Every case of ``kind`` (``"python"``: correct programs; ``"attacks"``), in file order."""
    cases: list[Case] = []
    for path in sorted((ROOT / kind).glob("*.toml")):
        data = tomllib.loads(path.read_text())
        category = data["category"]
        for raw in data["case"]:
            cases.append(_case(raw, category, str(path.relative_to(ROOT))))
    ids = [case.id for case in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate case ids: {duplicates}")
    return tuple(cases)


def job_tests(case: Case) -> dict[str, Any]:
    """The case's tests as ``CodeTests`` fields: a dataset row in ``dataset_json``, or explicit function cases."""
    if case.shape == "humaneval":
        return {"dataset_json": {"task_id": case.id, "prompt": "", "test": case.test, "entry_point": case.entry_point}}
    if case.shape == "mbpp":
        return {"dataset_json": {"task_id": case.id, "test_list": list(case.test_list),
                                 "test_imports": list(case.test_imports), "test_setup_code": case.test_setup}}
    if case.shape == "pytest":
        return {"dataset_json": {"question": case.id, "test": case.test}}
    if case.format == "apps":
        return {"dataset_json": {"fn_name": case.fn_name, "inputs": [args for args, _ in case.calls],
                                 "outputs": [[expected] for _, expected in case.calls]}}
    if case.format == "lcb":
        return {"dataset_json": [
            {"input": "\n".join(json.dumps(arg) for arg in args), "output": json.dumps(expected),
             "testtype": "functional", "metadata": {"func_name": case.fn_name}}
            for args, expected in case.calls]}
    return {"fn_name": case.fn_name,
            "function": [{"args_json": json.dumps(args), "expected_json": json.dumps(expected)}
                         for args, expected in case.calls]}


# The function shape under real pytest: the dataset graders' own check (LiveCodeBench's grade_call_based, APPS'
# testing_util): call, a tuple becomes a list, then plain ==; an APPS output also matches its one element.
_FUNCTION_TEST = '''\
import json
from pathlib import Path

import pytest

import solution

CASES = json.loads((Path(__file__).parent / "cases.json").read_text())
FN_NAME = {fn_name!r}
UNWRAP = {unwrap!r}


def _target():
    if "." in FN_NAME:
        cls, method = FN_NAME.split(".")
        return getattr(getattr(solution, cls)(), method)
    if hasattr(solution, FN_NAME):
        return getattr(solution, FN_NAME)
    return getattr(solution.Solution(), FN_NAME)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_case(index):
    args, expected = CASES[index]
    got = _target()(*args)
    if isinstance(got, tuple):
        got = list(got)
    assert got == expected or (UNWRAP and isinstance(expected, list) and len(expected) == 1
                               and got == expected[0])
'''


def pytest_files(case: Case) -> dict[str, str]:
    """File name -> text: the program as ``solution.py`` and its tests as a pytest file, as a dataset runs them."""
    files = {"solution.py": case.solution}
    if case.shape == "pytest":
        files["test_solution.py"] = case.test
    elif case.shape == "humaneval":
        # HumanEval's harness runs program, test and check(entry_point) in one namespace.
        files["test_solution.py"] = (f"from solution import *  # noqa\nimport solution\n\n{case.test}\n\n"
                                     f"def test_check():\n    check(solution.{case.entry_point})\n")
    elif case.shape == "mbpp":
        body = textwrap.indent("\n".join([case.test_setup, *case.test_list]), "    ")
        imports = "\n".join(case.test_imports)
        files["test_solution.py"] = f"from solution import *  # noqa\n{imports}\n\n\ndef test_asserts():\n{body}\n"
    else:
        # APPS stores each output wrapped in a list; the other formats store the value.
        unwrap = case.format == "apps"
        calls = [[args, [expected] if unwrap else expected] for args, expected in case.calls]
        files["cases.json"] = json.dumps(calls)
        files["test_solution.py"] = _FUNCTION_TEST.format(fn_name=case.fn_name, unwrap=unwrap)
    return files
