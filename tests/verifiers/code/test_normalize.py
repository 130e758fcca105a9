"""Tests of sandboxd.verifiers.code.normalize: the API's tests and every dataset shape read into
one plan."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandboxd.verifiers.code import (
    FunctionCase,
    StdioCase,
    compare_stdout,
    normalize_tests,
)
from sandboxd.verifiers.python.harness import (
    top_level_names,
)

pytestmark = pytest.mark.timeout(60)


def test_explicit_stdio_function_and_assert() -> None:
    plan = normalize_tests(
        {"stdio": [{"stdin": "1 2\n", "expected_stdout": "3\n"}, {"stdin": "", "expected_stdout": ""}]}
    )
    assert plan.kind == "stdio" and plan.stdio[0] == StdioCase("1 2\n", "3\n") and plan.total == 2
    plan = normalize_tests(
        {"fn_name": "Solution.twoSum", "function": [{"args_json": "[[2, 7], 9]", "expected_json": "[0, 1]"}]}
    )
    assert plan.kind == "function" and plan.fn_name == "Solution.twoSum"
    assert plan.function == (FunctionCase(([2, 7], 9), [0, 1]),)
    plan = normalize_tests({"assertCode": "assert f(1) == 2", "entryPoint": ""})  # JSON field names
    assert plan.kind == "assert" and plan.assert_code == "assert f(1) == 2" and plan.total == 1


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ({}, "no tests"),
        ({"stdio": [{"stdin": "1"}], "assert_code": "assert 1"}, "both stdio and assert_code"),
        ({"function": [{"args_json": "[1]", "expected_json": "1"}]}, "need fn_name"),
        ({"fn_name": "f", "function": [{"args_json": "{}", "expected_json": "1"}]}, "JSON array"),
        ({"fn_name": "f", "function": [{"args_json": "[1", "expected_json": "1"}]}, "not valid JSON"),
        ({"fn_name": "f", "function": [{"args_json": "[1]"}]}, "expected_json is empty"),
        ({"fn_name": "a.b.c", "function": [{"args_json": "[]", "expected_json": "1"}]}, "Class.method"),
        ({"assert_code": "assert (", "entry_point": "f"}, "does not parse"),
        ({"assert_code": "def check(candidate):\n    assert candidate(1)\n"}, "no entry_point"),
        ({"dataset_json": "{not json"}, "not valid JSON"),
        ({"dataset_json": {"inputs": ["1"], "outputs": []}}, "1 inputs but 0 outputs"),
        ({"dataset_json": {"inputs": [], "outputs": []}}, "no test cases"),
        (
            {"dataset_json": {"inputs": [1], "outputs": ["1"], "fn_name": "f"}},
            r"inputs\[0\] must be a list of arguments, or their JSON one per line",
        ),
        ({"dataset_json": {"inputs": ["1\n[2"], "outputs": ["3"], "fn_name": "f"}}, r"inputs\[0\] is not valid JSON"),
        ({"dataset_json": {"inputs": ["1"], "outputs": ["{3"], "fn_name": "f"}}, r"outputs\[0\] is not valid JSON"),
        ({"dataset_json": {"inputs": ["\n"], "outputs": ["3"], "fn_name": "f"}}, "holds no arguments"),
        ({"dataset_json": {"inputs": [1], "outputs": ["1"]}}, "must be a string"),
        ({"dataset_json": {"something": 1}}, "no known shape"),
        ({"dataset_json": {"test_list": []}}, "non-empty list"),
        ({"dataset_json": {"public_tests": {"input": ["1"], "output": []}}}, "equal length"),
        ({"dataset_json": {"public_tests": {"input": [], "output": []}}}, "no test cases"),
        ({"dataset_json": [{"input": "1", "output": "1", "testtype": "functional"}]}, "need fn_name"),
        (
            {
                "dataset_json": [
                    {"input": "1", "output": "1", "testtype": "stdin"},
                    {"input": "[1]", "output": "1", "testtype": "functional"},
                ]
            },
            "mixes",
        ),
        (
            {"dataset_json": {"inputs": ["1"], "outputs": ["1"]}, "assert_code": "assert 1"},
            "one or the other",
        ),
        ({"dataset_json": 3}, "object or array"),
        ("stdio", "must be an object"),
    ],
)
def test_malformed_tests_raise_precise_value_errors(tests: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        normalize_tests(tests)


def test_apps_stdio_shape_as_json_string() -> None:
    row = json.dumps({"inputs": ["1 2\n", ["3", "4"]], "outputs": ["3\n", ["7"]]})
    plan = normalize_tests({"dataset_json": row})
    assert plan.kind == "stdio"
    assert plan.stdio == (StdioCase("1 2\n", "3\n"), StdioCase("3\n4", "7"))


def test_apps_call_based_shape_unwraps_single_element_outputs() -> None:
    plan = normalize_tests(
        {
            "dataset_json": {
                "inputs": [[1, 2], [[1, 2]], [[3]]],
                "outputs": [[3], [[2, 1]], [3, 3]],
                "fn_name": "f",
            }
        }
    )
    assert plan.kind == "function" and plan.fn_name == "f"
    first, second, third = plan.function
    assert first.args == (1, 2) and first.matches(3) and first.matches([3])
    assert second.matches([2, 1]) and second.matches([[2, 1]]) and not second.matches(2)
    assert third.matches([3, 3]) and not third.matches(3)  # only 1-element lists unwrap
    # An explicit fn_name wins over the dataset's.
    plan = normalize_tests(
        {"fn_name": "g", "dataset_json": {"inputs": [[1]], "outputs": [1], "fn_name": None}}
    )
    assert plan.fn_name == "g"


def test_verl_prime_code_call_form_reads_json_lines() -> None:
    """verl's prime_code rows: arguments as JSON, one per line; the return value as JSON (as its testing_util)."""
    row = {"inputs": ["1\n2", "[1, 2]\n\"ab\""], "outputs": ["3", "[[1, 2], \"ab\"]"], "fn_name": "add"}
    for shape in (row, json.dumps(row)):
        plan = normalize_tests({"dataset_json": shape})
        assert plan.kind == "function" and plan.fn_name == "add"
        assert plan.function == (FunctionCase((1, 2), 3, unwrap_single=True),
                                 FunctionCase(([1, 2], "ab"), [[1, 2], "ab"], unwrap_single=True))
    one = normalize_tests({"dataset_json": {"inputs": ["5"], "outputs": ["[5]"], "fn_name": "f"}}).function[0]
    assert one.args == (5,) and one.matches(5) and one.matches([5]) and not one.matches([[5]])
    # An output already decoded (a parquet column of values) is taken as it is; list inputs keep APPS's reading.
    mixed = normalize_tests({"dataset_json": {"inputs": ["1\n2", [1, 2]], "outputs": [3, [3]], "fn_name": "add"}})
    assert mixed.function == (FunctionCase((1, 2), 3, unwrap_single=True),
                              FunctionCase((1, 2), [3], unwrap_single=True))
    # Without fn_name the same strings are stdin.
    assert normalize_tests({"dataset_json": {"inputs": ["1\n2"], "outputs": ["3"]}}).stdio == (StdioCase("1\n2", "3"),)


