"""Math-Verify's own parametrised test cases, read from its source distribution on PyPI.

The sdist of ``math-verify`` (pinned to the version the sandbox images install, images/python/requirements.txt)
carries its ``tests/`` folder. It is downloaded once into a cache (scripts/setup.sh does it too) and its
``@pytest.mark.parametrize`` tables are read with ``ast``: nothing of it is imported or run, and nothing is
copied into this repository. Each case keeps the options its test passes to Math-Verify (match types,
``float_rounding``, ``strict``, ``allow_set_relation_comp``), so that the caller can map those that have an
equivalent among ``verify``'s options.
"""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
#: Where the sdist is kept between runs (scripts/setup.sh fills it; SANDBOXD_MATH_VERIFY_SDIST_DIR overrides).
CACHE_DIR = Path(os.environ.get("SANDBOXD_MATH_VERIFY_SDIST_DIR", "/var/cache/sandboxd/math-verify-sdist"))
_PIN_RE = re.compile(r"^\s*math-verify(?:\[[^\]]*\])?\s*==\s*([\w.]+)", re.MULTILINE)
#: The options of Math-Verify's ``compare_strings`` helper, with its defaults.
DEFAULT_OPTIONS: dict[str, Any] = {
    "match_types": ("latex", "expr"), "precision": 6, "strict": True, "allow_set_relation_comp": False,
}


@dataclass(frozen=True)
class Case:
    """One parametrised case: the ground truth, the answer, Math-Verify's expected verdict and its options."""

    file: str
    test: str
    index: int
    gold: str
    pred: str
    expected: bool
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.file}::{self.test}[{self.index}]"

    @property
    def default_options(self) -> bool:
        return all(self.options.get(k, v) == v for k, v in DEFAULT_OPTIONS.items())


def pinned_version() -> str:
    """The math-verify version the sandbox images install."""
    text = (REPO / "images" / "python" / "requirements.txt").read_text()
    match = _PIN_RE.search(text)
    if match is None:
        raise LookupError("no math-verify==X pin in images/python/requirements.txt")
    return match.group(1)


def sdist_path(version: str | None = None, *, download: bool = True) -> Path | None:
    """The cached sdist of math-verify ``version`` (the images' pin), downloaded with pip if missing."""
    version = version or pinned_version()
    found = sorted(CACHE_DIR.glob(f"math_verify-{version}.tar.gz"))
    if found or not download:
        return found[0] if found else None
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         f"math-verify=={version}", "-d", str(CACHE_DIR)],
        check=True, capture_output=True, timeout=300,
    )
    found = sorted(CACHE_DIR.glob(f"math_verify-{version}.tar.gz"))
    return found[0] if found else None


def _value(node: ast.AST) -> Any:
    """The value of a literal in a parametrize table: constants, tuples and lists, string concatenation and
    f-strings of ``math`` functions of constants (``f"{math.sqrt(17):.15f}"``). Nothing is evaluated beyond that."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left) + _value(node.right)
    if isinstance(node, ast.JoinedStr):
        return "".join(_value(part) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        spec = _value(node.format_spec) if node.format_spec is not None else ""
        return format(_value(node.value), spec)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "math" and not node.keywords):
        return getattr(math, node.func.attr)(*(_value(a) for a in node.args))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
        return getattr(math, node.attr)
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _options(func: ast.FunctionDef, params: dict[str, Any]) -> dict[str, Any]:
    """The keyword options the test body passes to ``compare_strings``/``verify``, with parameters filled in."""
    options: dict[str, Any] = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("compare_strings", "verify")):
            continue
        for kw in node.keywords:
            if kw.arg is None:
                continue
            options[kw.arg] = params[kw.value.id] if isinstance(kw.value, ast.Name) else _value(kw.value)
    if "match_types" in options:
        options["match_types"] = tuple(options["match_types"])
    if "float_rounding" in options:  # verify(..., float_rounding=p) in a test that calls verify directly
        options["precision"] = options.pop("float_rounding")
    return options


def cases_from_source(name: str, source: str) -> list[Case]:
    """Every (gold, pred, expected) case of the parametrised tests in one test file."""
    cases = []
    for func in ast.parse(source).body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for dec in func.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr == "parametrize"):
                continue
            names_node, table = dec.args[0], dec.args[1]
            names = _value(names_node)
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
            if "gold" not in names or "pred" not in names:
                continue  # e.g. test_string_extraction: an extraction, no ground truth
            expected_name = next(n for n in ("expected", "result") if n in names)
            assert isinstance(table, (ast.List, ast.Tuple))
            for index, row in enumerate(table.elts):
                params = dict(zip(names, _value(row), strict=True))
                cases.append(Case(name, func.name, index, params["gold"], params["pred"], bool(params[expected_name]),
                                  _options(func, params)))
    return cases


def load_cases(version: str | None = None) -> list[Case]:
    """All parametrised gold/pred cases of math-verify ``version``'s tests (the images' pin by default)."""
    path = sdist_path(version)
    if path is None:
        raise FileNotFoundError("math-verify sdist not found after download")
    try:
        with tarfile.open(path) as tar:
            tar.getmembers()
    except (tarfile.TarError, EOFError, OSError):  # a download cut short: fetched again
        path.unlink()
        path = sdist_path(version)
        if path is None:
            raise FileNotFoundError("math-verify sdist not found after download") from None
    cases: list[Case] = []
    with tarfile.open(path) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            parts = member.name.split("/")
            if len(parts) == 3 and parts[1] == "tests" and parts[2].startswith("test_") and parts[2].endswith(".py"):
                handle = tar.extractfile(member)
                if handle is not None:
                    cases.extend(cases_from_source(parts[2], handle.read().decode()))
    return cases
