"""Red-team attacks on the two-process harness (sandboxd.verifiers.python: remote, wire, harness), each run for
real: a candidate process and a judge joined by a socketpair. Each asserts the safe outcome: a wrong program fails as
the program's failure, never passes and never escapes as the harness's (unsupported, INTERNAL), and the judge
survives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandboxd.verifiers.code import FunctionCase
from tests.verifiers.python.test_harness import harness

pytestmark = pytest.mark.timeout(60)

# The program's own statuses: a failure scored as the model's (never ok, unsupported, no_calls or an exception).
FAILED = ("wrong_answer", "runtime_error", "died")


def _assert(code: str, tests: str, tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    return harness(code, tmp_path, "assert", assert_code=tests, **kwargs)


def _failed(result: dict[str, Any]) -> None:
    assert not result["passed"] and result["status"] in FAILED, (result["status"], result["message"])


PYTEST_ADD = ("from solution import add\ndef test_add():\n    assert add(1, 2) == 3\n"
              "def test_more():\n    assert add(2, 2) == 4\n")
SKIP_MARK = ("import collections\nM = collections.namedtuple('M', 'name args kwargs')\n"
             "pytestmark = [M('skip', (), {})]\n")
WRONG_ADD = "def add(a, b):\n    return 0\n"


# ---- the program's names taken for the tests' hooks ----


@pytest.mark.parametrize("hooks", [
    pytest.param(SKIP_MARK, id="pytestmark-value"),
    pytest.param("class M:\n    name = 'skip'\n    args = ()\npytestmark = [M()]\n", id="pytestmark-object"),
    pytest.param(SKIP_MARK + "def setup_module(module):\n    pass\n", id="pytestmark-and-setup_module"),
    pytest.param(SKIP_MARK + "class check:\n    def __init__(self, f):\n        pass\n", id="pytestmark-and-check"),
])
def test_a_programs_pytestmark_or_hooks_do_not_skip_the_tests(hooks: str, tmp_path: Path) -> None:
    """Before: the program's `pytestmark` (a namedtuple crosses as a value; an object's `.name` is read from it)
    skipped every test, and reading it (or calling its setup_module or `check` class) counted as calling the
    program: a wrong `add` passed (1.0)."""
    _failed(_assert(hooks + WRONG_ADD, PYTEST_ADD, tmp_path, entry_point="add"))


def test_the_tests_own_hooks_still_apply(tmp_path: Path) -> None:
    tests = ("import pytest\nfrom solution import add\npytestmark = pytest.mark.parametrize('x', [1, 2])\n"
             "calls = []\ndef setup_function(f):\n    calls.append(f.__name__)\n"
             "def test_add(x):\n    assert add(x, 1) == x + 1\n    assert calls\n")
    result = _assert("def add(a, b):\n    return a + b\n", tests, tmp_path)
    assert result["passed"], result["message"]


def test_a_programs_check_is_not_called_as_humaneval_check(tmp_path: Path) -> None:
    """MBPP has programs whose function is named `check`: the asserts call it; the harness does not call it with
    itself."""
    result = _assert("def check(n):\n    return n == 2 * int(str(n)[::-1]) - 1\n",
                     "assert check(73)\nassert not check(70)", tmp_path, entry_point="check")
    assert result["passed"], result["message"]


# ---- exceptions that are not Exceptions ----


@pytest.mark.parametrize("base", ["KeyboardInterrupt", "SystemExit", "GeneratorExit"])
def test_a_programs_exception_cannot_claim_a_base_exception_base(base: str, tmp_path: Path) -> None:
    """Its bases are the program's to say (a metaclass's __bases__ property): a stand-in of KeyboardInterrupt raised
    in a function-call case got past the harness's `except Exception`, run_tests raised, and the job was INTERNAL."""
    code = (f"class Meta(type):\n    @property\n    def __bases__(cls):\n        return ({base},)\n"
            "class Boom(Exception, metaclass=Meta):\n    pass\n"
            "def add(a, b):\n    raise Boom('no')\n")
    result = harness(code, tmp_path, fn_name="add", cases=[FunctionCase((1, 2), 3)])
    assert result["status"] == "runtime_error" and not result["passed"]
    _failed(_assert(code, "import pytest\nwith pytest.raises(Exception):\n    add(1, 2)\nassert add(1, 2) == 3",
                    tmp_path, entry_point="add"))


# ---- the harness's limits, chosen by the program ----


