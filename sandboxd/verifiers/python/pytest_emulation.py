"""pytest's way of running a module's tests, in the judge, for the tests of an assert plan: ``test*`` functions and
``Test*`` classes' methods, marks (skip, xfail, skipif, parametrize), fixtures (the tests' own and pytest's
``capsys``, ``capfd`` and their ``binary`` twins, ``caplog``, ``tmp_path``, ``tmpdir``, ``monkeypatch``,
``request``), xunit setups and teardowns, and ``unittest.TestCase`` classes. Never imports pytest: what it needs
of pytest is duck-typed, or imported from ``_pytest`` where the image has it.

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import functools
import inspect
import io
import itertools
import os
import pathlib
import sys
import types
import typing
import unittest
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, cast

from ..code import _parse
from .remote import CandidateClass, JudgeEndpoint, Proxy

# The filename the judge compiles the tests' code under (judge._run_assert): how a function the test code wrote is
# told from others (_defined_here), and a failure's line found (judge._failure_line).
_TEST_FILENAME = "<test>"


def _run_unittest_cases(namespace: dict[str, Any]) -> None:
    """Run the unittest.TestCase classes the test code defined; AssertionError on failure."""
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for value in list(namespace.values()):
        if (
            isinstance(value, type)
            and issubclass(value, unittest.TestCase)
            and value is not unittest.TestCase
        ):
            suite.addTests(loader.loadTestsFromTestCase(value))
    if suite.countTestCases() == 0:
        return
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
    if not result.wasSuccessful():
        failures = result.failures + result.errors
        first = failures[0][1].strip().splitlines()[-1] if failures else "unexpected success"
        raise AssertionError(f"{len(failures)} of {result.testsRun} unittest tests failed; first: {first}")


def _is_main_guard(node: ast.If) -> bool:
    """``if __name__ == "__main__":`` (either way round): its body never runs in the test namespace."""
    test = node.test
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = (test.left, test.comparators[0])
    return any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides) and any(
        isinstance(side, ast.Constant) and side.value == "__main__" for side in sides
    )


def _names_used(source: str) -> set[str]:
    """Names the test code reads anywhere, except in top-level ``__main__`` blocks (which never run here)."""
    tree = _parse(source)
    if tree is None:
        return set()
    used: set[str] = set()
    for statement in tree.body:
        runs = statement.orelse if isinstance(statement, ast.If) and _is_main_guard(statement) else [statement]
        for part in runs:
            used.update(node.id for node in ast.walk(part) if isinstance(node, ast.Name) and type(node.ctx) is ast.Load)
    return used


# pytest marks that say a test is not expected to pass here: such a test, or
# such a parameter set, is left out, as pytest would not count its failure.
_NOT_RUN_MARKS = frozenset({"skip", "xfail"})


def _marks(marks: Iterable[Any] | None) -> list[Any]:
    """The pytest marks among `marks` (a test's ``pytestmark``, a ``pytest.param``'s ``marks``).

    Duck-typed: the harness never imports pytest.
    """
    return [mark for mark in (marks or ()) if isinstance(getattr(mark, "name", None), str)]


def _skipped(marks: Iterable[Any]) -> bool:
    for mark in marks:
        if mark.name in _NOT_RUN_MARKS:
            return True
        # skipif(condition, reason=...): a bool condition; a string one (evaluated by pytest) is not ours to run.
        if mark.name == "skipif" and any(bool(condition) for condition in getattr(mark, "args", ())):
            return True
    return False


def _parameter_sets(marks: Sequence[Any]) -> list[dict[str, object]] | None:
    """The keyword arguments of each call ``@pytest.mark.parametrize`` asks for (stacked ones multiply).

    ``[{}]`` without parametrize; None where a parametrize needs what the
    harness does not provide (``indirect``: fixtures) or does not parse.
    """
    calls: list[dict[str, object]] = [{}]
    for mark in marks:
        if mark.name != "parametrize":
            continue
        args, kwargs = tuple(getattr(mark, "args", ())), dict(getattr(mark, "kwargs", {}))
        names = args[0] if args else kwargs.get("argnames")
        values = args[1] if len(args) > 1 else kwargs.get("argvalues")
        if kwargs.get("indirect") or names is None or values is None:
            return None
        if isinstance(names, str):
            names = [name.strip() for name in names.split(",") if name.strip()]
        names = list(names)
        rows: list[dict[str, object]] = []
        for value in values:
            if hasattr(value, "values") and hasattr(value, "marks") and hasattr(value, "id"):  # pytest.param()
                if _skipped(_marks(value.marks)):
                    continue
                value = value.values[0] if len(names) == 1 else value.values
            row = [value] if len(names) == 1 else list(value)
            if len(row) != len(names):
                return None
            rows.append(dict(zip(names, row, strict=True)))
        calls = [{**done, **row} for done in calls for row in rows]
    return calls


class _Unsupported(Exception):
    """A test that pytest would run but the harness cannot run as pytest would: it needs a
    fixture, an indirect parameter, an event loop. Never dropped silently: the tests that did
    run could all pass while the one a wrong program fails is the one left out."""


def _mark_list(marks: object) -> list[Any]:
    """A ``pytestmark`` as a list: pytest takes one mark or a list of them."""
    if marks is None:
        return []
    return _marks(marks if isinstance(marks, (list, tuple)) else [marks])


def _mock_arguments(test: Callable[..., object]) -> int:
    """How many leading parameters ``@unittest.mock.patch`` decorators fill with mocks (as pytest counts them)."""
    patchings = getattr(test, "patchings", None)
    if not patchings:
        return 0
    from unittest import mock

    return sum(1 for patching in patchings if not getattr(patching, "attribute_name", None)
               and getattr(patching, "new", None) is mock.DEFAULT)




_CaptureResult = collections.namedtuple("_CaptureResult", "out err")


class _Capture:
    """pytest's ``capsys`` (and ``capfd``, and their ``binary`` twins, whose readouterr gives bytes): what the
    test and the candidate print, while the test runs."""

    def __init__(self, binary: bool = False) -> None:
        self._out, self._err = io.StringIO(), io.StringIO()
        self._saved: tuple[Any, Any] | None = None
        self._binary = binary

    def start(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self._out, self._err

    def stop(self) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    def readouterr(self) -> Any:
        out: str | bytes
        err: str | bytes
        out, err = self._out.getvalue(), self._err.getvalue()
        for buffer in (self._out, self._err):
            buffer.seek(0)
            buffer.truncate()
        if self._binary:
            out, err = out.encode("utf-8", "surrogateescape"), err.encode("utf-8", "surrogateescape")
        try:
            from _pytest import capture
        except ImportError:
            return _CaptureResult(out, err)
        return cast("Any", capture).CaptureResult(out, err)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        saved = (sys.stdout, sys.stderr)
        self.stop()
        try:
            yield
        finally:
            self._saved = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = saved


class _Request:
    """pytest's ``request``, as far as a parametrized fixture reads it."""

    def __init__(self, name: str, param: object) -> None:
        self.fixturename = name
        self.param = param


