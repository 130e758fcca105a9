"""The harness's logging: a test's ``caplog`` (in the judge) and the program's log records that reach it (from the
candidate), imported only once a test asks for ``caplog``.

Not imported with the rest of the harness, so that a code sandbox's zygote
does not hold ``logging``, nor the ``threading`` it imports: both register
fork hooks (``os.register_at_fork``) that then run in every worker the
zygote forks, about 150 page faults and 0.4 ms of CPU each (host, Python
3.11), a tenth of a HumanEval candidate's.

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .remote import LOG_RECORDS_LIMIT, MESSAGE_LIMIT

if TYPE_CHECKING:
    from .remote import CandidateEndpoint, JudgeEndpoint


class ForwardLogs(logging.Handler):
    """In the candidate: each log record goes to the tests with the next frame (see handle_record)."""

    def __init__(self, endpoint: CandidateEndpoint) -> None:
        super().__init__(logging.NOTSET)
        self.endpoint = endpoint

    def emit(self, record: logging.LogRecord) -> None:
        endpoint = self.endpoint
        if endpoint.log_records_sent >= LOG_RECORDS_LIMIT:
            return
        endpoint.log_records_sent += 1
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        endpoint.log_records.append([str(record.name)[:200], int(record.levelno), message[:MESSAGE_LIMIT],
                                     str(record.filename)[:200], int(record.lineno)])


def forward_logs(endpoint: CandidateEndpoint, levels: dict[object, object], installed: bool) -> None:
    """In the candidate: send the program's log records to the tests (their caplog), at the levels the tests set;
    `installed`: the handler is in place already."""
    if not installed:
        logging.root.addHandler(ForwardLogs(endpoint))
    for name, level in levels.items():
        if type(level) is int and type(name) is str:
            (logging.getLogger(name) if name else logging.root).setLevel(level)


def handle_record(name: str, level: int, message: str, filename: str, lineno: int) -> None:
    """In the judge: a log record of the program's, handled by the tests' logging as if it were made there."""
    # A logger the tests have, or the root: a program's names make no loggers in a long-lived judge.
    logger = logging.root.manager.loggerDict.get(name) if name != "root" else None
    handler = logger if isinstance(logger, logging.Logger) else logging.root
    if handler.isEnabledFor(level):
        handler.handle(logging.makeLogRecord({
            "name": name, "levelno": level, "levelname": logging.getLevelName(level), "msg": message,
            "args": None, "filename": filename, "lineno": lineno, "pathname": filename, "module": "solution",
        }))


class CapLog(logging.Handler):
    """pytest's ``caplog``: the log records of the test and of the program (remote forwards them)."""

    def __init__(self, remote: JudgeEndpoint, cleanup: contextlib.ExitStack) -> None:
        super().__init__(logging.NOTSET)
        self.remote, self.cleanup = remote, cleanup
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)-8s %(name)s:%(filename)s:%(lineno)d %(message)s"))
        logging.root.addHandler(self)
        cleanup.callback(logging.root.removeHandler, self)
        remote.log_level("", logging.root.level)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def handler(self) -> logging.Handler:
        return self

    @property
    def text(self) -> str:
        return "".join(self.format(record) + "\n" for record in self.records)

    @property
    def record_tuples(self) -> list[tuple[str, int, str]]:
        return [(record.name, record.levelno, record.getMessage()) for record in self.records]

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]

    def clear(self) -> None:
        self.records.clear()

    def set_level(self, level: int | str, logger: str | None = None) -> None:
        target = logging.getLogger(logger)
        before = target.level
        target.setLevel(level)
        self.remote.log_level(logger or "", target.level)
        self.cleanup.callback(self._restore, target, logger, before)

    def _restore(self, target: logging.Logger, name: str | None, level: int) -> None:
        target.setLevel(level)
        self.remote.log_level(name or "", level)

    @contextlib.contextmanager
    def at_level(self, level: int | str, logger: str | None = None) -> Iterator[None]:
        target = logging.getLogger(logger)
        before = target.level
        target.setLevel(level)
        self.remote.log_level(logger or "", target.level)
        try:
            yield
        finally:
            self._restore(target, logger, before)
