"""Two-process harness for Python function-call and assert tests.

The candidate's code and the tests never share a process:

- the **candidate process** runs :func:`serve_candidate`: it executes the
  candidate's program, then answers requests over a connected ``AF_UNIX``
  ``SOCK_STREAM`` socket until end of file;
- the **test process** (the judge: another uid; it never runs candidate code)
  runs :func:`run_tests`: it runs the dataset's tests, whose calls of the
  candidate's functions, classes and objects become requests (remote), and
  judges what comes back itself.

Values cross the channel by value, rebuilt on the other side from its own
classes (wire): a list, a numpy array, a ``Fraction`` or a namedtuple
that the candidate returns is the judge's own when the test compares it, so
nothing the candidate does in its own process (a lying ``__eq__``, patched
builtins or ``AssertionError``, ``sys.exit(0)``, printing "All tests
passed") can make a test pass, and the expected values never enter the
candidate's process. Everything else crosses by reference (remote): the
candidate's objects are answered by the candidate (``len(stack)``, ``node.next``),
compared only with its own objects; the test's callbacks, mocks and buffers
by the judge, within the rules remote states.

The first frame from the candidate is ``{"ready": true}`` or
``{"load_error": {"type": str, "message": str}}`` (then the candidate
exits). Tests that import the candidate as a module (KodCode and other
pytest-style datasets: ``from solution import f``, ``import solution``) get,
while they run, a module named ``solution`` in the test process whose
attributes are read from the candidate's (see :func:`_candidate_module`); the
candidate's code is never imported there. What the candidate prints during a
call is printed in the judge when the call returns (``redirect_stdout`` and
``capsys`` see it); ``input()`` and ``sys.stdin`` read the test's (empty
unless it patches them); a test that patches ``builtins.print`` or
``builtins.open`` is obeyed by the candidate's.

End of file on the socket means the candidate is gone: the call in flight and
every later one fail. ``SystemExit`` (or any other ``BaseException`` that is
not an ``Exception``) raised by a call ends the candidate process, as it would
end a program.

This module is the harness's public face: it re-exports what the agent, the
daemon and the tests use. Its parts, each importing only those before it:

- ``candidate``: the candidate's side (:func:`serve_candidate`, the implicit
  imports, the callable a function-call test names);
- ``pytest_emulation``: pytest's way of running a module's tests (marks,
  fixtures, xunit setups, ``unittest`` cases), for the judge;
- ``judge``: the judge's side (:func:`run_tests`, :func:`top_level_names`);
- ``warmup``: the zygote's warm-up (:func:`warm`), which runs both sides.

The zygote warms this module (pool.WARM_MODULES) and calls its :func:`warm`.

Stdlib only: this module runs inside the sandbox image (pytest, where a
dataset's tests import it, comes from the image).
"""

from __future__ import annotations

# The names listed in __all__, and (as X as X) the other public names harness.py defined before its split.
from .candidate import CANDIDATE_FRAME_BYTES, serve_candidate
from .candidate import CANDIDATE_MODULE as CANDIDATE_MODULE
from .candidate import IMPLICIT_IMPORTS as IMPLICIT_IMPORTS
from .candidate import end_if_forked as end_if_forked
from .judge import COMPILED_TESTS_CACHED as COMPILED_TESTS_CACHED
from .judge import COMPILED_TESTS_MAX_CHARS as COMPILED_TESTS_MAX_CHARS
from .judge import CUT_MESSAGE_CHARS as CUT_MESSAGE_CHARS
from .judge import MAX_ITERATOR_ITEMS as MAX_ITERATOR_ITEMS
from .judge import NAMES_BOUND_CACHED as NAMES_BOUND_CACHED
from .judge import VALUE_TOO_LARGE as VALUE_TOO_LARGE
from .judge import VERDICT_MESSAGES_LIMIT as VERDICT_MESSAGES_LIMIT
from .judge import run_tests, top_level_names
from .remote import (
    TIME_UP_MESSAGE,
    CandidateDied,
    CandidateError,
    CandidateTimeout,
    TestsTimeUp,
    TooLargeForJudge,
)
from .warmup import WARM_UP_RUNS as WARM_UP_RUNS
from .warmup import warm
from .wire import (
    MAX_BIGINT_BITS,
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    MAX_INT_BITS,
    FrameTooLarge,
    ProtocolError,
    RejectedValue,
    decode_value,
    encode_value,
    recv_frame,
    send_frame,
)

__all__ = [
    "CANDIDATE_FRAME_BYTES",
    "MAX_BIGINT_BITS",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "MAX_INT_BITS",
    "TIME_UP_MESSAGE",
    "CandidateDied",
    "CandidateError",
    "CandidateTimeout",
    "FrameTooLarge",
    "ProtocolError",
    "RejectedValue",
    "TestsTimeUp",
    "TooLargeForJudge",
    "decode_value",
    "encode_value",
    "recv_frame",
    "run_tests",
    "send_frame",
    "serve_candidate",
    "top_level_names",
    "warm",
]