def test_a_refusal_python_would_make_too_is_not_the_harness_limit(tmp_path: Path) -> None:
    """Before: len() of the test's lambda (refused) made the wrong answer after it unsupported (masked)."""
    code = ("def apply(f, x):\n    for use in (len, bool, abs, hash):\n        try:\n            use(f)\n"
            "        except Exception:\n            pass\n    return 0\n")
    _failed(_assert(code, "assert apply(lambda v: v + 1, 1) == 2", tmp_path, entry_point="apply"))


def test_a_real_limit_of_the_harness_is_still_unsupported(tmp_path: Path) -> None:
    code = "def drain(q):\n    out = []\n    while not q.empty():\n        out.append(q.get())\n    return out\n"
    tests = "import queue\nq = queue.Queue()\nq.put(1)\nassert drain(q) == [1]"
    assert _assert(code, tests, tmp_path, entry_point="drain")["status"] == "unsupported"


FORGE = "import sys\nremote = sys.modules['sandboxd.verifiers.python.remote']\n"


def test_a_forged_unsupported_error_is_the_programs_failure(tmp_path: Path) -> None:
    code = FORGE + (
        "def _serve(self, request, op, args, kwargs):\n"
        "    return {'e': {'type': 'Unsupported', 'message': 'numpy is missing', 'unsupported': True}}\n"
        "remote.CandidateEndpoint._serve = _serve\n"
        "def f(x):\n    return 0\n")
    _failed(_assert(code, "assert f(1) == 2", tmp_path, entry_point="f"))


def test_a_forged_write_back_of_another_type_is_the_programs_failure(tmp_path: Path) -> None:
    """The program's process holds the test's list itself; only a forged frame sends it back as a dict, which made
    the failed assert unsupported."""
    code = FORGE + (
        "sync = remote.CandidateEndpoint.sync_held\n"
        "def sync_held(self, reply):\n    ids = list(self.held)\n    sync(self, reply)\n"
        "    reply['w'] = [[hid, {'$dict': []}] for hid in ids]\n"
        "remote.CandidateEndpoint.sync_held = sync_held\n"
        "def f(items):\n    return 0\n")
    result = _assert(code, "assert f([1, 2]) == 3", tmp_path, entry_point="f")
    assert result["status"] == "died" and not result["passed"]


# ---- the test's mocks and objects ----

SERVICE_TEST = ("from unittest.mock import Mock\nfrom solution import Service\n"
                "def test_save():\n    db = Mock()\n    Service(db).save(5)\n    CHECK\n")


@pytest.mark.parametrize(("save", "check"), [
    pytest.param("self.db.insert.assert_called_once_with = lambda *a, **k: None",
                 "db.insert.assert_called_once_with(5)", id="assert-method-replaced"),
    pytest.param("self.db.insert.configure_mock(assert_called_once_with=lambda *a: None)",
                 "db.insert.assert_called_once_with(5)", id="configure_mock"),
    pytest.param("self.db.insert = Anything()", "db.insert.assert_called_once_with(5)", id="child-replaced"),
    pytest.param("self.db.insert.called = True", "assert db.insert.called", id="called-flag"),
    pytest.param("self.db.insert.call_count = 1", "assert db.insert.call_count == 1", id="call-count"),
])
def test_a_program_cannot_rewrite_the_tests_mock(save: str, check: str, tmp_path: Path) -> None:
    """Before, each passed without calling `db.insert` (1.0)."""
    code = ("class Anything:\n    def __getattr__(self, name):\n        return lambda *a, **k: None\n"
            "class Service:\n    def __init__(self, db):\n        self.db = db\n"
            f"    def save(self, x):\n        {save}\n")
    _failed(_assert(code, SERVICE_TEST.replace("CHECK", check), tmp_path))


def test_a_program_uses_the_tests_mock_as_a_dependency(tmp_path: Path) -> None:
    code = ("class Service:\n    def __init__(self, db):\n        self.db = db\n"
            "    def save(self, x):\n        self.db.insert(x)\n        self.db.saved = True\n"
            "        return self.db.fetch(x)\n")
    tests = SERVICE_TEST.replace("CHECK", "db.insert.assert_called_once_with(5)\n    assert db.saved is True")
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result["message"]


def test_a_program_cannot_replace_a_test_objects_method(tmp_path: Path) -> None:
    tests = ("class Checker:\n    def __init__(self):\n        self.seen = []\n"
             "    def verify(self):\n        assert self.seen == [1, 2, 3]\n"
             "c = Checker()\nfeed(c)\nc.verify()\n")
    code = "def feed(checker):\n    checker.verify = lambda: None\n"
    _failed(_assert(code, tests, tmp_path, entry_point="feed"))


