"""Test plans: the tests of one code job (:class:`TestPlan`) and their cases."""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .checkers import compare_values


@dataclass(frozen=True)
class StdioCase:
    """One run of the program: what goes to stdin, what stdout must match."""

    stdin: str
    expected_stdout: str


@dataclass(frozen=True)
class FunctionCase:
    """One call of the function under test.

    ``unwrap_single``: APPS/TACO store call-based outputs wrapped in a list
    (``[[1, 2]]`` for a return value of ``[1, 2]``) but not always; when set, a
    1-element list ``expected`` also accepts its single element (see
    :meth:`matches`).

    ``int_keys``: the first argument is a dict whose keys all read as integers,
    and the call gets them as ints (see :meth:`call_args`). JSON, the only way
    the APPS family stores a call, turns ``{1: x}`` into ``{"1": x}``; APPS's
    harness, and TACO's and verl's prime_code copies of it, turn a first
    argument's keys back with ``int()`` before the call, so a correct program
    may index it by ints. The case travels to the judge as JSON too, so the
    flag travels and the judge turns the keys back.
    """

    args: tuple[Any, ...]
    expected: Any
    unwrap_single: bool = False
    int_keys: bool = False

    def call_args(self) -> tuple[Any, ...]:
        """The arguments of the call: ``args``, with ``int_keys`` the first one's keys made ints by ``int()``."""
        if not self.int_keys:
            return self.args
        first, *rest = self.args
        return ({int(key): value for key, value in first.items()}, *rest)

    def matches(self, actual: Any, tolerance: float = 1e-6) -> bool:
        """Whether a decoded return value passes this case."""
        if compare_values(actual, self.expected, tolerance):
            return True
        return (
            self.unwrap_single
            and type(self.expected) is list
            and len(self.expected) == 1
            and compare_values(actual, self.expected[0], tolerance)
        )


@dataclass(frozen=True)
class TestPlan:
    """Tests of one code job, in one of three kinds.

    - ``"stdio"``: run the program once per case in ``stdio``.
    - ``"function"``: call ``fn_name`` (``"Solution.method"`` for LeetCode) once
      per case in ``function``; an unqualified name that is not a top-level
      callable falls back to a method of ``Solution``.
    - ``"assert"``: run ``assert_code`` against the program's top-level names;
      if it defines ``check``, call ``check(<entry_point>)`` (HumanEval).

    ``prompt`` is trusted dataset code (HumanEval's prompt): the agent runs it
    in the test process before ``assert_code`` so that the helpers the tests
    use (HumanEval/32's ``poly``, /38's ``encode_cyclic``) are the dataset's,
    not the candidate's; and :func:`assemble_program` prepends it to a
    body-only completion. ``prelude`` (MBPP's ``test_imports``) is prepended
    to every program, as the reference harness executes it in the program's
    namespace. ``checker`` is the stdout checker of the dataset's own grader
    (see :func:`compare_stdout`), used when a request names none.
    """

    __test__ = False  # not a pytest test class, despite the name

    kind: str
    stdio: tuple[StdioCase, ...] = ()
    fn_name: str = ""
    function: tuple[FunctionCase, ...] = ()
    assert_code: str = ""
    entry_point: str = ""
    prompt: str = ""
    prelude: str = ""
    checker: str = "whitespace"

    @functools.cached_property
    def prompt_head(self) -> str:
        """What of ``prompt`` goes before a completion that defines the entry point itself.

        The whole prompt when it parses alone, else its import lines. The
        daemon shares one plan among every completion of a prompt, so the
        prompt is parsed once, not once per completion.
        """
        if _parse(self.prompt) is not None:
            prompt = self.prompt
        else:
            prompt = "".join(line + "\n" for line in self.prompt.splitlines() if _IMPORT_LINE.match(line))
        return prompt if not prompt or prompt.endswith("\n") else prompt + "\n"

    @property
    def prelude_head(self) -> str:
        """``prelude`` as the first lines of a program (ending in a newline)."""
        head = self.prelude
        return head + "\n" if head and not head.endswith("\n") else head

    @functools.cached_property
    def head_names(self) -> tuple[str, ...] | None:
        """The top-level names of what goes before a completion that defines the entry point (the prelude and
        ``prompt_head``: assembly.split_assembly's first part); None when that does not parse alone. Parsed once per
        plan, as ``own_names``."""
        tree = _parse(self.prelude_head + self.prompt_head + "\n")
        return None if tree is None else tuple(top_level_definitions(tree))

    @functools.cached_property
    def own_names(self) -> tuple[str, ...]:
        """The top-level names the dataset's own code (``prompt`` and ``assert_code``) binds, not by importing them:
        the only ones the judge reads as its hooks (``check``, ``pytestmark``, ...). Parsed once per plan, which the
        daemon shares among a prompt's completions, instead of in a judge for every job."""
        names: dict[str, None] = {}
        for source in (self.prompt, self.assert_code):
            tree = _parse(source) if source else None
            if tree is not None:
                names.update(dict.fromkeys(top_level_definitions(tree)))
        return tuple(names)

    @property
    def total(self) -> int:
        """Number of tests counted by the reward (an assert block counts as one)."""
        if self.kind == "stdio":
            return len(self.stdio)
        if self.kind == "function":
            return len(self.function)
        return 1


_IMPORT_LINE = re.compile(r"^(?:import\s+\S|from\s+\S+\s+import\s)")
# What ast.parse raises for code it cannot take: for a program that does not parse, SyntaxError, or ValueError
# (NUL bytes); for nesting too deep for the parser, RecursionError, or MemoryError (a long chain such as
# "assert " + "-" * 200000 + "1"). _parse and _defines take all four for "does not parse"; the judge, whose
# memory is bounded apart, tells the two apart (assembly.assemble's strict).
_SYNTAX_ERRORS = (SyntaxError, ValueError)
_PARSE_ERRORS = (*_SYNTAX_ERRORS, RecursionError, MemoryError)


def top_level_definitions(tree: ast.Module) -> list[str]:
    """Names a module binds at top level, in order, each once, without dunder names: functions, classes and assigned
    names, including those inside top-level ``if``/``try``/``with`` blocks; not imports."""
    names: list[str] = []

    def add_target(target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                add_target(element)
        elif isinstance(target, ast.Starred):
            add_target(target.value)

    # A stack, not recursion: an if with 1,500 elifs (each the orelse of the one before) nests deeper than the
    # recursion limit lets a recursive walk go, and the walk must not fail on a program that parses.
    bodies: list[Iterator[ast.stmt]] = [iter(tree.body)]
    while bodies:
        node = next(bodies[-1], None)
        if node is None:
            bodies.pop()
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                add_target(target)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            add_target(node.target)
        elif isinstance(node, ast.If):
            bodies.append(itertools.chain(node.body, node.orelse))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            bodies.append(iter(node.body))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            bodies.append(itertools.chain(node.body, *(handler.body for handler in node.handlers),  # type: ignore[attr-defined]
                                          node.orelse, node.finalbody))  # type: ignore[attr-defined]
    return public_names(names)


def public_names(names: Iterable[str]) -> list[str]:
    """Each name once, at its first place, without dunder names."""
    return [name for name in dict.fromkeys(names) if not (name.startswith("__") and name.endswith("__"))]


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except _PARSE_ERRORS:
        return None
