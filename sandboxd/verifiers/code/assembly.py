"""Program assembly: a completion made into the program to run, with what its dataset implies."""

from __future__ import annotations

import ast
import re
import types
import warnings
from collections.abc import Iterator, Mapping

from .plans import _PARSE_ERRORS, _SYNTAX_ERRORS, TestPlan

# A def or class statement at top level, and the name it binds (see _defines). One
# pattern, compiled once (in the zygote): a pattern made per name would be compiled
# by re's Python code in every candidate, which a fresh worker pays in page faults
# (about 70 per HumanEval candidate).
_TOP_LEVEL_DEFINITION = re.compile(r"^(?:async[ \t]+def|def|class)[ \t]+(\w+)", re.MULTILINE)


def _defines(code: str, name: str, parse_errors: tuple[type[BaseException], ...] = _PARSE_ERRORS) -> bool:
    """Whether ``code`` parses and a ``def`` or ``class`` statement at its top level binds ``name``.

    No AST: a statement at top level starts at column 0, and the compiled
    module keeps the code object of each function and class it defines
    among its constants. ast.parse builds a Python object per node: about
    4x compile()'s time for large code (over 1 s per MiB); a completion
    without such a line is not compiled at all. The daemon
    does not ask it (see :func:`program_assembly`).
    """
    if not any(match[1] == name for match in _TOP_LEVEL_DEFINITION.finditer(code)):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings (an invalid escape) are the candidate's
        try:
            module = compile(code, "<completion>", "exec", dont_inherit=True)
        except parse_errors:
            return False
    return any(isinstance(const, types.CodeType) and const.co_name == name for const in module.co_consts)


def program_assembly(plan: TestPlan) -> dict[str, str] | None:
    """What :func:`assemble` needs to make a completion's program for ``plan``, when that depends on the completion.

    Only a HumanEval prompt makes it so (see :func:`assemble_program`);
    ``None`` otherwise. The daemon sends this with the bare completion, and
    the candidate's and the judge's processes assemble the program in the
    sandbox, on the job's time: whether the completion defines the entry
    point takes a compile of it, 0.33-0.47 s for 1 MiB of code, which held
    the daemon's event loop (every other call) when the daemon assembled it.
    """
    if not (plan.prompt and plan.entry_point):
        return None
    return {"head": plan.prelude_head, "prompt": plan.prompt, "prompt_head": plan.prompt_head,
            "entry_point": plan.entry_point}


def assemble(code: str, assembly: Mapping[str, str], *, strict: bool = False) -> str:
    """The program of completion ``code`` by ``assembly`` (from :func:`program_assembly`).

    ``strict``: a compile of ``code`` that runs out of memory or recursion
    raises (MemoryError, RecursionError) instead of taking ``code`` for one
    that does not define the entry point: the judge, whose memory is bounded
    apart from the candidate's, must not assemble another program than the
    candidate did.
    """
    if not _defines(code, assembly["entry_point"], _SYNTAX_ERRORS if strict else _PARSE_ERRORS):
        return assembly["head"] + assembly["prompt"] + code
    return assembly["head"] + assembly["prompt_head"] + "\n" + code


def split_assembly(code: str, assembly: Mapping[str, str]) -> tuple[str, ast.Module | None]:
    """:func:`assemble`'s program of ``code`` in two parts, for a reader of its syntax tree (the judge, for the
    program's top-level names): the text before the completion and the completion's tree, when the completion
    defines the entry point (it then comes whole after the prompt); otherwise the whole program and None.

    One ast.parse of the completion, which the judge needs for its names anyway, stands for :func:`_defines`'
    compile and a parse of the whole program: half the judge's time on a HumanEval program. The two differ
    only for code that parses but does not compile (a module-level ``return`` or ``nonlocal``, a repeated
    argument), which fails to compile in either program: the candidate's load error is then the verdict, and
    no name is read. Raises what ast.parse raises past a program's syntax (MemoryError, RecursionError).
    """
    name = assembly["entry_point"]
    if any(match[1] == name for match in _TOP_LEVEL_DEFINITION.finditer(code)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings (an invalid escape) are the candidate's
            try:
                tree = ast.parse(code)
            except _SYNTAX_ERRORS:
                tree = None
        if tree is not None and name in _module_code_definitions(tree):
            return assembly["head"] + assembly["prompt_head"] + "\n", tree
    return assembly["head"] + assembly["prompt"] + code, None


def _module_code_definitions(tree: ast.Module) -> set[str]:
    """Names of the functions and classes whose code objects the module's own code holds, as _defines reads them
    among its constants: defined at module level, in any block (if, for, while, try, with, match), not in a
    function or class body."""
    names: set[str] = set()
    # A stack, not recursion: an if with 1,500 elifs nests each in the one before.
    stack: list[Iterator[ast.AST]] = [iter(tree.body)]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.stmt):
            stack.append(child for child in ast.iter_child_nodes(node)
                         if isinstance(child, (ast.stmt, ast.ExceptHandler, ast.match_case)))
        elif isinstance(node, (ast.ExceptHandler, ast.match_case)):
            stack.append(iter(node.body))
    return names


def assemble_program(code: str, plan: TestPlan) -> str:
    """The Python program to run for ``plan``: ``code`` plus what the dataset implies.

    ``plan.prelude`` goes first. Then, with a HumanEval prompt: a completion
    that does not define ``plan.entry_point`` at top level (a body-only
    completion, which does not even parse alone) continues the prompt, as in
    HumanEval's own harness; one that does (a chat model's full function)
    comes after the whole prompt, so it can use the prompt's imports and
    helpers (``List``, HumanEval/32's ``poly``) and its own definitions replace
    the prompt's stub. A prompt that does not parse alone contributes only its
    import lines.
    """
    assembly = program_assembly(plan)
    if assembly is not None:
        return assemble(code, assembly)
    head = plan.prelude_head
    return head + "\n" + code if head else code
