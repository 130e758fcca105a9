"""The candidate's side of the two-process harness: the program run as the module ``solution``, answering the
judge's requests (:func:`serve_candidate`), with the names LeetCode's environment imports for a solution
(:data:`IMPLICIT_IMPORTS`) and the callable a function-call test names (``_resolve``).

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import bisect  # noqa: F401 - this and the other F401s: warmed in the zygote for IMPLICIT_IMPORTS
import contextlib
import copy  # noqa: F401
import datetime  # noqa: F401
import heapq  # noqa: F401
import json  # noqa: F401
import operator  # noqa: F401
import os
import random  # noqa: F401
import re  # noqa: F401
import socket
import statistics  # noqa: F401
import string  # noqa: F401
import sys
import types
from collections.abc import Mapping
from typing import Any, NoReturn

from ..code import assemble
from .remote import CandidateEndpoint, describe
from .wire import MAX_FRAME_BYTES, ProtocolError

# What the judge may send the candidate in one frame: the dataset's own data, which a performance test
# makes large (3 million ints are 24 MB of JSON). The candidate's own memory limit bounds what it decodes.
CANDIDATE_FRAME_BYTES = 1 << 30


# Name of the candidate's module: not "__main__", so that a completion's
# `if __name__ == "__main__":` block (reading stdin, unittest.main() which
# calls sys.exit) does not run, as in HumanEval's and LiveCodeBench's harnesses.
# Also the name under which the tests import it (KodCode's `from solution import f`).
CANDIDATE_MODULE = "solution"


# LeetCode's Python environment, and the graders of the datasets drawn from it (LiveCodeBench's
# testing_util, TACO's, DeepCoder's and verl's), put these names in a solution's namespace before
# it runs: a solution that uses defaultdict, heappush, bisect_left, inf or @cache without importing
# it is correct there, and without them fails here with a NameError. Function-call tests give the candidate the
# same names (LiveCodeBench's import_string, less its recursion limit); the name a test calls must
# still be the program's own (see _resolve). The modules are imported below as well, so that the
# code sandboxes' zygote holds them and a job's star imports only copy names.
IMPLICIT_IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\n"
    "import copy\nimport math\nimport random\nimport statistics\nimport itertools\nimport functools\n"
    "import operator\nimport io\nimport sys\nimport json\n"
)
# Compiled once, in the zygote: 0.07 ms of each function-call job's 0.14 ms for these imports (measured on the host).
_IMPLICIT_IMPORTS_CODE = compile(IMPLICIT_IMPORTS, "<implicit imports>", "exec")


# What IMPLICIT_IMPORTS bound in this candidate's module, by name (set by _serve).
_implicit_names: dict[str, object] = {}


def _resolve(target: str, namespace: dict[str, Any]) -> Any:
    """The callable a function-call test names: a top-level name, ``Class.method`` (on a fresh instance, as
    LeetCode's judge does) or a method of a top-level ``Solution`` class.

    A name still bound to what IMPLICIT_IMPORTS bound is not the program's: the tests of a
    gcd or sqrt that the program never wrote must not call math's (nor would a program's own
    `from math import gcd` pass them).
    """
    if not all(part.isidentifier() for part in target.split(".")):
        raise ProtocolError(f"bad call target {target!r}")
    name = target.partition(".")[0]
    if name in _implicit_names and namespace.get(name) is _implicit_names[name]:
        namespace = {key: value for key, value in namespace.items() if key != name}
    if "." in target:
        class_name, _, method = target.partition(".")
        if "." in method:
            raise ProtocolError(f"bad call target {target!r}")
        cls = namespace.get(class_name)
        if not isinstance(cls, type):
            raise NameError(f"no top-level class {class_name!r}")
        return getattr(cls(), method)
    if target in namespace:
        return namespace[target]
    solution = namespace.get("Solution")
    # LeetCode-style datasets (LiveCodeBench functional tests) name the method only.
    if isinstance(solution, type) and hasattr(solution, target):
        return getattr(solution(), target)
    raise NameError(f"name {target!r} is not defined")
def end_if_forked(own_pid: int) -> None:
    """End here, silently, if this is a child the candidate forked (os.fork) that came back into our loop.

    Parent and child share the channel: the child's frames would interleave
    with its parent's, and a correct program that forks would be scored on
    its child's answers, or on none. The child ends as it would have at the end
    of ``python main.py``: its output flushed, exit status 0.
    """
    if os.getpid() != own_pid:
        _flush_stdio()
        os._exit(0)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        # The candidate may have replaced or closed them.
        with contextlib.suppress(BaseException):
            stream.flush()



def _serve(code: str, channel: socket.socket, max_frame_bytes: int, assembly: Mapping[str, str] | None,
           implicit_imports: bool = False, files: str = "") -> int:
    own_pid = os.getpid()
    module = types.ModuleType(CANDIDATE_MODULE)
    module.__file__ = "<solution>"
    # Registered so that dataclasses, typing.get_type_hints and pickle find it.
    sys.modules[CANDIDATE_MODULE] = module
    namespace = module.__dict__
    endpoint = CandidateEndpoint(channel, max_frame_bytes, CANDIDATE_FRAME_BYTES, namespace,
                                 lambda target: _resolve(target, namespace), own_pid=own_pid, files=files)
    # Whatever fd 0 is, input() reads the test's stdin (empty unless a test patches it), never blocks.
    endpoint.install()
    try:
        if implicit_imports:
            before = set(namespace)
            exec(_IMPLICIT_IMPORTS_CODE, namespace)
            _implicit_names.update((name, namespace[name]) for name in namespace if name not in before)
        if assembly is not None:
            code = assemble(code, assembly)  # a MemoryError here is the program's load error too
        exec(compile(code, "<solution>", "exec"), namespace)
    except BaseException as exc:  # SystemExit at import time is a failed load, not a success
        end_if_forked(own_pid)
        endpoint.send({"load_error": describe(exc)})
        return 1
    end_if_forked(own_pid)
    endpoint.send({"ready": True, **endpoint.definitions()})
    while True:
        try:
            request = endpoint.receive()
        except EOFError:
            return 0
        if "q" not in request:
            raise ProtocolError("a frame that is not a request")
        # A child the program forked that returns here ends in send (CandidateEndpoint.own_pid), before it writes.
        endpoint.send(endpoint.serve(request))


def serve_candidate(code: str, channel: socket.socket, *, max_frame_bytes: int = MAX_FRAME_BYTES,
                    assembly: Mapping[str, str] | None = None, implicit_imports: bool = False,
                    files: str = "") -> NoReturn:
    """Run the candidate's program and answer requests on ``channel`` until end of file.

    With ``assembly`` (a HumanEval prompt's, from
    :func:`~sandboxd.verifiers.code.program_assembly`), the program is first
    made of ``code`` by :func:`~sandboxd.verifiers.code.assemble`, as the
    judge makes it. Executes the program (compiled with filename
    ``"<solution>"``) as the body of a fresh module named ``"solution"``
    (so ``if __name__ == "__main__":`` blocks do not run), with its stdio
    and ``input()`` the test's (see the module docstring). Sends
    ``{"ready": true}``, or ``{"load_error": ...}`` if the program raised
    (``SyntaxError`` and ``SystemExit`` included), then serves requests
    (remote.CandidateEndpoint). With ``implicit_imports`` (function-call
    tests), IMPLICIT_IMPORTS runs in the module first, as LeetCode's
    environment does. ``files``: the job's folder, the program's working
    directory, which it shares with its tests (remote.share_files).
    Exceptions of requests are answered as errors; a
    ``BaseException`` that is not an ``Exception`` ends the process.

    Never returns: the process ends with ``os._exit`` (0 after end of file,
    1 after a failed load or any other way out), so nothing the parent
    process registered (atexit, buffered files) runs in this one.
    """
    status = 1
    try:
        status = _serve(code, channel, max_frame_bytes, assembly, implicit_imports, files)
    except BaseException:  # whatever happened, the test process sees "candidate gone"
        status = 1
    finally:
        _flush_stdio()
        os._exit(status)