def test_a_program_still_links_the_tests_nodes(tmp_path: Path) -> None:
    """`while head:` of the test's Node asked len() of it (JudgeObject had __len__ only), which the judge refused:
    a correct program failed; and `if key:` of a test's callback."""
    tests = ("class Node:\n    def __init__(self, val, next=None):\n        self.val, self.next = val, next\n"
             "head = Node(1, Node(2, Node(3)))\nhead = reverse(head)\nout = []\n"
             "while head:\n    out.append(head.val)\n    head = head.next\nassert out == [3, 2, 1]\n")
    code = ("def reverse(head):\n    prev = None\n    while head:\n        nxt = head.next\n        head.next = prev\n"
            "        prev, head = head, nxt\n    return prev\n")
    result = _assert(code, tests, tmp_path, entry_point="reverse")
    assert result["passed"], result["message"]


# ---- numpy ----


def test_an_array_interface_of_the_program_cannot_point_numpy_at_the_judges_memory(tmp_path: Path) -> None:
    """Before: numpy read the made-up address of the object's __array_interface__ in the judge: SIGSEGV."""
    pytest.importorskip("numpy")
    code = ("class Fake:\n    @property\n    def __array_interface__(self):\n"
            "        return {'shape': (4,), 'typestr': '<i8', 'data': (16, False), 'version': 3}\n"
            "def f(n):\n    return Fake()\n")
    tests = "import numpy as np\nnp.testing.assert_array_equal(f(4), np.arange(4))"
    _failed(_assert(code, tests, tmp_path, entry_point="f"))


