"""Reward functions for TRL's ``GRPOTrainer`` (and any trainer with the same calling convention).

TRL calls ``reward(prompts=..., completions=..., completion_ids=..., trainer_state=...,
log_extra=..., log_metric=..., **columns)`` where every dataset column comes
repeated once per generation. This module maps those columns to verifier
inputs, scores the whole batch in one go, and never hands the trainer a NaN.
Nothing from TRL is imported: the functions only follow its convention.

:class:`SandboxEnvironment` is a tool-use environment for ``GRPOTrainer``'s
``environment_factory``: one sandboxd session per rollout, with ``python`` and
``bash`` tools. :class:`SandboxCheckEnvironment` adds ``get_reward``: a final
check of the files the rollout's session left scores it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from ._proto.sandboxd.v1 import sandboxd_pb2 as pb
from ._requests import (
    CellResult,
    Result,
    _check_failure_below_a_pass,
    _check_finite,
    check_reward_options,
    code_job,
    math_job,
    status_and_message,
)
from ._tools import bash_cell, cell_text, check_reward
from .client import AsyncSandboxClient, SandboxClient, Session, score_rows, score_rows_async
from .errors import InvalidRequest, SandboxdError, SessionNotFound

__all__ = [
    "SandboxCheckEnvironment",
    "SandboxEnvironment",
    "completion_text",
    "make_async_reward_func",
    "make_reward_func",
]

log = logging.getLogger(__name__)

RewardFunc = Callable[..., list[float | None]]
AsyncRewardFunc = Callable[..., Coroutine[Any, Any, list[float | None]]]

# Verifier input -> dataset columns tried in order, most explicit name first.
MATH_COLUMNS: dict[str, tuple[str, ...]] = {"ground_truth": ("ground_truth", "answer", "solution")}
CODE_TEST_COLUMNS: tuple[str, ...] = (
    "test_cases",
    "tests",
    "input_output",
    "verification_info",
    "test",
    "test_list",
    "public_tests",
    "public_test_cases",
)
# Columns that complete a dataset's test shape when its main column is present.
_COMPANIONS: dict[str, tuple[str, ...]] = {
    "test": ("entry_point",),
    "test_list": ("test_setup_code", "challenge_test_list"),
    "public_tests": ("private_tests", "generated_tests"),
    "public_test_cases": ("private_test_cases",),
}
_TRL_ARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
_KINDS = ("code", "math", "auto")


def completion_text(completion: Any) -> str:
    """The text to score: a plain string, or the last assistant message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        if assistant:
            return _content_text(assistant[-1].get("content"))
        if messages:
            return _content_text(messages[-1].get("content"))
    raise InvalidRequest(f"cannot read a completion of type {type(completion).__name__}")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # Multimodal chat content: [{"type": "text", "text": ...}, ...]
    if isinstance(content, Sequence):
        return "".join(
            p["text"] for p in content
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    raise InvalidRequest(f"cannot read message content of type {type(content).__name__}")


class _RewardSpec:
    """Everything about a reward function except how it waits for the daemon."""

    def __init__(
        self,
        kind: str,
        failure_value: float,
        infra_failure_value: float | None,
        column_map: Mapping[str, str] | None,
        raise_on_error: bool,
        code_options: Mapping[str, Any] | None,
        math_options: Mapping[str, Any] | None,
        name: str | None,
    ) -> None:
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if failure_value is None:
            raise ValueError("failure_value must be a finite number, got None")
        # InvalidRequest is a ValueError.
        _check_finite(failure_value, "failure_value")
        _check_failure_below_a_pass(failure_value, scored_to_one=True)  # here, not as every row's infra failure
        _check_finite(infra_failure_value, "infra_failure_value (a finite number or None)")
        check_reward_options(failure_value, code_options, math_options)
        unknown = set(column_map or {}) - {"ground_truth", "tests", "fn_name", "language", "entry_point"}
        if unknown:
            raise ValueError(
                f"column_map keys must be verifier inputs (ground_truth, tests, fn_name, language, "
                f"entry_point), got {sorted(unknown)}"
            )
        self.kind = kind
        self.failure_value = float(failure_value)
        self.infra_failure_value = infra_failure_value
        self.column_map = dict(column_map or {})
        self.raise_on_error = raise_on_error
        self.code_options = dict(code_options or {})
        self.math_options = dict(math_options or {})
        self.name = name or f"sandboxd_{kind}"

    # -- columns ----------------------------------------------------------

    def _math_column(self, columns: Mapping[str, Any]) -> str | None:
        if "ground_truth" in self.column_map:
            return self.column_map["ground_truth"]
        return next((c for c in MATH_COLUMNS["ground_truth"] if c in columns), None)

    def _tests_column(self, columns: Mapping[str, Any]) -> str | None:
        if "tests" in self.column_map:
            return self.column_map["tests"]
        return next((c for c in CODE_TEST_COLUMNS if c in columns), None)

    def _missing(self, columns: Mapping[str, Any]) -> str | None:
        """Why the dataset cannot be scored at all, or None."""
        available = sorted(columns)
        for verifier_input, column in self.column_map.items():
            if column not in columns:
                return (
                    f"{self.name}: column_map[{verifier_input!r}] = {column!r}, but the dataset has no such "
                    f"column; available columns: {available}"
                )
        math_col, tests_col = self._math_column(columns), self._tests_column(columns)
        if self.kind == "math" and math_col is None:
            return (
                f"{self.name}: math scoring needs a ground-truth column, one of "
                f"{list(MATH_COLUMNS['ground_truth'])} (or column_map={{'ground_truth': ...}}); "
                f"available columns: {available}"
            )
        if self.kind == "code" and tests_col is None:
            return (
                f"{self.name}: code scoring needs a tests column, one of {list(CODE_TEST_COLUMNS)} "
                f"(or column_map={{'tests': ...}}); available columns: {available}"
            )
        if self.kind == "auto" and math_col is None and tests_col is None:
            return (
                f"{self.name}: needs a tests column {list(CODE_TEST_COLUMNS)} or a ground-truth column "
                f"{list(MATH_COLUMNS['ground_truth'])}; available columns: {available}"
            )
        return None

    def _value(self, columns: Mapping[str, Sequence[Any]], verifier_input: str, row: int) -> Any:
        """Row ``row`` of the column feeding ``verifier_input`` (the same-named one unless mapped), or None."""
        column = self.column_map.get(verifier_input, verifier_input)
        values = columns.get(column)
        return None if values is None else values[row]

    def _code_job(self, text: str, columns: Mapping[str, Sequence[Any]], tests_col: str, row: int) -> pb.Job:
        tests = columns[tests_col][row]
        main = tests_col if "tests" not in self.column_map else None
        if main in _COMPANIONS:
            # Rebuild the dataset's own dict so the daemon sees the shape it knows.
            tests = {main: tests}
            for companion in _COMPANIONS[main]:
                if columns.get(companion) is not None and columns[companion][row] is not None:
                    tests[companion] = columns[companion][row]
        options = dict(self.code_options)
        fn_name = self._value(columns, "fn_name", row)
        if fn_name:
            options["fn_name"] = fn_name
        language = self._value(columns, "language", row)
        if language:
            options["language"] = language
        entry_point = self._value(columns, "entry_point", row)
        if entry_point and not isinstance(tests, Mapping):
            options["entry_point"] = entry_point
        options.setdefault("failure_value", self.failure_value)
        return code_job(text, tests, **options)

    def _math_job(self, text: str, columns: Mapping[str, Sequence[Any]], math_col: str, row: int) -> pb.Job:
        options = dict(self.math_options)
        options.setdefault("failure_value", self.failure_value)
        return math_job(text, columns[math_col][row], **options)

    def prepare(
        self, completions: Sequence[Any] | None, columns: dict[str, Any]
    ) -> list[pb.Job | InvalidRequest]:
        """One job per completion, or the reason a row cannot be scored.

        Raises ValueError when the dataset lacks the columns the verifier needs:
        a configuration error is worth stopping the run for, a bad row is not.
        """
        if completions is None:
            raise ValueError(f"{self.name}: called without completions")
        reason = self._missing(columns)
        if reason:
            raise ValueError(reason)
        n = len(completions)
        for column, values in columns.items():
            if isinstance(values, Sequence) and not isinstance(values, str) and len(values) != n:
                raise ValueError(
                    f"{self.name}: column {column!r} has {len(values)} values for {n} completions"
                )
        math_col, tests_col = self._math_column(columns), self._tests_column(columns)
        jobs: list[pb.Job | InvalidRequest] = []
        for row, completion in enumerate(completions):
            try:
                text = completion_text(completion)
                kind = self.kind
                if kind == "auto":
                    # Mixed datasets leave the other kind's column empty (None) on each row.
                    has_tests = tests_col is not None and columns[tests_col][row] is not None
                    kind = "code" if has_tests else "math"
                if kind == "code":
                    assert tests_col is not None
                    jobs.append(self._code_job(text, columns, tests_col, row))
                else:
                    if math_col is None or columns[math_col][row] is None:
                        raise InvalidRequest(f"row {row} has neither tests nor a ground truth")
                    jobs.append(self._math_job(text, columns, math_col, row))
            except InvalidRequest as e:
                if self.raise_on_error:
                    raise
                jobs.append(e)
            except (TypeError, ValueError, LookupError, AttributeError, RecursionError) as e:
                # A dataset value no builder check foresaw (its own __len__ or __getitem__ failing): this row's
                # reward, not the trainer's step.
                if self.raise_on_error:
                    raise
                jobs.append(InvalidRequest(f"row {row}: {type(e).__name__}: {e}"))
        return jobs

    # -- results ----------------------------------------------------------

    def rewards(
        self,
        prepared: list[pb.Job | InvalidRequest],
        results: list[Result | InvalidRequest] | SandboxdError,
        log_metric: Callable[[str, float], Any] | None,
    ) -> list[float | None]:
        """Rewards in input order, with metrics sent to ``log_metric``."""
        if isinstance(results, SandboxdError):
            if self.raise_on_error:
                raise results
            log.error(
                "%s: scoring failed, every completion gets %r: %s",
                self.name,
                self.infra_failure_value,
                results,
            )
            results = []
        scored = iter(results)
        out: list[float | None] = []
        verdicts: list[Result] = []
        infra = 0
        # The first infrastructure failure's message: without a line saying why, a daemon that is not
        # running (or a wrong SANDBOXD_ADDRESS) scored every completion infra_failure_value in silence.
        first_infra = ""
        for item in prepared:
            result = item if isinstance(item, InvalidRequest) else next(scored, None)
            if isinstance(result, InvalidRequest):  # refused by the client, or by the daemon (score_rows)
                if self.raise_on_error:
                    raise result
                log.warning("%s: unscorable row, reward %r: %s", self.name, self.infra_failure_value, result)
                infra += 1
                out.append(self.infra_failure_value)
                continue
            if result is None or result.is_infrastructure_failure:
                infra += 1
                if not first_infra:
                    first_infra = ("no result" if result is None
                                   else status_and_message(result.status.name, result.message))
                out.append(self.infra_failure_value)
                continue
            verdicts.append(result)
            out.append(result.reward if math.isfinite(result.reward) else self.failure_value)
        if infra and self.raise_on_error:
            raise SandboxdError(f"{self.name}: {infra} of {len(prepared)} completions could not be scored")
        if first_infra:
            log.warning("%s: %d of %d completions could not be scored, reward %r; the first: %s",
                        self.name, infra, len(prepared), self.infra_failure_value, first_infra)
        self._log(log_metric, verdicts, infra, len(prepared))
        return out

    def _log(
        self, log_metric: Callable[[str, float], Any] | None, verdicts: list[Result], infra: int, total: int
    ) -> None:
        if log_metric is None or not total:
            return
        metrics = {"infra_failure_rate": infra / total}
        if verdicts:
            metrics["ok_rate"] = sum(r.ok for r in verdicts) / len(verdicts)
            metrics["pass_rate"] = sum(r.pass_rate for r in verdicts) / len(verdicts)
        for key, value in metrics.items():
            try:
                log_metric(f"{self.name}/{key}", value)
            except Exception:  # a logging hook must never cost the trainer its rewards
                log.debug("log_metric(%s) failed", key, exc_info=True)


def _split_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    for name in _TRL_ARGS:
        kwargs.pop(name, None)
    return kwargs


def make_reward_func(
    kind: str = "auto",
    *,
    address: str | Sequence[str] | None = None,
    failure_value: float = -1.0,
    infra_failure_value: float | None = None,
    column_map: Mapping[str, str] | None = None,
    raise_on_error: bool = False,
    code_options: Mapping[str, Any] | None = None,
    math_options: Mapping[str, Any] | None = None,
    client_options: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> RewardFunc:
    """A synchronous TRL reward function scoring with sandboxd.

    ``kind`` is ``"code"``, ``"math"`` or ``"auto"`` (per row: code when its tests
    column is set, else math). ``column_map`` maps verifier inputs
    (``ground_truth``, ``tests``, ``fn_name``, ``language``, ``entry_point``) to
    dataset columns when the defaults do not fit. Model failures score
    ``failure_value``; completions that could not be scored (infrastructure
    failure, malformed row) score ``infra_failure_value``: by default None,
    which TRL masks (left out of its group's baseline, advantage 0), so an
    outage does not read as a wrong answer; give a number to score them.
    Missing columns raise ValueError before any RPC; nothing else raises
    unless ``raise_on_error``. ``code_options`` / ``math_options`` go to
    :func:`code_job` / :func:`math_job`; ``client_options`` to the client.
    The client is created on first call, so the function can be built before
    worker processes fork.
    """
    spec = _RewardSpec(
        kind, failure_value, infra_failure_value, column_map, raise_on_error, code_options, math_options, name
    )
    lock = threading.Lock()
    holder: list[SandboxClient] = []

    def get_client() -> SandboxClient:
        with lock:
            if not holder:
                holder.append(SandboxClient(address, **dict(client_options or {})))
            return holder[0]

    def reward(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float | None]:
        log_metric = kwargs.get("log_metric")
        prepared = spec.prepare(completions, _split_kwargs(kwargs))
        jobs = [j for j in prepared if isinstance(j, pb.Job)]
        results: list[Result | InvalidRequest] | SandboxdError = []
        if jobs:
            try:
                results = score_rows(get_client(), jobs)
            except SandboxdError as e:
                results = e
        return spec.rewards(prepared, results, log_metric)

    reward.__name__ = reward.__qualname__ = spec.name
    return reward


def make_async_reward_func(
    kind: str = "auto",
    *,
    address: str | Sequence[str] | None = None,
    failure_value: float = -1.0,
    infra_failure_value: float | None = None,
    column_map: Mapping[str, str] | None = None,
    raise_on_error: bool = False,
    code_options: Mapping[str, Any] | None = None,
    math_options: Mapping[str, Any] | None = None,
    client_options: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> AsyncRewardFunc:
    """The ``async def`` twin of :func:`make_reward_func`, with the same arguments.

    TRL runs async reward functions on its own event loop thread; a
    ``grpc.aio`` channel belongs to one loop, so a client is created lazily
    for each loop the function is awaited on.
    """
    spec = _RewardSpec(
        kind, failure_value, infra_failure_value, column_map, raise_on_error, code_options, math_options, name
    )
    clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSandboxClient] = (
        weakref.WeakKeyDictionary()
    )

    def get_client() -> AsyncSandboxClient:
        loop = asyncio.get_running_loop()
        client = clients.get(loop)
        if client is None:
            # No await between get and set: one loop cannot race itself here.
            client = clients[loop] = AsyncSandboxClient(address, **dict(client_options or {}))
        return client

    async def reward(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float | None]:
        log_metric = kwargs.get("log_metric")
        prepared = spec.prepare(completions, _split_kwargs(kwargs))
        jobs = [j for j in prepared if isinstance(j, pb.Job)]
        results: list[Result | InvalidRequest] | SandboxdError = []
        if jobs:
            try:
                results = await score_rows_async(get_client(), jobs)
            except SandboxdError as e:
                results = e
        return spec.rewards(prepared, results, log_metric)

    reward.__name__ = reward.__qualname__ = spec.name
    return reward


# -- tool use ---------------------------------------------------------------------------------------------------------

def _close_quietly(session: Session) -> None:
    try:
        session.close()
    except SandboxdError as e:  # the daemon expires it anyway; nothing to do at exit or in a reset
        log.debug("sandboxd: closing a tool session: %s", e)


# How the daemon names a session that ended as its program's doing (sessions.py: "session ID ended: WHY").
_DIED_OF_ITS_PROGRAM = "ended: the session died:"


def _died_of_its_program(message: str) -> bool:
    """Whether a SessionNotFound says the session's own program ended it (not the daemon, its sandbox or time)."""
    return _DIED_OF_ITS_PROGRAM in message


class SandboxEnvironment:
    """A code interpreter for ``GRPOTrainer(environment_factory=...)``: one sandboxd session per rollout.

    TRL makes a pool of these, calls :meth:`reset` before each rollout and
    exposes the public methods :meth:`python` and :meth:`bash` to the model as
    tools (their docstrings are the tools' descriptions). Both run in the
    rollout's one session, opened on the first tool call (a rollout that calls
    no tool holds no sandbox): Python variables, imports and files persist from
    call to call; each bash command is a fresh ``bash -c`` in the same sandbox
    and folder. :meth:`reset` closes the previous rollout's session; the last
    one closes when the environment is garbage collected, at interpreter exit,
    or with :meth:`close_all` (call it after ``trainer.train()``).

    Use ``functools.partial`` (or a subclass) to pass arguments, since TRL calls
    the factory with none::

        GRPOTrainer(..., environment_factory=partial(SandboxEnvironment, timeout=10))

    ``address`` and ``client_options`` go to one :class:`SandboxClient` shared
    by every environment of the process; ``timeout``, ``memory_bytes`` and
    ``idle_timeout`` are the session's limits (docs/sessions.md);
    ``max_output_chars`` caps what a tool call returns to the model. A tool
    call that the infrastructure could not run raises :class:`SandboxdError`,
    which TRL hands the model as the tool's error; a lost session is replaced
    by a fresh one on the next call.
    """

    _clients: dict[tuple[int, Any], SandboxClient] = {}
    _lock = threading.Lock()
    _instances: weakref.WeakSet[SandboxEnvironment] = weakref.WeakSet()

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        memory_bytes: int | None = None,
        idle_timeout: float | None = None,
        max_output_chars: int = 4000,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_output_chars < 1:
            raise ValueError(f"max_output_chars must be at least 1, got {max_output_chars!r}")
        self._address = address
        self._client_options = dict(client_options or {})
        self._timeout, self._memory_bytes, self._idle_timeout = timeout, memory_bytes, idle_timeout
        self._max_output_chars = max_output_chars
        self._session: Session | None = None
        self._finalizer: weakref.finalize | None = None
        # The rollout's session ended by no doing of the model (expired, or lost with its sandbox): what a final
        # check would judge is gone.
        self._lost = False
        with SandboxEnvironment._lock:
            SandboxEnvironment._instances.add(self)

    def _client(self) -> SandboxClient:
        # Keyed by pid: a client made before a fork must not be used in the child.
        key = (os.getpid(), repr((self._address, sorted(self._client_options.items(), key=lambda kv: kv[0]))))
        with SandboxEnvironment._lock:
            client = SandboxEnvironment._clients.get(key)
            if client is None:
                client = SandboxEnvironment._clients[key] = SandboxClient(self._address, **self._client_options)
            return client

    def _close_session(self) -> None:
        finalizer, self._finalizer, self._session = self._finalizer, None, None
        if finalizer is not None:
            finalizer()  # closes the session, once

    def _cell(self, code: str, *, final: bool = False) -> CellResult:
        if self._session is None:
            session = self._client().open_session(
                "python", timeout=self._timeout, memory_bytes=self._memory_bytes, idle_timeout=self._idle_timeout
            )
            self._session, self._finalizer = session, weakref.finalize(self, _close_quietly, session)
        try:
            result = self._session.run(code, final=final)
        except SessionNotFound as e:
            # Ended between cells by the program's own doing (a timer that ends its interpreter after its cell
            # answered) is the model's, as a cell that ends it is: taken for a lost session, it scored
            # infra_failure_value, which TRL leaves out of the group, a way out of a failing check.
            self._lost = self._lost or not _died_of_its_program(str(e))
            self._close_session()  # expired or lost with its sandbox: the next call opens a fresh one
            raise
        if not result.session_alive:
            # Ended by the cell: the model's doing (os._exit, its memory) unless the infrastructure says it failed.
            self._lost = self._lost or result.status.is_infrastructure_failure
            self._close_session()
        return result

    def _run(self, code: str) -> str:
        return cell_text(self._cell(code), self._max_output_chars)

    def reset(self, **kwargs: Any) -> None:
        """Start a rollout: close the previous rollout's session (the next one opens on the first tool call)."""
        self._close_session()
        self._lost = False

    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter and return what it printed and the value of its last line.

        Variables, functions and imports persist between calls, as in a notebook.

        Args:
            code: The Python code to run.
        """
        return self._run(code)

    def bash(self, command: str) -> str:
        """Run a bash command in the same sandbox and folder as the Python tool; return its output.

        Files persist between calls; each command starts a fresh shell (a `cd` does not carry over).

        Args:
            command: The bash command line to run.
        """
        return self._run(bash_cell(command))

    @classmethod
    def close_all(cls) -> None:
        """Close the sessions every environment of this process still holds (after ``trainer.train()``)."""
        with cls._lock:
            instances = list(cls._instances)
        for env in instances:
            env._close_session()

    def __enter__(self) -> SandboxEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_session()


_Check = str | Callable[[dict[str, Any]], str | None]


class SandboxCheckEnvironment(SandboxEnvironment):
    """A :class:`SandboxEnvironment` that scores each rollout with a final check of the files its session left.

    TRL calls :meth:`get_reward` once a rollout ends (and then needs no
    ``reward_funcs``; given some, it adds this reward to theirs with weight 1,
    logged as ``rewards/SandboxCheckEnvironment``). The check is Python code run
    as the session's final cell (``Session.run(final=True)``): every process
    of the session is killed, and the check runs in a fresh interpreter in the
    session's folder. It sees the files the model's tool calls left, not their
    variables, imports or patches: ``"open('answer.txt').read().strip() ==
    '42'"``, ``"json.load(open('result.json'))['total'] == 10"`` (import what
    it uses). ``check`` is that code, or a function of the dataset row (TRL
    passes the row to :meth:`reset`) returning it, or None for a row without a
    check::

        partial(SandboxCheckEnvironment, check=lambda row: row["check"])

    The reward is the check's last value when it is a number (``True`` 1.0,
    ``False`` 0.0), 1.0 when it has none; ``failure_value`` (0.0) when it
    raises, times out or its last value is not a number;
    ``infra_failure_value`` (None: TRL leaves the rollout out of its group's
    baseline) when the infrastructure could not run it, when the rollout's
    session was lost to the infrastructure before it (expired, or lost with
    its sandbox), or for a row whose check is None. A rollout that called no
    tool is checked in a fresh session. Nothing raises into the trainer, and
    the session is closed once checked. What the model wrote is data to the
    check until the check runs it: a check that imports or executes the
    model's code gives it the check's process (docs/client.md shows how to
    run it apart). A daemon too old to run final cells scores
    ``infra_failure_value``. Other arguments are :class:`SandboxEnvironment`'s.
    """

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        check: _Check,
        failure_value: float = 0.0,
        infra_failure_value: float | None = None,
        timeout: float | None = None,
        memory_bytes: int | None = None,
        idle_timeout: float | None = None,
        max_output_chars: int = 4000,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(check) and not isinstance(check, str):
            raise TypeError(f"check must be Python code or a function of the dataset row, got {check!r}")
        if isinstance(check, str) and not check.strip():
            raise ValueError("check is empty: give the Python code that checks the rollout's session")
        _check_finite(failure_value, "failure_value")
        _check_finite(infra_failure_value, "infra_failure_value (a finite number or None)")
        super().__init__(address, timeout=timeout, memory_bytes=memory_bytes, idle_timeout=idle_timeout,
                         max_output_chars=max_output_chars, client_options=client_options)
        self._check = check
        self._failure_value = float(failure_value)
        self._infra_failure_value = infra_failure_value
        self._code: str | None = check if isinstance(check, str) else None
        self._reward: float | None = None
        self._scored = False

    def reset(self, **kwargs: Any) -> None:
        """Start a rollout of the dataset row ``kwargs``: close the previous session and take the row's check."""
        super().reset(**kwargs)
        self._scored = False
        if callable(self._check):
            code = self._check(kwargs)
            if code is not None and not isinstance(code, str):
                raise TypeError(f"check(row) must return Python code (a str) or None, got {type(code).__name__}")
            self._code = code

    def get_reward(self) -> float | None:
        """The rollout's reward: its final check, in a fresh interpreter on its session's files; the session ends."""
        if not self._scored:
            self._reward, self._scored = self._score(), True
        return self._reward

    def _score(self) -> float | None:
        try:
            if self._code is None:
                # A row left to the reward functions on purpose, in a dataset that mixes both: not worth a warning.
                log.debug("sandboxd: this rollout's row has no check, reward %r", self._infra_failure_value)
                return self._infra_failure_value
            if self._lost:
                log.warning("sandboxd: the rollout's session was lost before its check, reward %r",
                            self._infra_failure_value)
                return self._infra_failure_value
            result = self._cell(self._code, final=True)
            if result.status.is_infrastructure_failure:
                log.warning("sandboxd: the check could not run, reward %r: %s", self._infra_failure_value,
                            status_and_message(result.status.name, result.message))
            return check_reward(result, self._failure_value, self._infra_failure_value)
        except SandboxdError as e:
            log.warning("sandboxd: the check could not run, reward %r: %s", self._infra_failure_value, e)
            return self._infra_failure_value
        except Exception:  # a bug must cost one rollout its reward, not a training run its step
            log.exception("sandboxd: the check failed, reward %r", self._infra_failure_value)
            return self._infra_failure_value
        finally:
            self._close_session()
