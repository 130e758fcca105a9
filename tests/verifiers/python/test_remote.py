"""The candidate's objects in the judge and the test's in the candidate: Python as one process would run it, and
the attacks on the new paths (each run for real: a candidate process and a judge joined by a socketpair)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from sandboxd.verifiers.python import remote as pyremote
from tests.verifiers.python.test_harness import harness

pytestmark = pytest.mark.timeout(60)


def _assert(code: str, tests: str, tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    return harness(code, tmp_path, "assert", assert_code=tests, **kwargs)


# ---------------------------------------------------------------------------
# Python as one process runs it
# ---------------------------------------------------------------------------

STACK = (
    "class EmptyError(IndexError):\n    pass\n"
    "class Stack:\n    LIMIT = 3\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n        return self\n"
    "    def pop(self):\n        if not self.items:\n            raise EmptyError('empty')\n"
    "        return self.items.pop()\n"
    "    def __len__(self):\n        return len(self.items)\n"
    "    def __iter__(self):\n        return iter(self.items)\n"
    "    def __contains__(self, x):\n        return x in self.items\n"
    "    def __getitem__(self, i):\n        return self.items[i]\n"
    "    def __eq__(self, other):\n        return isinstance(other, Stack) and self.items == other.items\n"
    "    def __repr__(self):\n        return f'Stack({self.items})'\n"
    "    @staticmethod\n    def of(*xs):\n        s = Stack()\n        for x in xs:\n            s.push(x)\n"
    "        return s\n"
)


@pytest.mark.parametrize(
    "tests",
    [
        "s = Stack().push(1).push(2)\nassert len(s) == 2 and list(s) == [1, 2] and 2 in s and s[0] == 1\n",
        "assert Stack.of(1, 2) == Stack().push(1).push(2) and Stack.of(1) != Stack.of(2)\n",
        "assert isinstance(Stack(), Stack) and not isinstance(5, Stack) and Stack.LIMIT == 3\n",
        "import pytest\nwith pytest.raises(EmptyError):\n    Stack().pop()\nwith pytest.raises(IndexError):\n"
        "    Stack().pop()\n",
        "s = Stack()\ns.items = [7]\nassert s.pop() == 7 and repr(s) == 'Stack([])' and str(s) == 'Stack([])'\n",
        "import solution\nassert solution.Stack.LIMIT == 3\nsolution.Stack.LIMIT = 5\nassert Stack.LIMIT == 5\n",
        "from solution import Stack as S\nassert sorted([S.of(2), S.of(1)], key=len) is not None\n",
    ],
    ids=["dunders", "equal-objects", "isinstance-class-attr", "own-exceptions", "set-attribute", "module-attrs",
         "key-builtin"],
)
def test_the_candidates_classes_answer_as_in_one_process(tests: str, tmp_path: Path) -> None:
    result = _assert(STACK, tests, tmp_path)
    assert result["passed"], result


@pytest.mark.parametrize(
    ("code", "tests"),
    [
        ("def squares(n):\n    for i in range(n):\n        yield i * i\n",
         "assert list(squares(4)) == [0, 1, 4, 9]\nassert sum(squares(3)) == 5\n"),
        ("import itertools\ndef naturals():\n    return itertools.count()\n",
         "import itertools\ng = naturals()\nassert next(g) == 0 and next(g) == 1\n"
         "assert list(itertools.islice(naturals(), 3)) == [0, 1, 2]\n"),
        ("def evens(xs):\n    return filter(lambda x: x % 2 == 0, xs)\ndef pairs(a, b):\n    return zip(a, b)\n",
         "assert list(evens(range(6))) == [0, 2, 4] and dict(pairs('ab', [1, 2])) == {'a': 1, 'b': 2}\n"),
        ("def broken():\n    yield 1\n    raise ValueError('two')\n",
         "import pytest\ng = broken()\nassert next(g) == 1\nwith pytest.raises(ValueError):\n    next(g)\n"),
        ("import numpy as np\ndef arr(n):\n    return np.arange(n) * 2\ndef total(a):\n    return a.sum()\n",
         "import numpy as np\nassert np.array_equal(arr(3), [0, 2, 4]) and arr(2).dtype == np.int64\n"
         "assert total(np.array([1, 2])) == 3 and isinstance(total(np.array([1])), np.integer)\n"),
        ("def rotate(m):\n    m[:] = [list(r) for r in zip(*m[::-1])]\n",
         "m = [[1, 2], [3, 4]]\nrow = m[0]\nrotate(m)\nassert m == [[3, 1], [4, 2]]\n"),
        ("def fill(d, s):\n    d['x'] = 1\n    s.add(2)\n",
         "d, s = {}, set()\nfill(d, s)\nassert d == {'x': 1} and s == {2}\n"),
        ("def apply(f, xs):\n    return [f(x) for x in xs]\ndef by(key, xs):\n    return sorted(xs, key=key)\n",
         "assert apply(lambda x: x + 1, [1, 2]) == [2, 3] and by(len, ['aaa', 'b']) == ['b', 'aaa']\n"
         "assert by(lambda s: s[-1], ['ab', 'ba']) == ['ba', 'ab']\n"),
        ("class Node:\n    def __init__(self, v, nxt=None):\n        self.v, self.nxt = v, nxt\n"
         "def reverse(head):\n    prev = None\n    while head:\n        head.nxt, prev, head = prev, head, head.nxt\n"
         "    return prev\n",
         "h = reverse(Node(1, Node(2, Node(3))))\nout = []\nwhile h:\n    out.append(h.v)\n    h = h.nxt\n"
         "assert out == [3, 2, 1]\n"),
        ("def ask():\n    return int(input('n? ')) * 2\ndef read_all():\n    import sys\n"
         "    return [int(x) for x in sys.stdin.read().split()]\n",
         "from unittest import mock\nimport io\nwith mock.patch('builtins.input', side_effect=['21']):\n"
         "    assert ask() == 42\nwith mock.patch('sys.stdin', io.StringIO('1 2 3')):\n"
         "    assert read_all() == [1, 2, 3]\n"),
        ("def greet(name):\n    print(f'hi {name}')\n",
         "import contextlib, io\nfrom unittest import mock\nbuf = io.StringIO()\n"
         "with contextlib.redirect_stdout(buf):\n    greet('a')\nassert buf.getvalue() == 'hi a\\n'\n"
         "with mock.patch('builtins.print') as p:\n    greet('b')\np.assert_called_once_with('hi b')\n"),
        ("def count_lines(path):\n    with open(path) as f:\n        return len(f.readlines())\n"
         "def write(path, text):\n    with open(path, 'w') as f:\n        f.write(text)\n",
         "import tempfile, os\nfd, p = tempfile.mkstemp()\nos.write(fd, b'a\\nb\\n')\nos.close(fd)\n"
         "assert count_lines(p) == 2\nwrite('out.txt', 'x')\nassert open('out.txt').read() == 'x'\n"
         "from unittest import mock\nwith mock.patch('builtins.open', mock.mock_open(read_data='1\\n2\\n3\\n')):\n"
         "    assert count_lines('anything') == 3\n"),
        ("from fractions import Fraction\nfrom decimal import Decimal\nimport datetime, collections\n"
         "P = collections.namedtuple('P', 'x y')\n"
         "def values():\n    return Fraction(1, 3), Decimal('0.1'), datetime.date(2024, 1, 2), P(1, 2), "
         "collections.deque([1]), {'a': 1}.keys(), range(3), collections.Counter('aab')\n",
         "from fractions import Fraction\nfrom decimal import Decimal\nimport datetime\n"
         "f, d, day, p, q, keys, r, c = values()\n"
         "assert f == Fraction(1, 3) and d == Decimal('0.1') and day.year == 2024 and p.y == 2\n"
         "assert q.popleft() == 1 and keys == {'a'} and r == range(3) and c.most_common(1) == [('a', 2)]\n"),
    ],
    ids=["generator", "infinite-iterator", "map-filter-zip", "iterator-error", "numpy", "in-place-nested",
         "in-place-dict-set", "callbacks", "linked-list", "input-and-stdin", "stdout-and-print", "files",
         "value-types"],
)
def test_values_iterators_callbacks_and_the_tests_environment(code: str, tests: str, tmp_path: Path) -> None:
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result


@pytest.mark.parametrize(
    ("code", "tests"),
    [
        ("class Animal:\n    pass\nclass Dog(Animal):\n    def speak(self):\n        return 'woof'\n"
         "def adopt():\n    return Dog()\n",
         "pet = adopt()\nassert type(pet) is Dog and isinstance(pet, Animal) and issubclass(Dog, Animal)\n"
         "assert pet.speak() == 'woof' and not isinstance(pet, int)\n"),
        ("import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\ndef favourite():\n    return Color.GREEN\n",
         "assert [c.name for c in Color] == ['RED', 'GREEN'] and len(Color) == 2\n"
         "assert favourite() is Color.GREEN and Color['RED'] is Color.RED and Color(2) is favourite()\n"),
        ("def chunks(xs, n):\n    for i in range(0, len(xs), n):\n        yield xs[i:i + n]\n",
         "import types, inspect\ng = chunks([1, 2, 3], 2)\n"
         "assert isinstance(g, types.GeneratorType) and inspect.isgenerator(g) and list(g) == [[1, 2], [3]]\n"),
        ("import numpy as np\ndef solve(a, b):\n    return np.linalg.solve(np.array(a), np.array(b))\n",
         "import numpy as np, pytest\nwith pytest.raises(np.linalg.LinAlgError):\n"
         "    solve([[1, 2], [2, 4]], [1, 2])\n"),
        ("class Catch:\n    def __enter__(self):\n        return self\n"
         "    def __exit__(self, kind, value, tb):\n        self.caught = value\n        return kind is KeyError\n",
         "with Catch() as c:\n    raise KeyError('k')\n"
         "assert isinstance(c.caught, KeyError) and c.caught.args == ('k',)\n"),
        ("def extend(xs, more):\n    xs.extend(more)\n    return xs\n",
         "lst = [1]\nout = extend(lst, [2])\nassert out is lst and lst == [1, 2]\n"),
        ("class Account:\n    def __init__(self, book):\n        self.book = book\n"
         "    def pay(self, n):\n        self.book['balance'] -= n\n        return self\n",
         "book = {'balance': 100}\nacct = Account(book)\nacct.pay(30)\nassert book == {'balance': 70}\n"
         "book['balance'] = 500\nacct.pay(1)\nassert book['balance'] == 499 and acct.book == {'balance': 499}\n"),
        ("def bump(d):\n    d['n'] += 1\n    raise ValueError('after the change')\n",
         "import pytest\nd = {'n': 1}\nwith pytest.raises(ValueError):\n    bump(d)\nassert d == {'n': 2}\n"),
        ("import os, sys\ndef mode():\n    return os.environ.get('MODE', 'none')\ndef where():\n"
            "    return os.getcwd()\n"
         "def args():\n    return sys.argv[1:]\n",
         "import os, sys\nfrom unittest import mock\n"
         "def test_env(monkeypatch, tmp_path):\n    assert mode() == 'none'\n    monkeypatch.setenv('MODE', 'debug')\n"
         "    assert mode() == 'debug'\n    monkeypatch.chdir(tmp_path)\n    assert where() == str(tmp_path)\n"
         "    with mock.patch.object(sys, 'argv', ['prog', '-v']):\n        assert args() == ['-v']\n"
         "def test_restored():\n    assert mode() == 'none'\n"),
        ("import logging\nlog = logging.getLogger('app')\ndef warn(x):\n    log.warning('bad %s', x)\n"
         "    log.info('detail')\n",
         "import logging\ndef test_logs(caplog):\n    warn(1)\n    assert caplog.messages == ['bad 1']\n"
         "    caplog.clear()\n    caplog.set_level(logging.INFO)\n    warn(2)\n"
         "    assert caplog.record_tuples == [('app', logging.WARNING, 'bad 2'), ('app', logging.INFO, 'detail')]\n"
         "    assert 'bad 2' in caplog.text\n"),
        ("class Robot:\n    count = 0\n    def __init__(self):\n        Robot.count += 1\n",
         "import solution\ndef setup_function():\n    solution.Robot.count = 0\ndef teardown_function(function):\n"
         "    solution.Robot.count = -1\ndef test_one():\n    Robot()\n    assert Robot.count == 1\n"
         "def test_two():\n    Robot()\n    Robot()\n    assert Robot.count == 2\n"
         "class TestRobots:\n    @classmethod\n    def setup_class(cls):\n        cls.made = []\n"
         "    def setup_method(self):\n        solution.Robot.count = 10\n    def test_three(self):\n        Robot()\n"
         "        assert Robot.count == 11\n"),
    ],
    ids=["type-is-the-class", "enum-class", "generator-type", "library-exception", "exit-gets-the-exception",
         "returned-argument-is-itself", "container-kept-by-an-object", "write-back-after-an-error",
         "environment-cwd-argv", "caplog", "xunit-setups"],
)
def test_identity_environment_and_pytest_as_in_one_process(code: str, tests: str, tmp_path: Path) -> None:
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result


def test_a_skiptest_raised_by_the_program_skips_nothing(tmp_path: Path) -> None:
    code = "import unittest, pytest\ndef f():\n    raise unittest.SkipTest('no')\ndef g():\n    pytest.skip('no')\n"
    for call in ("f()", "g()"):
        tests = f"import unittest\nclass T(unittest.TestCase):\n    def test_it(self):\n        assert {call} == 1\n"
        result = _assert(code, tests, tmp_path)
        assert not result["passed"] and result["status"] in ("runtime_error", "wrong_answer", "died"), result


def test_pytest_fixtures_the_tests_define_and_pytests_own(tmp_path: Path) -> None:
    code = ("def total(path):\n    return sum(int(x) for x in open(path).read().split())\ndef shout(s):\n"
        "    print(s.upper())\n")
    tests = (
        "import pytest\nfrom solution import total, shout\n"
        "@pytest.fixture\ndef numbers():\n    return [1, 2, 3]\n"
        "@pytest.fixture\ndef data_file(tmp_path, numbers):\n    p = tmp_path / 'n.txt'\n"
        "    p.write_text(' '.join(map(str, numbers)))\n    yield p\n    p.unlink()\n"
        "@pytest.fixture(params=[1, 2])\ndef factor(request):\n    return request.param\n"
        "def test_total(data_file):\n    assert total(data_file) == 6\n"
        "def test_str_path(data_file, factor):\n    assert total(str(data_file)) * factor == 6 * factor\n"
        "def test_shout(capsys):\n    shout('hi')\n    assert capsys.readouterr().out == 'HI\\n'\n"
        "def test_patch(monkeypatch):\n    monkeypatch.setattr('builtins.input', lambda *a: '5')\n"
        "    assert input() == '5'\n"
        "    assert total.__name__ == 'total'\n"
    )
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result
    wrong = code.replace("sum(", "1 + sum(")
    assert _assert(wrong, tests, tmp_path)["status"] == "wrong_answer"


def test_a_module_function_patched_by_the_tests_is_the_mock_in_the_program(tmp_path: Path) -> None:
    code = "import random\ndef roll():\n    return random.randint(1, 6)\ndef twice():\n    return 2 * roll()\n"
    tests = (
        "from unittest import mock\nimport solution\n"
        "with mock.patch('solution.roll', return_value=3):\n    assert solution.twice() == 6\n"
        "assert 2 <= solution.twice() <= 12\n"
    )
    assert _assert(code, tests, tmp_path)["passed"]


def test_a_large_argument_reaches_the_candidate(tmp_path: Path) -> None:
    code = "def biggest(xs):\n    return max(xs)\n"
    tests = "data = list(range(3_000_000))\nassert biggest(data) == 2_999_999\n"
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result


# ---------------------------------------------------------------------------
# Attacks on the new paths
# ---------------------------------------------------------------------------

ALWAYS_EQUAL = (
    "class Yes:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
    "        return False\n"
    "    def __lt__(self, other):\n        return True\n    __le__ = __gt__ = __ge__ = __lt__\n"
    "    def __hash__(self):\n        return 1\n    def __bool__(self):\n        return True\n"
)


@pytest.mark.parametrize(
    "tests",
    [
        "assert f() == 3",
        "assert 3 == f()",
        "assert f() == [1, 2]",
        "assert [f()] == [3]",
        "assert not (f() != 3)",
        "assert f() in {1, 2, 3}",
        "assert f() in [3]",
        "assert {'a': f()} == {'a': 3}",
        "assert f() >= 3 and f() <= 3",
        "import numpy as np\nassert np.array_equal(f(), [3])",
        "assert sorted([f(), 1]) == [1, 3]",
        "import unittest\nunittest.TestCase().assertEqual(f(), 3)",
        "obj = f()\nobj2 = f()\nassert obj == obj2 and obj == 3",
    ],
)
def test_an_always_equal_object_returned_by_reference_equals_no_value_of_the_tests(tests: str,
                                                                                   tmp_path: Path) -> None:
    result = _assert(ALWAYS_EQUAL + "def f():\n    return Yes()\n", tests + "\n", tmp_path)
    assert not result["passed"], result


def test_an_always_equal_object_written_back_into_an_argument_equals_nothing(tmp_path: Path) -> None:
    code = ALWAYS_EQUAL + "def sort_in_place(a):\n    a[:] = [Yes()] * len(a)\n"
    tests = "expected = [1, 2, 3]\na = [3, 1, 2]\nsort_in_place(a)\nassert a == expected\n"
    result = _assert(code, tests, tmp_path)
    assert not result["passed"] and result["status"] == "wrong_answer", result
    # Only what the call was given comes back: the tests' expected list is nobody's to rewrite.
    code = "def sort_in_place(a):\n    a.sort()\n    a.append(99)\n"
    result = _assert(code, "expected = [1, 2, 3]\na = [3, 1, 2]\nsort_in_place(a)\nassert a == expected\n", tmp_path)
    assert not result["passed"], result


def test_a_forged_write_back_of_what_the_call_was_not_given_breaks_the_protocol(tmp_path: Path) -> None:
    code = ("import sys\nr = sys.modules['sandboxd.verifiers.python.remote']\n_serve = r.CandidateEndpoint._serve\n"
            "def serve(self, request, op, args, kwargs):\n    reply = _serve(self, request, op, args, kwargs)\n"
            "    reply['w'] = [[5, [1, 2, 3]]]\n    return reply\nr.CandidateEndpoint._serve = serve\n"
            "def f(a):\n    return 0\n")
    result = _assert(code, "expected = [9]\nassert f([1]) == 0 and expected == [9]\n", tmp_path)
    assert result["status"] == "died" and "write-back" in result["message"], result


@pytest.mark.parametrize(
    "probe",
    ["cb.__globals__", "cb.__closure__", "cb.__code__", "cb.__self__", "cb.__dict__", "cb.__class__",
     "cb.gi_frame", "cb.f_back", "cb.__wrapped__", "cb.__call__", "cb.func", "cb.__reduce__()",
     "cb.__getattribute__('__globals__')", "type(cb).__getattr__(cb, '__globals__')",
     "cb.gi_frame.f_back.f_locals", "gen.gi_frame", "gen.gi_code", "gen.__next__.__self__"],
)
def test_a_callback_or_generator_of_the_tests_reaches_nothing_of_the_judge(probe: str, tmp_path: Path) -> None:
    """The candidate holds only a stand-in for what a test handed it: a call, iteration, nothing else."""
    code = ("def probe(cb, gen):\n    try:\n"
            f"        found = {probe}\n    except Exception as exc:\n        return 'refused: ' + type(exc).__name__\n"
            "    try:\n        return repr(found)[:100]\n    except Exception:\n        return 'unprintable'\n")
    tests = ("expected = [4, 2]\ngen = (x for x in expected)\nresult = probe(lambda x: expected, gen)\n"
             "assert isinstance(result, str) and 'expected' not in result and '4, 2' not in result, result\n"
             "assert result.startswith('refused') or result.startswith('<') or result == 'unprintable', result\n")
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result


def test_a_callback_kept_past_its_test_is_refused(tmp_path: Path) -> None:
    code = ("kept = []\ndef keep(cb):\n    kept.append(cb)\n    return cb(1)\n"
            "def reuse():\n    try:\n        return kept[0](2)\n    except Exception as exc:\n"
            "        return type(exc).__name__\n")
    tests = ("from solution import keep, reuse\n"
             "def test_first():\n    assert keep(lambda x: x * 10) == 10\n"
             "def test_second():\n    assert reuse() == 'ReferenceError'\n")
    result = _assert(code, tests, tmp_path)
    assert result["passed"], result


def test_a_context_manager_of_the_candidates_cannot_swallow_a_failed_assertion(tmp_path: Path) -> None:
    code = ("class Quiet:\n    def __enter__(self):\n        return self\n    def __exit__(self, *exc):\n"
        "        return True\n")
    tests = "with Quiet():\n    assert 1 == 2\n"
    result = _assert(code + "def f():\n    return 1\n", tests + "assert f() == 1\n", tmp_path)
    assert not result["passed"] and result["status"] == "wrong_answer", result
    # Other exceptions it may swallow, as Python lets it.
    assert _assert(code + "def f():\n    return 1\n", "with Quiet():\n    raise KeyError(1)\nassert f() == 1\n",
                   tmp_path)["passed"]


@pytest.mark.parametrize(
    ("dunder", "tests"),
    [
        ("__len__ = lambda self: 3", "assert f() == [1, 2, 3]"),
        ("__iter__ = lambda self: iter([1, 2, 3])", "assert f() == [1, 2, 3]"),
        ("__int__ = lambda self: 3\n    __index__ = __int__", "assert f() == 3"),
        ("__float__ = lambda self: 3.0", "assert abs(f() - 3.0) < 1e-9"),
        ("__str__ = lambda self: 'abc'\n    __repr__ = __str__", "assert f() == 'abc'"),
        ("__hash__ = lambda self: hash(3)", "assert f() in {3}"),
        ("__bool__ = lambda self: False", "assert f() is False"),
        ("def __getattr__(self, name):\n        return lambda *a: True", "assert f() == {1, 2}"),
    ],
)
def test_dunders_that_lie_compared_with_plain_values_fail(dunder: str, tests: str, tmp_path: Path) -> None:
    code = f"class Liar:\n    {dunder}\ndef f():\n    return Liar()\n"
    result = _assert(code, tests + "\n", tmp_path)
    assert not result["passed"], result


def test_open_reaches_the_judge_only_while_a_test_patches_it(tmp_path: Path) -> None:
    """Unpatched, the program's open is its own, under its own uid; patched, the test's mock answers."""
    secret = tmp_path / "judge-only.txt"
    secret.write_text("expected answer")
    code = f"def peek():\n    return open({str(secret)!r}).read()\n"
    tests = "from unittest import mock\nwith mock.patch('builtins.open', mock.mock_open(read_data='mocked')):\n" \
            "    assert peek() == 'mocked'\n"
    assert _assert(code, tests, tmp_path)["passed"]


def test_unsupported_values_are_the_harnesss_not_the_models(tmp_path: Path) -> None:
    """What the harness cannot hand over is an 'unsupported' verdict (not the model's failure score)."""
    code = "def first_line(f):\n    return f.readline()\n"
    tests = "import sys\nassert first_line(sys) == ''\n"  # a module: never handed to the candidate
    result = _assert(code, tests, tmp_path)
    assert result["status"] == "unsupported", result


@pytest.mark.skipif(os.geteuid() != 0, reason="two uids need root")
def test_share_files_makes_only_this_uids_entries_usable_and_follows_no_link(tmp_path: Path) -> None:
    from sandboxd.verifiers.python.remote import share_files

    folder = tmp_path / "job"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "mine.txt").write_text("x")
    (folder / "other.txt").write_text("y")
    os.chown(folder / "other.txt", 4242, 4242)
    os.chmod(folder / "other.txt", 0o600)
    outside = tmp_path / "outside.txt"
    outside.write_text("z")
    os.chmod(outside, 0o600)
    (folder / "link").symlink_to(outside)
    os.chmod(folder / "sub" / "mine.txt", 0o600)
    share_files(str(folder))
    assert (folder / "sub" / "mine.txt").stat().st_mode & 0o777 == 0o666
    assert (folder / "sub").stat().st_mode & 0o777 == 0o777
    assert (folder / "other.txt").stat().st_mode & 0o777 == 0o600
    assert outside.stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="two uids need root")