def test_apps_family_calls_get_a_first_dict_argument_with_int_keys() -> None:
    """JSON keeps dict keys as strings; APPS's harness, and verl's prime_code copy, give a first argument's keys
    that all read as integers back as ints before the call, so a correct program may index it by ints."""
    prime = normalize_tests({"dataset_json": {"inputs": ['{"1": "a", "-2": "b"}\n3'], "outputs": ['"a"'],
                                              "fn_name": "pick"}}).function[0]
    assert prime.int_keys and prime.args == ({"1": "a", "-2": "b"}, 3)
    assert prime.call_args() == ({1: "a", -2: "b"}, 3), "every argument kept (verl drops those after the dict)"
    apps = normalize_tests({"dataset_json": {"inputs": [[{"10": 1}]], "outputs": [[1]], "fn_name": "f"}}).function[0]
    assert apps.int_keys and apps.call_args() == ({10: 1},)
    intellect = normalize_tests({"dataset_json": {"test_cases": [
        {"type": "function_call", "fn_name": "f", "input": [{" 7": 0}], "output": [0]}]}}).function[0]
    assert intellect.int_keys and intellect.call_args() == ({7: 0},)  # int() reads " 7" as verl's harness does
    for first in ('{"1": 1, "x": 2}', '{"1.5": 1}', "{}", '[{"1": 1}]', '"1"', '{"' + "9" * 5000 + '": 1}'):
        case = normalize_tests({"dataset_json": {"inputs": [first], "outputs": ["1"], "fn_name": "f"}}).function[0]
        assert not case.int_keys and case.call_args() == case.args, first
    # Only the first argument, only its own keys (not nested dicts), as there.
    case = normalize_tests({"dataset_json": {"inputs": ['1\n{"2": {"3": 4}}'], "outputs": ["1"],
                                             "fn_name": "f"}}).function[0]
    assert not case.int_keys
    nested = FunctionCase(({"2": {"3": 4}},), 1, int_keys=True)
    assert nested.call_args() == ({2: {"3": 4}},)
    # Explicit function cases are the caller's own values: no conversion.
    explicit = normalize_tests({"fn_name": "f", "function": [{"args_json": '[{"1": 2}]', "expected_json": "1"}]})
    assert not explicit.function[0].int_keys


