"""Tests of sandboxd.verifiers.code.assembly: a completion made into the program to run."""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest

from sandboxd.verifiers.code import (
    TestPlan,
    assemble,
    assemble_program,
    program_assembly,
)

pytestmark = pytest.mark.timeout(60)


def test_assemble_program_humaneval_and_mbpp() -> None:
    prompt = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Sum."""\n'
    plan = TestPlan("assert", assert_code="assert f([1]) == 1", entry_point="f", prompt=prompt)
    body = "    return sum(xs)\n"
    assert assemble_program(body, plan) == prompt + body
    full = "def f(xs: List[int]) -> int:\n    return sum(xs)\n"
    program = assemble_program(full, plan)
    assert program == prompt + "\n" + full
    namespace: dict[str, Any] = {}
    exec(program, namespace)
    assert namespace["f"]([1, 2]) == 3  # the completion's definition replaced the stub
    broken = TestPlan("assert", assert_code="assert f() == 1", entry_point="f", prompt="import os\ndef f(:\n")
    assert assemble_program(full, broken) == "import os\n\n" + full
    mbpp = TestPlan("assert", assert_code="assert g() == 1", prelude="import math\n")
    assert assemble_program("def g(): return 1\n", mbpp) == "import math\n\ndef g(): return 1\n"
    assert assemble_program("x", TestPlan("stdio")) == "x"


@pytest.mark.parametrize(("code", "defines"), [
    ("def f(xs):\n    return 1\n", True),
    ("async def f(xs):\n    return 1\n", True),
    ("class f:\n    pass\n", True),
    ("import functools\n@functools.cache\ndef f(xs):\n    return 1\n", True),
    ("x = '\\d'\ndef f(xs):\n    return 1\n", True),  # a SyntaxWarning is no reason to refuse it
    ("    return sum(xs)\n", False),  # a body continuing the prompt
    ("def f(xs):\n    return sum(xs\n", False),  # does not parse alone
    ("def fa(xs):\n    return 1\n", False),
    ("f = lambda xs: 1\n", False),
    ("def g():\n    def f(xs):\n        return 1\n    return f\n", False),  # not at top level
    ("class C:\n    def f(self):\n        return 1\n", False),
    ('s = """\ndef f(xs):\n    return 1\n"""\n', False),  # only inside a string
    ("def f(xs):\n    return 1\x00\n", False),  # a NUL byte
    ("x = " + "(" * 300 + ")" * 300 + "\ndef f(xs):\n    return 1\n", False),  # nested past the parser's limit
])
def test_a_completion_defines_the_entry_point_only_with_a_top_level_statement(code: str, defines: bool) -> None:
    plan = TestPlan("assert", assert_code="assert f([1]) == 1", entry_point="f", prompt="def f(xs):\n    pass\n")
    assert assemble_program(code, plan) == ("def f(xs):\n    pass\n" + ("\n" if defines else "") + code)


def test_the_daemon_neither_parses_nor_compiles_a_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    """ast.parse of 1 MiB of code took 1.3-1.7 s here, twice per job (the prompt's assembly, the names the tests
    may call), on the daemon's event loop: 2.5-3.3 s per hostile job held every other call; compile() of it, which
    replaced the first, 0.33-0.47 s. Only the dataset's prompt and tests are parsed, once per plan; the program is
    assembled in the sandbox, by the candidate and the judge, as code.assemble makes it."""
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

    from sandboxd import jobs
    from sandboxd.config import Config
    from sandboxd.verifiers.code import assembly as code_module

    parsed: list[str] = []
    real_parse = ast.parse
    real_defines = code_module._defines

    def parse(source: str, *args: Any, **kwargs: Any) -> ast.Module:
        parsed.append(source)
        return real_parse(source, *args, **kwargs)

    def defines(code: str, name: str) -> bool:
        raise AssertionError("the daemon compiled the completion")

    monkeypatch.setattr(ast, "parse", parse)
    monkeypatch.setattr(code_module, "_defines", defines)
    prompt = "def add(a, b):\n    \"\"\"Their sum.\"\"\"\n"
    dataset = json.dumps({"prompt": prompt, "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                          "entry_point": "add"})
    programs = []
    for code, program in [("def add(a, b):\n    return a + b\n", prompt + "\ndef add(a, b):\n    return a + b\n"),
                          ("    return a + b\n", prompt + "    return a + b\n")]:
        job = pb.Job(code=pb.CodeJob(completion=f"```python\n{code}```", tests=pb.CodeTests(dataset_json=dataset)))
        prepared = jobs.prepare(job, Config())
        assert prepared.agent_job is not None and prepared.agent_job["kind"] == "code"
        assert prepared.agent_job["program"]["code"] == code
        programs.append((prepared.agent_job["assembly"], code, program))
    assert not [source for source in parsed if "return a + b" in source]
    monkeypatch.setattr(code_module, "_defines", real_defines)
    for assembly, code, program in programs:
        assert code_module.assemble(code, assembly) == program


# Completions of every kind the split must read as assemble does: body-only and whole functions, definitions in
# blocks and strings, code that parses but does not compile, async, classes, match, a __future__ import.
_PROMPT = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Sum."""\n'
SPLIT_CASES = [
    "    return sum(xs)\n",
    "    return helper(xs)\n\ndef helper(xs):\n    return sum(xs)\n",
    "def f(xs):\n    return sum(xs)\n",
    "import math\nLIMIT = 10\ndef f(xs):\n    return sum(xs)\nclass C:\n    pass\n",
    "async def f(xs):\n    return 1\n",
    "class f:\n    pass\n",
    "if True:\n    def f(xs):\n        return 1\n",
    "s = '''\ndef f(xs):\n'''\n",
    "s = '''\ndef f(xs):\n'''\nif True:\n    def f(xs):\n        return 2\n",
    "def g():\n    def f():\n        pass\n\ndef f(xs):\n    return 3\n",
    "def f(xs):\n    return 1\nreturn 5\n",
    "def f(xs):\n    return 1\nnonlocal q\n",
    "def f(a, a):\n    return 1\n",
    "from __future__ import annotations\ndef f(xs):\n    return 1\n",
    "def f(xs):\n    match xs:\n        case [x]:\n            return x\n",
    "for _ in range(1):\n    def f(xs):\n        return 4\n",
    "try:\n    pass\nexcept Exception:\n    def f(xs):\n        return 5\n",
    "match 1:\n    case 1:\n        def f(xs):\n            return 6\n",
    "def f(xs:\n    return 1\n",
    "def f(xs):\n\treturn '\\d'\n",
    "",
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("code", SPLIT_CASES)
@pytest.mark.parametrize("head", ["", "import os\n"])
def test_split_assembly_reads_the_program_assemble_makes(code: str, head: str) -> None:
    """The judge's split (one parse of the completion) makes assemble's program whenever that program compiles
    (the candidate loads); where the two choose differently, neither program compiles."""
    from sandboxd.verifiers.code.assembly import split_assembly

    plan = TestPlan("assert", assert_code="assert f([1]) == 1", entry_point="f", prompt=_PROMPT, prelude=head)
    assembly = program_assembly(plan)
    assert assembly is not None
    program = assemble(code, assembly)
    before, tree = split_assembly(code, assembly)
    split_program = before if tree is None else before + code
    if split_program != program:
        for text in (program, split_program):
            with pytest.raises(SyntaxError):
                compile(text, "<solution>", "exec")
    if tree is not None:
        assert ast.dump(tree) == ast.dump(ast.parse(code))