def test_share_files_reads_a_folder_again_when_it_changed_within_the_clocks_step(tmp_path: Path) -> None:
    """A folder is read only when its mtime moved or moved lately: files made within one coarse clock tick of the
    last reading (the same mtime) are still shared."""
    from sandboxd.verifiers.python.remote import share_files

    folder = tmp_path / "job"
    folder.mkdir()
    for index in range(5):
        made = folder / f"f{index}"
        made.write_text("x")
        os.chmod(made, 0o600)
        share_files(str(folder))
        assert made.stat().st_mode & 0o777 == 0o666, index
    (folder / "sub").mkdir()
    (folder / "sub" / "deep").write_text("y")
    os.chmod(folder / "sub" / "deep", 0o600)
    share_files(str(folder))
    assert (folder / "sub" / "deep").stat().st_mode & 0o777 == 0o666


@pytest.mark.skipif(os.geteuid() != 0, reason="two uids need root")
def test_share_files_reads_an_untouched_folder_only_once_an_entry_is_made(tmp_path: Path) -> None:
    """A folder the agent marked as made empty (UNTOUCHED_FOLDER_MTIME_NS) is not read; the first entry made in it
    moves its mtime, and from then on it is shared as any other."""
    from sandboxd.verifiers.python import remote as pyremote

    folder = tmp_path / "job"
    folder.mkdir()
    hidden = folder / "hidden"
    hidden.write_text("x")
    os.chmod(hidden, 0o600)
    # The mark on a folder that holds a file (only a program hiding its own files from its tests does that): not read.
    os.utime(folder, ns=(pyremote.UNTOUCHED_FOLDER_MTIME_NS, pyremote.UNTOUCHED_FOLDER_MTIME_NS))
    for _ in range(3):
        pyremote.share_files(str(folder))
    assert hidden.stat().st_mode & 0o777 == 0o600, "an untouched folder was read"
    made = folder / "made"
    made.write_text("y")
    os.chmod(made, 0o600)
    pyremote.share_files(str(folder))
    assert made.stat().st_mode & 0o777 == 0o666
    assert hidden.stat().st_mode & 0o777 == 0o666