def test_sandbox_fusion_assert_cases() -> None:
    """verl's sandbox_fusion scorer reads {"assert_case": [...]}: each case code run after the program."""
    row = {"assert_case": ["assert add(1, 2) == 3", "assert add(0, 0) == 0\n"]}
    for shape in (row, json.dumps(row), {**row, "inputs": ["", ""], "outputs": [None, None]}):
        plan = normalize_tests({"dataset_json": shape})
        assert (plan.kind, plan.assert_code, plan.total) == ("assert", "assert add(1, 2) == 3\nassert add(0, 0) == 0\n",
                                                             1)
    checked = normalize_tests({"dataset_json": {"assert_case": ["def check(f):\n    assert f(1) == 2\n"],
                                                "entry_point": "inc"}})
    assert checked.entry_point == "inc"
    for bad, message in (
        ({"assert_case": []}, "non-empty list of strings"),
        ({"assert_case": "assert f()"}, "non-empty list of strings"),
        ({"assert_case": ["assert f()"], "inputs": ["1\n"], "outputs": [None]}, "not supported"),
        ({"assert_case": ["assert f()"], "inputs": [""], "outputs": ["1"]}, "not supported"),
        ({"assert_case": ["assert f("]}, "does not parse"),
        ({"assert_case": ["def check(f):\n    pass\n"]}, "no entry_point"),
    ):
        with pytest.raises(ValueError, match=message):
            normalize_tests({"dataset_json": bad})


def test_humaneval_shape_keeps_prompt_and_entry_point() -> None:
    row = {
        "prompt": "def f(x):\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "f",
        "task_id": "HumanEval/0",
    }
    plan = normalize_tests({"dataset_json": row})
    assert (plan.kind, plan.entry_point, plan.prompt) == ("assert", "f", "def f(x):\n")
    assert "def check" in plan.assert_code


def test_mbpp_shape() -> None:
    row = {
        "test_list": ["assert f(1) == 2", "assert f(2) == 3"],
        "test_imports": ["import math"],
        "test_setup_code": "",
        "challenge_test_list": ["assert f(3) == 0"],
    }
    plan = normalize_tests({"dataset_json": row})
    assert plan.kind == "assert" and plan.prelude == "import math\n"
    assert plan.assert_code == "import math\nassert f(1) == 2\nassert f(2) == 3\n"