def test_an_object_with_array_still_converts(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    code = ("import numpy as np\nclass Grid:\n    def __array__(self, dtype=None, copy=None):\n"
            "        return np.arange(4)\ndef f(n):\n    return Grid()\n")
    result = _assert(code, "import numpy as np\nnp.testing.assert_array_equal(f(4), np.arange(4))", tmp_path,
                     entry_point="f")
    assert result["passed"], result["message"]


def test_a_program_tests_the_callback_it_was_given(tmp_path: Path) -> None:
    code = "def sort_by(items, key=None):\n    return sorted(items, key=key) if key else sorted(items)\n"
    result = _assert(code, "assert sort_by([3, -1, 2], key=abs) == [-1, 2, 3]\n"
                           "assert sort_by(['bb', 'a'], key=lambda s: len(s)) == ['a', 'bb']", tmp_path,
                     entry_point="sort_by")
    assert result["passed"], result["message"]


# ---- values that cost the judge ----


def test_a_decimal_of_a_huge_exponent_is_refused_not_converted(tmp_path: Path) -> None:
    """int() of Decimal("1E+10000000") (what a function-call case does to a Decimal answer) never ended in the judge;
    1E+1000000 took 52 s."""
    code = "from decimal import Decimal\ndef f(x):\n    return Decimal('1E+10000000') if x else Decimal('2.5')\n"
    result = harness(code, tmp_path, fn_name="f", cases=[FunctionCase((0,), 2.5), FunctionCase((1,), 3)],
                     call_timeout=30)
    assert [test["status"] for test in result["tests"]] == ["ok", "died"]


# ---- the shared folder ----


def test_share_files_follows_no_link_put_in_place_of_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The program may swap one of the judge's files in the job's folder for a link between share_files' look and
    its chmod (a thread of the program runs meanwhile): the chmod by name followed it to a file of the judge's
    outside the folder. The race is made here by answering the look with the file that was there."""
    import os

    from sandboxd.verifiers.python import remote as pyremote

    folder, outside = tmp_path / "job", tmp_path / "judges-own"
    folder.mkdir()
    outside.write_text("secret")
    outside.chmod(0o600)
    (folder / "was-a-file").write_text("")
    (folder / "was-a-file").chmod(0o600)
    looked = os.stat(folder / "was-a-file")
    (folder / "was-a-file").unlink()
    (folder / "was-a-file").symlink_to(outside)

    class Entry:
        name = "was-a-file"

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            return looked

    class Scan:
        def __init__(self, fd: int) -> None:
            pass

        def __enter__(self) -> list[Entry]:
            return [Entry()]

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(pyremote.os, "scandir", Scan)
    pyremote.share_files(str(folder))
    assert outside.stat().st_mode & 0o777 == 0o600


# ---- functions the tests patch, reached from the program ----

ENDPOINT = FORGE + ("import gc\n"
                    "endpoint = next(o for o in gc.get_objects() if isinstance(o, remote.CandidateEndpoint))\n")


def test_the_program_reaches_only_the_functions_the_tests_have_patched_now(tmp_path: Path) -> None:
    """A program's calls of a function the tests patched go to the tests' patch (remote.PATCHABLE_FUNCTIONS); a
    forged one of a function they did not patch, or of one outside the list, is refused: the program may not call
    the tests' real ones."""
    code = ENDPOINT + (
        "def probe():\n    out = []\n"
        "    for args in (['time.sleep', 0], ['os.system', 'true'], ['os.remove', '/tmp/x']):\n"
        "        try:\n            endpoint.ask('patched', args)\n            out.append('called')\n"
        "        except Exception as exc:\n            out.append(type(exc).__name__)\n"
        "    return out\n")
    tests = ("from unittest import mock\n"
             "assert probe() == ['PermissionError', 'ValueError', 'PermissionError']\n"
             "with mock.patch('time.sleep') as sleep:\n    assert probe()[0] == 'called'\n"
             "sleep.assert_called_once_with(0)\n"
             "assert probe()[0] == 'PermissionError'\n")
    result = _assert(code, tests, tmp_path, entry_point="probe")
    assert result["passed"], result["message"]


def test_a_patch_ends_for_the_program_when_it_ends_for_the_tests(tmp_path: Path) -> None:
    code = "import time\ndef now():\n    return time.time()\n"
    tests = ("from unittest import mock\nwith mock.patch('time.time', return_value=5.0):\n    assert now() == 5.0\n"
             "assert now() > 1e9\n")
    result = _assert(code, tests, tmp_path, entry_point="now")
    assert result["passed"], result["message"]


def test_a_wrong_program_cannot_answer_arithmetic_with_the_tests_value(tmp_path: Path) -> None:
    """HumanEval's `abs(candidate(x) - y) < 1e-6` against an object whose __sub__ returns 0.0: the program's
    failure (the harness does not take the answer), while arithmetic that gives the program's own object stands."""
    code = "class Zero:\n    def __sub__(self, other):\n        return 0.0\ndef mean(xs):\n    return Zero()\n"
    _failed(_assert(code, "assert abs(mean([1.0, 2.0]) - 1.5) < 1e-6", tmp_path, entry_point="mean"))
    money = ("class Money:\n    def __init__(self, c):\n        self.c = c\n"
             "    def __mul__(self, k):\n        return Money(self.c * k)\n"
             "    def __eq__(self, other):\n        return isinstance(other, Money) and other.c == self.c\n")
    result = _assert(money, "assert Money(5) * 2 == Money(10)\nassert (Money(5) * 2).c == 10", tmp_path,
                     entry_point="Money")
    assert result["passed"], result["message"]


def test_what_the_tests_make_of_arithmetic_with_their_value_is_not_answered_with_plain_data(tmp_path: Path) -> None:
    """The red team's second step: `-` gives an object of the program's, whose __abs__ (or __round__, __float__)
    then answers 0.0; `abs(candidate(x) - y) < 1e-6` and unittest's assertAlmostEqual passed."""
    code = ("class Z:\n    def __abs__(self):\n        return 0.0\n    def __round__(self, n=None):\n        return 0\n"
            "    def __float__(self):\n        return 0.0\n"
            "class A:\n    def __sub__(self, other):\n        return Z()\n    __rsub__ = __sub__\n"
            "def truncate(x):\n    return A()\n")
    for check in ("assert abs(truncate(3.5) - 0.5) < 1e-6", "assert round(truncate(3.5) - 0.5, 7) == 0",
                  "import math\nassert math.fabs(truncate(3.5) - 0.5) < 1e-6"):
        _failed(_assert(code, check, tmp_path, entry_point="truncate"))


def test_an_exception_carrying_an_int_past_str_s_limit_is_the_programs_failure(tmp_path: Path) -> None:
    """Its text cannot be written (int -> str stops at 4,300 digits): it was the judge's own error, INTERNAL."""
    code = "def f(*args):\n    raise KeyError(1 << 14500)\n"
    result = harness(code, tmp_path, "function", fn_name="f",
                     cases=[FunctionCase((1,), 1)])
    assert not result["passed"] and result["status"] == "runtime_error", result
    _failed(_assert(code, "assert f(1) == 1", tmp_path, entry_point="f"))


def test_a_programs_warning_names_no_file_of_the_judges(tmp_path: Path) -> None:
    """Showing a warning reads its line of its file: the program's file name would have the judge open /dev/zero
    (its memory without bound) or a FIFO (for good)."""
    code = ("import warnings\ndef f():\n    warnings.warn_explicit('x', UserWarning, '/dev/zero', 1)\n    return 1\n")
    result = _assert(code, "assert f() == 1", tmp_path, entry_point="f")
    assert result["passed"], result