def test_the_agent_marks_a_folder_untouched_as_the_harness_reads_the_mark() -> None:
    from sandboxd.agent.host import jobhost
    from sandboxd.verifiers.python import remote as pyremote

    assert jobhost.UNTOUCHED_FOLDER_MTIME_NS == pyremote.UNTOUCHED_FOLDER_MTIME_NS


@pytest.mark.parametrize("call_timeout", [1.0, None], ids=["a-call", "the-time-for-all"])
def test_a_deadline_given_up_on_says_whether_the_candidate_was_kept_off_past_the_stretch(
        monkeypatch: pytest.MonkeyPatch, call_timeout: float | None) -> None:
    """A deadline moves by the candidate's CPU credit up to the stretch; the judge that gives up on it says whether
    the credit grew further (the candidate did not have its time: its agent retries it rather than charge it)."""
    clock, credit = [100.0], [0.0]
    monkeypatch.setattr(pyremote, "_monotonic", lambda: clock[0])
    ours, theirs = socket.socketpair()
    with ours, theirs:
        remote = pyremote.JudgeEndpoint(ours, 1 << 20, call_timeout, deadline=None if call_timeout else 101.0,
                                        cpu_credit=lambda: credit[0], deadline_stretch=3.0)
        ends = remote._deadline()
        assert ends is not None and ends() == 101.0
        clock[0], credit[0] = 101.5, 1.0  # it waited for a CPU 1 s of its 1.5
        assert ends() == 102.0 and not remote.time_up()
        clock[0], credit[0] = 103.5, 2.5  # and 2.5 s of its 3.5: the deadline moved by 2 s and no further
        assert ends() == 103.0 and remote.past_stretch is False
        gave_up = pyremote.CandidateTimeout("no answer") if call_timeout else pyremote.TestsTimeUp("time up")
        with pytest.raises(pyremote.CandidateTimeout):
            remote._break(gave_up)
        assert remote.past_stretch is True
        # One that waited no more than the stretch covers had its time.
        clock[0], credit[0] = 100.0, 0.0
        remote = pyremote.JudgeEndpoint(ours, 1 << 20, call_timeout, deadline=None if call_timeout else 101.0,
                                        cpu_credit=lambda: credit[0], deadline_stretch=3.0)
        ends = remote._deadline()
        clock[0], credit[0] = 102.0, 1.0
        assert ends is not None and ends() == 102.0
        with pytest.raises(pyremote.CandidateTimeout):
            remote._break(gave_up)
        assert remote.past_stretch is False