def test_code_contests_shape_concatenates_groups() -> None:
    row = {
        "public_tests": {"input": ["1\n"], "output": ["1\n"]},
        "private_tests": {"input": ["2\n"], "output": ["4\n"]},
        "generated_tests": {"input": [], "output": []},
        "name": "x",
    }
    plan = normalize_tests({"dataset_json": row})
    assert plan.stdio == (StdioCase("1\n", "1\n"), StdioCase("2\n", "4\n"))


@pytest.mark.parametrize(("tests", "checker"), [
    # Not the tester's tokens_ignore_case: it pays an echo of the input on a problem that changes a word's case.
    pytest.param({"public_tests": {"input": ["1"], "output": ["YES"]}}, "whitespace", id="code-contests"),
    pytest.param([{"input": "1", "output": "2.0", "testtype": "stdin"}], "lines_decimal", id="livecodebench"),
    pytest.param({"public_test_cases": json.dumps([{"input": "1", "output": "2.0", "testtype": "stdin"}]),
                  "private_test_cases": "[]", "metadata": "{}"}, "lines_decimal", id="livecodebench-row"),
    pytest.param([{"input": "1", "output": "2.0", "testtype": "stdin", "metadata": {}}], "lines_decimal",
                 id="deepcoder-livecodebench"),
    # Other datasets keep whitespace: a bare list of {input, output} is not only LiveCodeBench's (DeepCoder's
    # Codeforces rows), and the APPS-family graders (verl's prime_code, TACO) are not case-insensitive.
    pytest.param([{"input": "1", "output": "2"}], "whitespace", id="bare-case-list"),
    pytest.param({"inputs": ["1"], "outputs": ["2"]}, "whitespace", id="verl-apps"),
    pytest.param({"test_cases": [{"type": "stdin_stdout", "input": "1", "output": "2"}]}, "whitespace",
                 id="prime-intellect"),
    pytest.param([{"type": "stdin_stdout", "input": "1", "output": "2"}], "whitespace", id="deepcoder-prime"),
])
def test_a_dataset_shape_names_its_graders_checker(tests: Any, checker: str) -> None:
    assert normalize_tests({"dataset_json": tests}).checker == checker


def test_explicit_cases_are_checked_by_whitespace() -> None:
    assert normalize_tests({"stdio": [{"stdin": "", "expected_stdout": "1"}]}).checker == "whitespace"


