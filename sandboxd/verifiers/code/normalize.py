"""The API's ``CodeTests`` and the dataset rows given verbatim, read into one :class:`TestPlan`
(:func:`normalize_tests`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from .plans import _PARSE_ERRORS, FunctionCase, StdioCase, TestPlan


def _get(tests: Mapping[str, Any], key: str) -> Any:
    """A CodeTests field by its proto name or its JSON (camelCase) name."""
    if key in tests:
        return tests[key]
    head, *rest = key.split("_")
    return tests.get(head + "".join(word.title() for word in rest))


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def _stdio_text(value: Any, what: str) -> str:
    # APPS sometimes stores a case as a list of lines; its harness joins them.
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise ValueError(f"{what} must be a string or a list of strings, got {type(value).__name__}")


def _check_assert_code(code: str, entry_point: str, what: str) -> None:
    if not code.strip():
        raise ValueError(f"{what} is empty")
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(f"{what} does not parse: {exc.msg} (line {exc.lineno})") from None
    except _PARSE_ERRORS as exc:  # NUL bytes, nesting deeper than the parser can take
        raise ValueError(f"{what} does not parse: {type(exc).__name__} {exc}".rstrip()[:500]) from None
    defines_check = any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in tree.body)
    if defines_check and not entry_point:
        raise ValueError(f"{what} defines check(candidate) but no entry_point names the candidate")


def _identifier_path(name: str, what: str) -> str:
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(part.isidentifier() for part in parts):
        raise ValueError(f"{what} must be a function name or 'Class.method', got {name!r}")
    return name


def _explicit_plan(tests: Mapping[str, Any], fn_name: str, entry_point: str) -> TestPlan:
    stdio = _get(tests, "stdio") or []
    function = _get(tests, "function") or []
    assert_code = _get(tests, "assert_code") or ""
    given = [
        name
        for name, value in (("stdio", stdio), ("function", function), ("assert_code", assert_code))
        if value
    ]
    if len(given) > 1:
        raise ValueError(f"tests give both {given[0]} and {given[1]}; a job has one kind of test")
    if stdio:
        cases = []
        for i, case in enumerate(stdio):
            if not isinstance(case, Mapping):
                raise ValueError(f"stdio[{i}] must be an object with stdin and expected_stdout")
            cases.append(
                StdioCase(
                    _stdio_text(_get(case, "stdin") or "", f"stdio[{i}].stdin"),
                    _stdio_text(_get(case, "expected_stdout") or "", f"stdio[{i}].expected_stdout"),
                )
            )
        return TestPlan("stdio", stdio=tuple(cases))
    if function:
        if not fn_name:
            raise ValueError("function tests need fn_name")
        calls = []
        for i, case in enumerate(function):
            if not isinstance(case, Mapping):
                raise ValueError(f"function[{i}] must be an object with args_json and expected_json")
            args = _load_json(_get(case, "args_json") or "[]", f"function[{i}].args_json")
            if not isinstance(args, list):
                raise ValueError(f"function[{i}].args_json must be a JSON array of positional arguments")
            expected_json = _get(case, "expected_json") or ""
            if not expected_json.strip():
                raise ValueError(f"function[{i}].expected_json is empty (use 'null' for None)")
            calls.append(FunctionCase(tuple(args), _load_json(expected_json, f"function[{i}].expected_json")))
        return TestPlan("function", fn_name=_identifier_path(fn_name, "fn_name"), function=tuple(calls))
    if assert_code:
        _check_assert_code(assert_code, entry_point, "assert_code")
        return TestPlan("assert", assert_code=assert_code, entry_point=entry_point)
    raise ValueError("no tests: give stdio, function (with fn_name), assert_code or dataset_json")


def _io_plan(data: Mapping[str, Any], fn_name: str) -> TestPlan:
    """verl / APPS / TACO ``{"inputs", "outputs", "fn_name"?}``."""
    inputs, outputs = data.get("inputs"), data.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("dataset_json: 'inputs' and 'outputs' must both be lists")
    if len(inputs) != len(outputs):
        raise ValueError(f"dataset_json: {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise ValueError("dataset_json: no test cases in 'inputs'")
    name = fn_name or data.get("fn_name") or ""
    if not isinstance(name, str):
        raise ValueError("dataset_json: 'fn_name' must be a string")
    if name:
        cases = []
        for i, (args, expected) in enumerate(zip(inputs, outputs, strict=True)):
            if isinstance(args, str):
                case = _prime_code_case(args, expected, i)
            elif isinstance(args, list):
                case = FunctionCase(tuple(args), expected, unwrap_single=True)
            else:
                raise ValueError(
                    f"dataset_json: inputs[{i}] must be a list of arguments, or their JSON one per line, "
                    "when fn_name is set"
                )
            cases.append(dataclasses.replace(case, int_keys=_int_like_keys(case.args)))
        return TestPlan("function", fn_name=_identifier_path(name, "fn_name"), function=tuple(cases))
    return TestPlan(
        "stdio",
        stdio=tuple(
            StdioCase(
                _stdio_text(i, f"dataset_json: inputs[{n}]"), _stdio_text(o, f"dataset_json: outputs[{n}]")
            )
            for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
        ),
    )


def _int_like_keys(args: tuple[Any, ...]) -> bool:
    """Whether APPS's harness calls with the first argument's keys as ints: a non-empty dict whose keys all
    read as integers to ``int()`` (``"1"``, ``" -2"``, ``"1_000"``; not ``"1.5"``, nor past 4,300 digits).

    As ``run_test`` in APPS's ``testing_util.py`` and its copies (TACO's, verl 0.9.1's
    ``prime_code/testing_util.py``): ``{int(k): v for k, v in inputs[0].items()}``, left as it was
    when one key does not convert. Those copies then call with that argument alone (``inputs``
    becomes a one-element list), so a call of more arguments whose first is such a dict fails
    there for every program; here it gets them all.
    """
    if not args or type(args[0]) is not dict or not args[0]:
        return False
    try:
        for key in args[0]:
            int(key)
    except (TypeError, ValueError):
        return False
    return True


def _prime_code_case(args_text: str, expected: Any, i: int) -> FunctionCase:
    """A call in verl's prime_code form: the arguments' JSON one per line, the return value's JSON.

    As verl's ``prime_code/testing_util.py`` (0.9.1) reads it: every line is one argument
    (``"1", newline, "2"`` calls ``f(1, 2)``; a blank line is skipped here, where verl fails on
    it), and the output is the return value's JSON. A 1-element list also accepts its element
    as the return value. A first argument that is a dict of integer-like keys is called with
    int keys, as there (see :func:`_int_like_keys`).
    """
    args = _lcb_args(args_text, f"dataset_json: inputs[{i}]")
    if not args:
        raise ValueError(f"dataset_json: inputs[{i}] holds no arguments (one JSON value per line)")
    if isinstance(expected, str):
        expected = _load_json(expected, f"dataset_json: outputs[{i}]")
    return FunctionCase(args, expected, unwrap_single=True)


def _code_contests_plan(data: Mapping[str, Any]) -> TestPlan:
    """CodeContests: every one of public, private and generated tests, in that order."""
    cases: list[StdioCase] = []
    for group in ("public_tests", "private_tests", "generated_tests"):
        tests = data.get(group)
        if tests is None:
            continue
        if not isinstance(tests, Mapping):
            raise ValueError(f"dataset_json: {group} must be an object with 'input' and 'output' lists")
        inputs, outputs = tests.get("input") or [], tests.get("output") or []
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError(f"dataset_json: {group}.input and {group}.output must be lists of equal length")
        for n, (i, o) in enumerate(zip(inputs, outputs, strict=True)):
            cases.append(
                StdioCase(
                    _stdio_text(i, f"dataset_json: {group}.input[{n}]"),
                    _stdio_text(o, f"dataset_json: {group}.output[{n}]"),
                )
            )
    if not cases:
        raise ValueError("dataset_json: no test cases in public_tests/private_tests/generated_tests")
    # WHITESPACE, not the tester's TOKENS_IGNORE_CASE: that one pays a program that echoes its input on a
    # problem that asks to change a word's case ("konjac" for "Konjac", Codeforces 281A), a hack a trainer's
    # policy finds. The RL graders of CodeContests rows (DeepCoder's, verl's prime_code, Open-R1's) ignore no
    # case either; the tester's leniency is there by name.
    return TestPlan("stdio", stdio=tuple(cases))


def _lcb_args(text: Any, what: str) -> tuple[Any, ...]:
    # LiveCodeBench functional input: one JSON value per line, one line per argument.
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string of JSON values, one per line")
    return tuple(_load_json(line, what) for line in text.splitlines() if line.strip())


def _case_list_plan(cases: list[Any], fn_name: str) -> TestPlan:
    """LiveCodeBench-style ``[{"input", "output", "testtype", "metadata"?}]``.

    DeepCoder keeps PrimeIntellect's cases as such a bare list, with ``type`` (``stdin_stdout``,
    ``function_call``) and ``fn_name`` instead: read as PrimeIntellect's. Its LiveCodeBench
    cases name the function in each case's ``metadata``.
    """
    if not cases:
        raise ValueError("dataset_json: empty list of test cases")
    if all(isinstance(case, Mapping) and "type" in case and "testtype" not in case for case in cases):
        return _prime_intellect_plan({"test_cases": cases}, fn_name)
    kinds = set()
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
            raise ValueError(f"dataset_json[{i}] must be an object with 'input' and 'output'")
        kinds.add(case.get("testtype") or "stdin")
        metadata = _maybe_json(case.get("metadata") or {}, f"dataset_json[{i}].metadata")
        if not fn_name and isinstance(metadata, Mapping) and isinstance(metadata.get("func_name"), str):
            fn_name = metadata["func_name"]
    if len(kinds) > 1:
        raise ValueError(f"dataset_json mixes test types {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "stdin":
        # LiveCodeBench's own grader, where the cases say they are its (testtype); a bare list of
        # {input, output} comes from other datasets too (DeepCoder's Codeforces rows).
        named = all(case.get("testtype") == "stdin" for case in cases)
        return TestPlan(
            "stdio",
            stdio=tuple(
                StdioCase(
                    _stdio_text(c["input"], f"dataset_json[{i}].input"),
                    _stdio_text(c["output"], f"dataset_json[{i}].output"),
                )
                for i, c in enumerate(cases)
            ),
            checker="lines_decimal" if named else "whitespace",
        )
    if kind != "functional":
        raise ValueError(f"dataset_json: unknown testtype {kind!r} (expected 'stdin' or 'functional')")
    if not fn_name:
        raise ValueError("dataset_json: functional tests need fn_name (or metadata.func_name)")
    calls = []
    for i, c in enumerate(cases):
        calls.append(
            FunctionCase(
                _lcb_args(c["input"], f"dataset_json[{i}].input"),
                _maybe_json(c["output"], f"dataset_json[{i}].output"),
            )
        )
    return TestPlan("function", fn_name=_identifier_path(fn_name, "fn_name"), function=tuple(calls))


def _maybe_json(value: Any, what: str) -> Any:
    return _load_json(value, what) if isinstance(value, str) else value


def _dataset_plan(data: Any, fn_name: str, entry_point: str) -> TestPlan:
    if isinstance(data, list):
        return _case_list_plan(data, fn_name)
    if not isinstance(data, Mapping):
        raise ValueError(f"dataset_json must be a JSON object or array, got {type(data).__name__}")
    if "assert_case" in data:
        return _assert_case_plan(data, entry_point)
    if "inputs" in data or "outputs" in data:
        return _io_plan(data, fn_name)
    if "test" in data:
        test = data["test"]
        entry = entry_point or data.get("entry_point") or ""
        prompt = data.get("prompt") or ""
        if not isinstance(test, str) or not isinstance(entry, str) or not isinstance(prompt, str):
            raise ValueError("dataset_json: HumanEval 'test', 'entry_point' and 'prompt' must be strings")
        _check_assert_code(test, entry, "dataset_json.test")
        return TestPlan("assert", assert_code=test, entry_point=entry, prompt=prompt)
    if "test_list" in data:
        test_list = data["test_list"]
        imports = data.get("test_imports") or []
        setup = data.get("test_setup_code") or ""
        if not isinstance(test_list, list) or not all(isinstance(t, str) for t in test_list) or not test_list:
            raise ValueError("dataset_json: MBPP 'test_list' must be a non-empty list of strings")
        if not isinstance(imports, list) or not all(isinstance(t, str) for t in imports):
            raise ValueError("dataset_json: MBPP 'test_imports' must be a list of strings")
        if not isinstance(setup, str):
            raise ValueError("dataset_json: MBPP 'test_setup_code' must be a string")
        prelude = "".join(line + "\n" for line in imports)
        code = prelude + (setup + "\n" if setup else "") + "".join(t + "\n" for t in test_list)
        _check_assert_code(code, entry_point, "dataset_json.test_list")
        return TestPlan("assert", assert_code=code, entry_point=entry_point, prelude=prelude)
    if any(group in data for group in ("public_tests", "private_tests", "generated_tests")):
        return _code_contests_plan(data)
    if "public_test_cases" in data or "private_test_cases" in data:
        cases: list[Any] = []
        for group in ("public_test_cases", "private_test_cases"):
            # LiveCodeBench's released private cases are base64(zlib(pickle)):
            # unpickling is code execution, so only JSON is accepted here.
            value = _maybe_json(data.get(group) or [], f"dataset_json.{group}")
            if not isinstance(value, list):
                raise ValueError(f"dataset_json.{group} must be a JSON list of test cases")
            cases.extend(value)
        metadata = _maybe_json(data.get("metadata") or {}, "dataset_json.metadata")
        name = fn_name or (metadata.get("func_name") if isinstance(metadata, Mapping) else "") or ""
        return _case_list_plan(cases, name)
    if "test_cases" in data:
        return _prime_intellect_plan(data, fn_name)
    raise ValueError(
        "dataset_json has no known shape; expected one of: inputs/outputs[/fn_name] (verl, APPS, TACO), "
        "test/entry_point (HumanEval), test_list (MBPP), public_tests/private_tests/generated_tests "
        "(CodeContests), a list of {input, output, testtype} or public_test_cases (LiveCodeBench), "
        "test_cases (PrimeIntellect), assert_case (SandboxFusion)"
    )


def _assert_case_plan(data: Mapping[str, Any], entry_point: str) -> TestPlan:
    """SandboxFusion's assert form, as verl's ``sandbox_fusion`` scorer reads it: ``{"assert_case": [code, ...]}``.

    There each case is run as the program followed by the case's code, and passes when that
    runs without an error; its ``inputs`` (stdin) default to empty and its ``outputs`` to none
    (nothing compared). Here the cases are one block of assert code, in order, run against the
    program's top-level names: a test of one case, passed when every case passes (verl's
    continuous score is the fraction of the first ten that pass). ``inputs`` or ``outputs``
    that are not empty (stdin for each case, output to compare) are refused.
    """
    cases = data["assert_case"]
    if not isinstance(cases, list) or not cases or not all(isinstance(case, str) for case in cases):
        raise ValueError("dataset_json: 'assert_case' must be a non-empty list of strings (code)")
    inputs, outputs = data.get("inputs") or [], data.get("outputs") or []
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("dataset_json: 'inputs' and 'outputs' beside 'assert_case' must be lists")
    if any(stdin not in (None, "") for stdin in inputs) or any(output is not None for output in outputs):
        raise ValueError("dataset_json: 'assert_case' with stdin inputs or expected outputs is not supported; "
                         "give the asserts alone")
    entry = entry_point or data.get("entry_point") or ""
    if not isinstance(entry, str):
        raise ValueError("dataset_json: 'entry_point' must be a string")
    code = "".join(case if case.endswith("\n") else case + "\n" for case in cases)
    _check_assert_code(code, entry, "dataset_json.assert_case")
    return TestPlan("assert", assert_code=code, entry_point=entry)


def _prime_intellect_plan(data: Mapping[str, Any], fn_name: str) -> TestPlan:
    """PrimeIntellect's ``verification_info``: ``{"test_cases": [{"type", "input", "output", "fn_name"?}]}``.

    Its problems come from APPS, TACO and CodeContests and keep their conventions, as
    verl's shape does: a ``function_call`` case's input is the list of arguments and its
    output the expected value in a one-element list; ``stdin_stdout`` cases are text.
    """
    cases = _maybe_json(data["test_cases"], "dataset_json.test_cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("dataset_json.test_cases must be a non-empty list of test cases")
    kinds, names = set(), set()
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
            raise ValueError(f"dataset_json.test_cases[{i}] must be an object with 'input' and 'output'")
        kinds.add(case.get("type") or "stdin_stdout")
        if case.get("fn_name"):
            names.add(case["fn_name"])
    if len(kinds) > 1:
        raise ValueError(f"dataset_json.test_cases mixes test types {sorted(map(str, kinds))}")
    kind = kinds.pop()
    inputs = [case["input"] for case in cases]
    outputs = [case["output"] for case in cases]
    if kind == "stdin_stdout":
        return _io_plan({"inputs": inputs, "outputs": outputs}, "")
    if kind != "function_call":
        raise ValueError(f"dataset_json.test_cases: unknown type {kind!r} (expected 'stdin_stdout' or "
                         "'function_call')")
    if len(names) > 1:
        raise ValueError(f"dataset_json.test_cases call different functions {sorted(map(str, names))}")
    name = fn_name or (names.pop() if names else "")
    if not name:
        raise ValueError("dataset_json.test_cases: function_call tests need fn_name")
    inputs = [_maybe_json(args, f"dataset_json.test_cases[{i}].input") for i, args in enumerate(inputs)]
    outputs = [_maybe_json(out, f"dataset_json.test_cases[{i}].output") for i, out in enumerate(outputs)]
    return _io_plan({"inputs": inputs, "outputs": outputs}, name)


def normalize_tests(tests: Mapping[str, Any]) -> TestPlan:
    """Turn the API's ``CodeTests`` (as a dict) into a :class:`TestPlan`.

    Keys are the proto field names (``stdio``, ``fn_name``, ``function``,
    ``assert_code``, ``entry_point``, ``dataset_json``) or their JSON
    camelCase names; empty values mean unset, as in proto3. Tests come either
    explicitly (exactly one of ``stdio``, ``function``, ``assert_code``) or
    verbatim in ``dataset_json`` (a dict, a list, or a JSON string); ``fn_name``
    and ``entry_point`` may accompany ``dataset_json`` and take precedence over
    the dataset's own. Dataset shapes:

    - verl / APPS / TACO ``{"inputs", "outputs", "fn_name"?}``: without
      ``fn_name`` stdio cases (a list of lines is joined with newlines); with
      it, each input is the list of positional arguments, or (verl's
      prime_code) a string of their JSON one per line with the output's JSON
      (see :func:`_prime_code_case`), and an output that is a 1-element list
      also accepts its element as the return value (APPS wraps return values
      in a list, but not always).
    - HumanEval ``{"test", "entry_point", "prompt"?}``: assert kind; ``check``
      is called with the entry point; the prompt is kept (see :class:`TestPlan`
      and :func:`assemble_program`).
    - MBPP ``{"test_list", "test_imports"?, "test_setup_code"?}``: assert kind,
      imports + setup + the asserts as one block (``challenge_test_list`` is
      ignored, as in the reference evaluation).
    - CodeContests ``{"public_tests", "private_tests", "generated_tests"}``:
      stdio, all groups present, in that order.
    - LiveCodeBench ``[{"input", "output", "testtype"}]`` or a row with
      ``public_test_cases``/``private_test_cases`` (JSON only) and
      ``metadata.func_name``: ``stdin`` cases are stdio, checked as its grader
      does (``lines_decimal``) when each names its testtype; ``functional``
      cases take one JSON argument per input line and a JSON output.
    - PrimeIntellect ``{"test_cases": [{"type", "input", "output", "fn_name"?}]}``:
      APPS's conventions (see :func:`_prime_intellect_plan`).
    - SandboxFusion ``{"assert_case": [...]}`` (verl's ``sandbox_fusion``):
      assert kind, the cases in order as one block (see :func:`_assert_case_plan`).

    In every APPS-family call (verl, APPS, TACO, PrimeIntellect), a first
    argument that is a dict whose keys all read as integers is called with
    int keys, as their harnesses do (see :func:`_int_like_keys`).

    Raises ``ValueError`` with a precise message on malformed tests.
    """
    if not isinstance(tests, Mapping):
        raise ValueError(f"tests must be an object, got {type(tests).__name__}")
    fn_name = _get(tests, "fn_name") or ""
    entry_point = _get(tests, "entry_point") or ""
    if not isinstance(fn_name, str) or not isinstance(entry_point, str):
        raise ValueError("fn_name and entry_point must be strings")
    dataset = _get(tests, "dataset_json")
    if dataset in (None, "", {}, []):
        return _explicit_plan(tests, fn_name, entry_point)
    explicit = [key for key in ("stdio", "function", "assert_code") if _get(tests, key)]
    if explicit:
        raise ValueError(f"tests give both dataset_json and {explicit[0]}; give one or the other")
    return _dataset_plan(_maybe_json(dataset, "dataset_json"), fn_name, entry_point)