# Random name bytes of a tmp_path folder (tempfile.mkdtemp's 8 characters are about 41 bits).
_TMP_NAME_BYTES = 6


def _tmp_path(files: str) -> pathlib.Path:
    """A new folder for a test's ``tmp_path``: in the job's folder, which the program shares (remote.share_files),
    made as tempfile.mkdtemp makes one (a random name, created only if nothing has it, 0700), or without a job's
    folder, by tempfile itself in the system's.

    Not tempfile at module level: it imports shutil, and that bz2 and lzma,
    whose libraries are 21 more mappings in every code zygote, which each
    fork copies and each exit tears down: about 0.2 ms more a forked job.
    """
    if not files:
        import tempfile

        return pathlib.Path(tempfile.mkdtemp(prefix="pytest-"))
    while True:
        path = os.path.join(files, f"pytest-{os.urandom(_TMP_NAME_BYTES).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # the program's (it shares the folder), or a link it put there: another name
            continue
        return pathlib.Path(path)


def _builtin_fixture(name: str, files: str, cleanup: contextlib.ExitStack,
                     remote: JudgeEndpoint) -> tuple[bool, object]:
    """(found, value) of one of pytest's own fixtures the harness provides; its teardown goes on ``cleanup``."""
    if name == "caplog":
        from .logcapture import CapLog  # imports logging: see logcapture's docstring

        return True, CapLog(remote, cleanup)
    if name in ("capsys", "capfd", "capsysbinary", "capfdbinary"):
        capture = _Capture(binary=name.endswith("binary"))
        capture.start()
        cleanup.callback(capture.stop)
        return True, capture
    if name in ("tmp_path", "tmpdir"):
        path = _tmp_path(files)
        if name == "tmp_path":
            return True, path
        try:
            from _pytest._py.path import LocalPath
        except ImportError:
            return False, None
        return True, LocalPath(str(path))
    if name == "monkeypatch":
        try:
            from _pytest.monkeypatch import MonkeyPatch
        except ImportError:
            return False, None
        patcher = MonkeyPatch()
        cleanup.callback(patcher.undo)
        return True, patcher
    return False, None


_Fixture = tuple[Callable[..., object], Any]  # the fixture's function and its marker (scope, params, autouse)


def _fixtures(namespace: dict[str, Any]) -> dict[str, _Fixture]:
    """The ``@pytest.fixture`` functions the test code defined, by fixture name.

    Duck-typed across pytest versions: 8.4+ wraps a fixture in a
    ``FixtureFunctionDefinition`` with ``_fixture_function_marker``, older ones
    set ``_pytestfixturefunction`` on the function.
    """
    found: dict[str, _Fixture] = {}
    for name, value in list(namespace.items()):
        if isinstance(value, (Proxy, CandidateClass)):
            continue  # the candidate's: asking it about pytest's attributes would be calling it
        marker = getattr(value, "_fixture_function_marker", None) or getattr(value, "_pytestfixturefunction", None)
        # Only pytest's own marker: a mock's `call` answers any attribute with another `call`.
        if type(marker).__name__ != "FixtureFunctionMarker" or not isinstance(getattr(marker, "name", None),
                                                                              (str, type(None))):
            continue
        function = value._get_wrapped_function() if hasattr(value, "_get_wrapped_function") else value
        fixture_name = getattr(marker, "name", None) or name
        found[fixture_name] = (function, marker)
    return found


def _arguments_of(function: Callable[..., object], skip: int = 0) -> tuple[set[str], set[str]]:
    """(required, all) parameter names of a test or a fixture, past the ``skip`` first (mocks, self)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())[skip:]
    except (TypeError, ValueError):
        raise _Unsupported("its signature cannot be read") from None
    required = {parameter.name for parameter in parameters if parameter.default is inspect.Parameter.empty
                and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return required, {parameter.name for parameter in parameters}


_PROVIDED = frozenset({"capsys", "capfd", "capsysbinary", "capfdbinary", "caplog", "tmp_path", "tmpdir",
                       "monkeypatch", "request"})


def _fixture_closure(names: Iterable[str], fixtures: Mapping[str, _Fixture], where: str) -> list[str]:
    """The test's fixtures and theirs, each after those it needs; _Unsupported for one nobody provides."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or (name in _PROVIDED and name not in fixtures):
            return
        if name not in fixtures:
            raise _Unsupported(f"{where}: needs the fixture {name}, which the harness does not provide")
        if name in visiting:
            raise _Unsupported(f"{where}: fixture {name} depends on itself")
        visiting.add(name)
        function, _marker = fixtures[name]
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise _Unsupported(f"{where}: fixture {name} is async (pytest runs these only with a plugin)")
        for needed in _arguments_of(function)[0]:
            visit(needed)
        order.append(name)

    for name in names:
        visit(name)
    return order


class _FixtureValues:
    """The fixtures of one call of a test, each made once, function-scoped; teardowns go on ``cleanup``."""

    def __init__(self, fixtures: Mapping[str, _Fixture], params: Mapping[str, object], files: str,
                 cleanup: contextlib.ExitStack, remote: JudgeEndpoint) -> None:
        self.fixtures, self.params, self.files, self.cleanup, self.remote = fixtures, params, files, cleanup, remote
        self.values: dict[str, object] = {}

    def get(self, name: str) -> object:
        if name in self.values:
            return self.values[name]
        if name in self.fixtures:
            value = self._make(name)
        elif name == "request":
            value = _Request("", None)
        else:
            found, value = _builtin_fixture(name, self.files, self.cleanup, self.remote)
            if not found:
                raise _Unsupported(f"needs the fixture {name}, which the harness does not provide")
        self.values[name] = value
        return value

    def _make(self, name: str) -> object:
        function, _marker = self.fixtures[name]
        required, accepted = _arguments_of(function)
        kwargs: dict[str, object] = {}
        for needed in accepted:
            if needed == "request":
                kwargs[needed] = _Request(name, self.params.get(name))
            elif needed in required or needed in self.fixtures:
                kwargs[needed] = self.get(needed)
        if inspect.isgeneratorfunction(function):
            generator = function(**kwargs)
            value = next(generator)
            self.cleanup.callback(lambda: next(generator, None))
            return value
        return function(**kwargs)


def _run_pytest_style(pytest_test: _PytestTest, fixtures: Mapping[str, _Fixture], remote: JudgeEndpoint,
                      files: str) -> None:
    """Call one pytest-style test once per parameter set (and per fixture parameter), with its fixtures.

    Raises :class:`_Unsupported` before calling it when it needs what the harness
    does not provide (a fixture nobody defines, ``indirect`` parameters) or what
    pytest itself fails (``async def`` without a plugin, ``yield`` tests).
    """
    name, test, setup, teardown, outer_marks = pytest_test[:5]
    declared = getattr(test, "__func__", test)  # a method's marks are on its function
    function = inspect.unwrap(declared)
    marks = [*_marks(getattr(declared, "pytestmark", None)), *outer_marks]
    if _skipped(marks):
        return
    calls = _parameter_sets(marks)
    if calls is None:
        raise _Unsupported(f"{name}: a parametrize the harness cannot apply (indirect, or not parsed)")
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        raise _Unsupported(f"{name}: an async test (pytest runs these only with a plugin)")
    if inspect.isgeneratorfunction(function):
        raise _Unsupported(f"{name}: a yield test (pytest fails these)")
    required, accepted = _arguments_of(test, _mock_arguments(test))
    autouse = [fixture for fixture, (_f, marker) in fixtures.items() if getattr(marker, "autouse", False)]
    runs: list[tuple[dict[str, object], list[str], dict[str, object]]] = []
    for arguments in calls:
        wanted = [*autouse, *sorted((required | (accepted & fixtures.keys())) - arguments.keys())]
        order = _fixture_closure(wanted, fixtures, name)
        parametrized = [fixture for fixture in order if getattr(fixtures[fixture][1], "params", None) is not None]
        for chosen in itertools.product(*(list(fixtures[fixture][1].params) for fixture in parametrized)):
            runs.append((arguments, order, dict(zip(parametrized, chosen, strict=True))))
    for arguments, order, params in runs:
        with contextlib.ExitStack() as cleanup:
            try:
                values = _FixtureValues(fixtures, params, files, cleanup, remote)
                for fixture in order:
                    values.get(fixture)
                kwargs = {key: value for key, value in arguments.items() if key in accepted}
                for parameter in accepted - kwargs.keys():
                    if parameter in required or parameter in fixtures:
                        kwargs[parameter] = values.get(parameter)
                if setup is not None:
                    setup()
                if teardown is not None:
                    cleanup.callback(teardown)
                test(**kwargs)
            finally:
                remote.forget_exports()


class _PytestTest(typing.NamedTuple):
    name: str  # in the namespace: "test_f" or "TestC.test_m"
    test: Callable[..., object]
    setup: Callable[[], object] | None  # xunit-style: setup_function / setup_method, before each call
    teardown: Callable[[], object] | None
    marks: list[Any]  # the class's and the module's
    owner: type | None  # its class, whose setup_class / teardown_class run around its tests


def _defined_here(function: types.FunctionType) -> bool:
    """A function the test code wrote, under any decorators that kept ``__wrapped__`` (mock.patch, wraps)."""
    unwrapped = inspect.unwrap(function)
    return isinstance(unwrapped, types.FunctionType) and unwrapped.__code__.co_filename == _TEST_FILENAME


def _xunit(function: object, argument: object) -> Callable[[], object] | None:
    """An xunit-style setup or teardown as pytest calls it: with its argument only if it takes one."""
    if not callable(function):
        return None
    try:
        takes = any(parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                       inspect.Parameter.VAR_POSITIONAL)
                    for parameter in inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        takes = False
    return functools.partial(function, argument) if takes else function


def _pytest_tests(namespace: dict[str, Any], own: Set[str]) -> list[_PytestTest]:
    """The pytest-style tests the test code defined, in order, with their xunit setups and marks.

    ``test*`` functions (with the module's ``setup_function``/``teardown_function``),
    and the ``test*`` methods of ``Test*`` classes that are not unittest's
    (those run on their own) and have no ``__init__``, each on an instance of
    its own, with ``setup_method``/``teardown_method`` around each call. The
    module's ``pytestmark`` applies to all of them, a class's to its methods.
    """
    module_marks = _mark_list(_hook(namespace, own, "pytestmark"))
    tests: list[_PytestTest] = []
    for name, value in list(namespace.items()):
        if name.startswith("test") and isinstance(value, types.FunctionType):
            if _defined_here(value):
                tests.append(_PytestTest(name, value, _xunit(_hook(namespace, own, "setup_function"), value),
                                         _xunit(_hook(namespace, own, "teardown_function"), value), module_marks,
                                         None))
        elif (
            name.startswith("Test")
            and isinstance(value, type)
            and not issubclass(value, unittest.TestCase)
            and value.__module__ == namespace.get("__name__")
            and "__init__" not in vars(value)
        ):
            class_marks = [*_mark_list(vars(value).get("pytestmark")), *module_marks]
            if _skipped(class_marks):
                continue
            for method_name, method in list(vars(value).items()):
                if method_name.startswith("test") and isinstance(method, types.FunctionType):
                    bound = getattr(value(), method_name)
                    instance = bound.__self__
                    tests.append(_PytestTest(f"{name}.{method_name}", bound,
                                             _xunit(getattr(instance, "setup_method", None), bound),
                                             _xunit(getattr(instance, "teardown_method", None), bound),
                                             class_marks, value))
    return tests


def _run_test_functions(namespace: dict[str, Any], source: str, called_candidate: bool, remote: JudgeEndpoint,
                        files: str, own: Set[str] = frozenset()) -> list[str]:
    """Call the pytest-style tests the test code defined and does not call itself.

    As pytest would: ``test*`` functions and ``Test*`` classes' ``test*``
    methods, once per ``@pytest.mark.parametrize`` parameter set (the
    function's, its class's and the module's ``pytestmark``) and per
    parameter of the fixtures they use, leaving out those marked
    ``skip``/``xfail``, with the fixtures the test code defines (autouse ones
    too; every fixture function-scoped) and pytest's ``capsys``, ``capfd``,
    ``tmp_path``, ``tmpdir``, ``monkeypatch`` and ``request.param``. When
    the code already called the candidate (a script that calls its own test
    functions, or a module-level instance the tests share), the tests its
    code refers to by name are left out, so that none runs twice; the others
    still run, or a module-level ``Counter()`` would pass them unchecked.

    Returns why each test that the harness cannot run as pytest would (it
    needs a fixture nobody defines, an ``indirect`` parameter, an event loop)
    was not run; the others still run, so that a wrong program still fails them.
    """
    tests = _pytest_tests(namespace, own)
    if tests and called_candidate:
        used = _names_used(source)
        tests = [test for test in tests if test.name.partition(".")[0] not in used]
    fixtures = _fixtures(namespace)
    unsupported = []
    module = types.SimpleNamespace(**namespace)
    with contextlib.ExitStack() as module_scope:
        if tests:
            _setup_scope(module_scope, _hook(namespace, own, "setup_module"), _hook(namespace, own, "teardown_module"),
                         module)
        owner: type | None = None
        class_scope = contextlib.ExitStack()
        module_scope.push(class_scope)
        for test in tests:
            if test.owner is not owner:
                class_scope.close()
                owner = test.owner
                if owner is not None:
                    _setup_scope(class_scope, getattr(owner, "setup_class", None),
                                 getattr(owner, "teardown_class", None), owner)
            try:
                _run_pytest_style(test, fixtures, remote, files)
            except _Unsupported as exc:
                unsupported.append(str(exc))
    return unsupported


def _hook(namespace: Mapping[str, Any], own: Set[str], name: str) -> Any:
    """A hook of pytest's or HumanEval's (`pytestmark`, `setup_module`, `check`) that the tests' own code defined.

    The tests' namespace also holds every top-level name of the program
    (_bind_names): a program's `pytestmark = [Mark("skip")]` (a namedtuple,
    which crosses as a value) would skip every test, and its `setup_module` or
    a `check` class would count as calling it, so that a wrong program passes
    pytest-style tests. A hook is read only where the dataset's
    code binds its name, and is never one of the program's objects.
    """
    if name not in own:
        return None
    value = namespace.get(name)
    return None if isinstance(value, (Proxy, CandidateClass)) else value


def _setup_scope(scope: contextlib.ExitStack, setup: object, teardown: object, argument: object) -> None:
    """Run an xunit-style setup now and put its teardown on ``scope`` (pytest's setup_module, setup_class)."""
    run_setup, run_teardown = _xunit(setup, argument), _xunit(teardown, argument)
    if run_setup is not None:
        run_setup()
    if run_teardown is not None:
        scope.callback(run_teardown)