def test_livecodebench_shapes() -> None:
    cases = [{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]
    assert normalize_tests({"dataset_json": json.dumps(cases)}).stdio == (StdioCase("3\n1 2 3\n", "6\n"),)
    functional = [{"input": "[2, 7, 11]\n9", "output": "[0, 1]", "testtype": "functional"}]
    plan = normalize_tests({"fn_name": "twoSum", "dataset_json": functional})
    assert plan.function == (FunctionCase(([2, 7, 11], 9), [0, 1]),)
    row = {
        "public_test_cases": json.dumps(functional),
        "private_test_cases": "[]",
        "metadata": json.dumps({"func_name": "twoSum"}),
    }
    plan = normalize_tests({"dataset_json": row})
    assert plan.fn_name == "twoSum" and len(plan.function) == 1
    with pytest.raises(ValueError, match="not valid JSON"):
        normalize_tests({"dataset_json": {"public_test_cases": "eJzLSM3JyQcABiwCFQ==", "metadata": "{}"}})


def test_prime_intellect_shapes() -> None:
    """verification_info of PrimeIntellect's verifiable-coding-problems, as a dict or its JSON string."""
    stdio = {"language": "python", "test_cases": [
        {"type": "stdin_stdout", "input": "1 2\n", "output": "3\n", "fn_name": None},
        {"type": "stdin_stdout", "input": "5 5\n", "output": "10\n"},
    ]}
    for shape in (stdio, json.dumps(stdio)):
        assert normalize_tests({"dataset_json": shape}).stdio == (StdioCase("1 2\n", "3\n"),
                                                                   StdioCase("5 5\n", "10\n"))
    calls = {"test_cases": [{"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]},
                            {"type": "function_call", "fn_name": "add", "input": "[[1], [2]]", "output": "[[1, 2]]"}]}
    plan = normalize_tests({"dataset_json": calls})
    assert plan.kind == "function" and plan.fn_name == "add"
    assert plan.function == (FunctionCase((1, 2), [3], unwrap_single=True),
                             FunctionCase(([1], [2]), [[1, 2]], unwrap_single=True))
    assert normalize_tests({"fn_name": "plus", "dataset_json": calls}).fn_name == "plus"
    # DeepCoder keeps the same cases as a bare list: they were read as stdin/stdout, the arguments as stdin.
    bare = normalize_tests({"dataset_json": calls["test_cases"]})
    assert bare.kind == "function" and bare.fn_name == "add" and bare.function == plan.function
    assert normalize_tests({"dataset_json": stdio["test_cases"]}).stdio == (StdioCase("1 2\n", "3\n"),
                                                                        StdioCase("5 5\n", "10\n"))
    # DeepCoder's LiveCodeBench cases name the function in each case's metadata.
    lcb = [{"input": "[1, 2]", "output": "3", "testtype": "functional", "metadata": {"func_name": "add"}}]
    assert normalize_tests({"dataset_json": lcb}).fn_name == "add"
    for bad, message in (
        ({"test_cases": []}, "non-empty list"),
        ({"test_cases": [{"type": "stdin_stdout", "input": "1"}]}, "'input' and 'output'"),
        ({"test_cases": [{"type": "stdin_stdout", "input": "1", "output": "1"},
                         {"type": "function_call", "fn_name": "f", "input": [], "output": [1]}]}, "mixes"),
        ({"test_cases": [{"type": "function_call", "input": [1], "output": [1]}]}, "need fn_name"),
        ({"test_cases": [{"type": "function_call", "fn_name": "f", "input": [1], "output": [1]},
                         {"type": "function_call", "fn_name": "g", "input": [1], "output": [1]}]}, "different"),
        ({"test_cases": [{"type": "checker", "input": "1", "output": "1"}]}, "unknown type"),
    ):
        with pytest.raises(ValueError, match=message):
            normalize_tests({"dataset_json": bad})


# "assert -(-(...1))": ast.parse runs out of memory (MemoryError) rather than raising SyntaxError.
DEEP_ASSERT = "assert " + "-" * 200000 + "1"


def test_assert_code_the_parser_cannot_take_is_invalid() -> None:
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

    from sandboxd import jobs
    from sandboxd.config import Config
    from sandboxd.errors import InvalidRequest

    with pytest.raises(ValueError, match="assert_code does not parse"):
        normalize_tests({"assert_code": DEEP_ASSERT})
    with pytest.raises(ValueError, match=r"dataset_json\.test does not parse"):
        normalize_tests({"dataset_json": {"test": DEEP_ASSERT, "entry_point": "f"}})
    with pytest.raises(ValueError, match="assert_code does not parse"):
        normalize_tests({"assert_code": "assert 1\x00"})
    job = pb.Job(
        index=2,
        code=pb.CodeJob(
            completion="```python\ndef f():\n    return 1\n```", tests=pb.CodeTests(assert_code=DEEP_ASSERT)
        ),
    )
    with pytest.raises(InvalidRequest, match=r"jobs\[2\].code.tests: assert_code does not parse"):
        jobs.prepare(job, Config())
    assert top_level_names(DEEP_ASSERT) == []


def test_the_testers_leniency_pays_an_echo_of_the_input_so_it_is_not_a_default() -> None:
    """Codeforces 281A (capitalise a word): printing the input passes CodeContests' tester, which ignores case;
    a trainer's policy would learn to echo. Unset, a CodeContests row is checked with whitespace."""
    assert compare_stdout("konjac\n", "Konjac\n", "tokens_ignore_case")
    plan = normalize_tests({"dataset_json": {"public_tests": {"input": ["konjac\n"], "output": ["Konjac\n"]}}})
    assert not compare_stdout("konjac\n", plan.stdio[0].expected_stdout, plan.checker)
