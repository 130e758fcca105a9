"""Code verifier: the pure parts, shared by the daemon and the sandbox agent.

Everything here is stdlib-only and side-effect free, because it is imported both
by the daemon (request validation) and inside the sandbox image (Debian
bookworm, Python 3.11, no third-party packages):

- :func:`extract_code` pulls the program out of a completion;
- :data:`LANGUAGES` / :func:`resolve_language` say how to build and run it;
- :func:`normalize_tests` turns the API's ``CodeTests`` or a dataset row given
  verbatim into one :class:`TestPlan`;
- :func:`compare_stdout` / :func:`compare_values` are the checkers, run in a
  trusted process, never in the candidate's;
- :func:`score` turns a pass count into a reward.

Modules, each importing only those listed before it:

- ``languages``: :class:`Language`, :data:`LANGUAGES`, :func:`resolve_language` and the toolchains' settings;
- ``extraction``: :func:`extract_code`;
- ``checkers``: :func:`compare_stdout` and :func:`compare_values`;
- ``plans``: :class:`TestPlan` and its cases (:class:`StdioCase`, :class:`FunctionCase`);
- ``assembly``: a completion made into the program to run (:func:`assemble_program`, :func:`program_assembly`,
  :func:`assemble`);
- ``normalize``: :func:`normalize_tests`, the API's tests and every dataset shape read into a plan;
- ``scoring``: :func:`score`.
"""

from __future__ import annotations

from .assembly import assemble, assemble_program, program_assembly
from .checkers import compare_stdout, compare_values
from .extraction import extract_code
from .languages import (
    CPP_FLAGS,
    GO_BUILD_CACHE,
    GO_ENV,
    JAVAC_CLASS_ARCHIVE,
    JAVAC_JIT_FLAGS,
    JAVAC_JVM_FLAGS,
    LANGUAGES,
    NODE_BLOCKING_STDIO,
    NODE_STACK_KIB,
    TS_TRANSFORM,
    Language,
    expand_env,
    resolve_language,
)
from .normalize import normalize_tests

# _SYNTAX_ERRORS and _parse are not public: sandboxd.verifiers.python.harness imports them from here.
from .plans import _SYNTAX_ERRORS as _SYNTAX_ERRORS
from .plans import FunctionCase, StdioCase, TestPlan
from .plans import _parse as _parse
from .scoring import score

__all__ = [
    "CPP_FLAGS",
    "GO_BUILD_CACHE",
    "GO_ENV",
    "JAVAC_CLASS_ARCHIVE",
    "JAVAC_JIT_FLAGS",
    "JAVAC_JVM_FLAGS",
    "LANGUAGES",
    "NODE_BLOCKING_STDIO",
    "NODE_STACK_KIB",
    "TS_TRANSFORM",
    "FunctionCase",
    "Language",
    "StdioCase",
    "TestPlan",
    "assemble",
    "assemble_program",
    "compare_stdout",
    "compare_values",
    "expand_env",
    "extract_code",
    "normalize_tests",
    "program_assembly",
    "resolve_language",
    "score",
]
