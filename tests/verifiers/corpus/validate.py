"""Run corpus cases under real pytest, program and tests in one process, as a dataset's own runner does.

``python -m tests.verifiers.corpus.validate KIND OUT [ID...]`` writes one JSON line per case to OUT:
``{"id", "exit": pytest's exit status, "passed", "failed", "skipped", "errors"}``. Independent of sandboxd's
harness: each case's files (:func:`~tests.verifiers.corpus.pytest_files`) go to a fresh directory, and a
forked child runs ``pytest.main`` there (fork: pytest and numpy are imported once, and whatever a case does to
its process, ``os._exit`` included, ends with its child). ``exit`` is what a runner that reads pytest's exit
status sees (KodCode's).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# Plugins installed beside pytest (asyncio, timeout) are not loaded: the sandbox image has pytest alone.
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"

import numpy  # noqa: F401 - imported once here, before the forks
import pytest

from tests.verifiers.corpus import Case, load, pytest_files

# Children at once: the machine's CPUs, at most 4.
PARALLEL = max(1, min(4, os.cpu_count() or 1))


class _Counts:
    """A pytest plugin that counts outcomes and writes them when the session ends."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" and report.passed:
            self.counts["passed"] += 1
        elif report.failed:
            self.counts["failed" if report.when == "call" else "errors"] += 1
        elif report.skipped:
            self.counts["skipped"] += 1

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.counts["errors"] += 1

    def pytest_sessionfinish(self) -> None:
        Path(self.path).write_text(json.dumps(self.counts))


# Quiet, no cache, no configuration file of ours.
_ARGS = ["-q", "-p", "no:cacheprovider", "-c", os.devnull]


def _warm_up(root: str) -> None:
    """One pytest run before the forks: the first imports pytest's own plugins (0.43 s against 0.1 s later)."""
    folder = os.path.join(root, "warm-up")
    os.mkdir(folder)
    Path(folder, "test_warm_up.py").write_text("def test_nothing():\n    pass\n")
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        pytest.main([*_ARGS, folder, "--rootdir", folder])
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        sys.modules.pop("test_warm_up", None)


def _child(case: Case, folder: str, counts: str) -> None:
    for name, text in pytest_files(case).items():
        Path(folder, name).write_text(text)
    os.chdir(folder)
    sys.dont_write_bytecode = True
    args = [*_ARGS, folder, "--rootdir", folder]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    code = pytest.main(args, plugins=[_Counts(counts)])
    os._exit(int(code))


def _start(case: Case, root: str) -> tuple[int, str, str]:
    folder = tempfile.mkdtemp(prefix="case-", dir=root)
    counts = os.path.join(root, os.path.basename(folder) + ".json")
    pid = os.fork()
    if pid == 0:
        try:
            _child(case, folder, counts)
        finally:
            os._exit(99)
    return pid, folder, counts


def run(cases: list[Case], out: Path) -> None:
    """Validate ``cases``, PARALLEL at a time, one JSON line each to ``out``."""
    running: dict[int, tuple[Case, str]] = {}
    pending = list(reversed(cases))
    with tempfile.TemporaryDirectory(prefix="corpus-") as root, out.open("w") as sink:
        _warm_up(root)
        while pending or running:
            while pending and len(running) < PARALLEL:
                case = pending.pop()
                pid, _, counts = _start(case, root)
                running[pid] = (case, counts)
            pid, status = os.wait()
            case, counts = running.pop(pid)
            entry: dict[str, Any] = {"id": case.id, "exit": os.waitstatus_to_exitcode(status)}
            try:
                entry.update(json.loads(Path(counts).read_text()))
            except FileNotFoundError:  # the case ended its process before pytest's session did
                entry.update({"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "unfinished": True})
            sink.write(json.dumps(entry) + "\n")
            sink.flush()


def main() -> None:
    kind, out, *ids = sys.argv[1:]
    cases = [case for case in load(kind) if not ids or case.id in ids]
    run(cases, Path(out))


if __name__ == "__main__":
    main()
