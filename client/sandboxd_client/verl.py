"""verl reward functions: ``custom_reward_function`` entry points backed by sandboxd.

For verl 0.9.1's ``main_ppo``: ``reward.custom_reward_function.path=pkg://sandboxd_client.verl``,
``reward.custom_reward_function.name=compute_score`` (or ``compute_score_async``);
options as ``+reward.custom_reward_function.reward_kwargs.NAME=VALUE``. Every
reward manager of its reward loop (naive, dapo, gdpo, rate_limited, remote)
calls the function once per sample; ``compute_score_batch`` is for callers of
one's own that hold a whole batch (0.9.1 has no ``batch`` manager).
``reward_kwargs`` arrive as keyword arguments: ``failure_value``,
``infra_failure_value``, ``address``, ``data_source_kinds``, ``code_options``,
``math_options``, ``client_options``.

The daemon address comes from ``$SANDBOXD_ADDRESS`` unless ``address`` is given.
verl calls these from worker threads and forked/Ray processes: the sync client
is created lazily, under a lock, once per process.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

# Absolute imports: verl can load `custom_reward_function.path` by file (spec_from_file_location),
# outside any package, where a relative import raises ImportError; the docs give pkg:// instead.
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._requests import Result, check_reward_options, code_job, math_job, status_and_message
from sandboxd_client.client import AsyncSandboxClient, SandboxClient, score_rows
from sandboxd_client.errors import InvalidRequest, SandboxdError

__all__ = [
    "DATA_SOURCE_KINDS",
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
    "kind_for",
    "register_data_source",
]

#: (glob pattern, kind), matched case-insensitively in order; code first so that a
#: name such as "codeforces-math" is not taken for a math set. register_data_source()
#: puts new patterns in front.
DATA_SOURCE_KINDS: list[tuple[str, str]] = [
    ("*codecontests*", "code"),
    ("*code_contests*", "code"),  # deepmind/code_contests, the dataset's name on the Hugging Face Hub
    ("*apps*", "code"),
    ("*taco*", "code"),
    ("*codeforces*", "code"),
    ("*livecodebench*", "code"),
    ("*humaneval*", "code"),
    ("*mbpp*", "code"),
    ("*primeintellect*", "code"),
    ("*gsm8k*", "math"),
    ("lighteval/math*", "math"),
    ("digitallearninggmbh/math-lighteval", "math"),
    ("math_dapo", "math"),
    ("aime*", "math"),
    ("*math*", "math"),
]

_lock = threading.Lock()
# By name: loaded by file path (verl's custom_reward_function.path) this module is "custom_module".
log = logging.getLogger("sandboxd_client.verl")
# Completions scored infra_failure_value since the last warning, and when that was (time.monotonic()).
# A daemon that was not running scored every completion so without a word; one line a minute says
# why, where a line per completion would flood a run's log.
INFRA_WARNING_SECONDS = 60.0
_infra_unwarned = 0
_infra_warned_at: float | None = None
_clients: dict[tuple[int, str | tuple[str, ...] | None], SandboxClient] = {}
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, AsyncSandboxClient]] = (
    weakref.WeakKeyDictionary()
)


def register_data_source(pattern: str, kind: str) -> None:
    """Score data sources matching ``pattern`` (a glob, case-insensitive) as ``kind`` ("code" or "math")."""
    if kind not in ("code", "math"):
        raise ValueError(f"kind must be 'code' or 'math', got {kind!r}")
    with _lock:
        DATA_SOURCE_KINDS.insert(0, (pattern.lower(), kind))


def kind_for(data_source: str, overrides: Mapping[str, str] | None = None) -> str:
    """ "code" or "math" for a verl ``data_source``; ValueError when nothing matches."""
    source = str(data_source).lower()
    for pattern, kind in [*((p.lower(), k) for p, k in (overrides or {}).items()), *DATA_SOURCE_KINDS]:
        if fnmatch.fnmatchcase(source, pattern):
            return kind
    raise ValueError(
        f"sandboxd does not know how to score data_source {data_source!r}; "
        f"map it with register_data_source() or reward_kwargs data_source_kinds={{pattern: 'code'|'math'}}"
    )


def _key(address: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    return address if address is None or isinstance(address, str) else tuple(address)


def _client(address: str | Sequence[str] | None, options: Mapping[str, Any] | None) -> SandboxClient:
    # Keyed by pid: a client made before a fork must not be used in the child.
    key = (os.getpid(), _key(address))
    with _lock:
        client = _clients.get(key)
        if client is None:
            # An empty address falls back to $SANDBOXD_ADDRESS in resolve_target, as None does.
            client = _clients[key] = SandboxClient(address or None, **dict(options or {}))
        return client


def _async_client(
    address: str | Sequence[str] | None, options: Mapping[str, Any] | None
) -> AsyncSandboxClient:
    loop = asyncio.get_running_loop()
    per_loop = _async_clients.setdefault(loop, {})
    key = _key(address)
    if key not in per_loop:
        per_loop[key] = AsyncSandboxClient(address or None, **dict(options or {}))
    return per_loop[key]


def _extra(extra_info: Any) -> Mapping[str, Any]:
    return extra_info if isinstance(extra_info, Mapping) else {}


def _job(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any, kwargs: Mapping[str, Any]
) -> pb.Job:
    kind = kind_for(data_source, kwargs.get("data_source_kinds"))
    failure_value = float(kwargs.get("failure_value", -1.0))
    extra = _extra(extra_info)
    if kind == "math":
        options = dict(kwargs.get("math_options") or {})
        options.setdefault("failure_value", failure_value)
        # A parquet column comes as numpy: a scalar, or an array of any size (tolist() gives plain values).
        if hasattr(ground_truth, "tolist"):
            ground_truth = ground_truth.tolist()
        if isinstance(ground_truth, (list, tuple)) and len(ground_truth) == 1:
            ground_truth = ground_truth[0]
        return math_job(solution_str, ground_truth, **options)
    options = dict(kwargs.get("code_options") or {})
    options.setdefault("failure_value", failure_value)
    for key in ("language", "fn_name", "entry_point"):
        if extra.get(key) and key not in options:
            options[key] = extra[key]
    return code_job(solution_str, ground_truth, **options)


def _infra_value(kwargs: Mapping[str, Any]) -> float:
    value = kwargs.get("infra_failure_value", -1.0)
    # verl stacks scores into a tensor: a None would break it, so no "drop" here.
    if value is None or not math.isfinite(value):
        raise ValueError(f"infra_failure_value must be a finite number for verl, got {value!r}")
    return float(value)


def _warn_infra(value: float, why: str) -> None:
    """Log an unscored completion: at once for the first, then at most once per INFRA_WARNING_SECONDS."""
    global _infra_unwarned, _infra_warned_at
    with _lock:
        _infra_unwarned += 1
        now = time.monotonic()
        if _infra_warned_at is not None and now - _infra_warned_at < INFRA_WARNING_SECONDS:
            return
        count, _infra_unwarned, _infra_warned_at = _infra_unwarned, 0, now
    log.warning("sandboxd: %d completion(s) could not be scored since the last warning, score %r; the latest: %s",
                count, value, why)


def _score(result: Result | SandboxdError, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """verl's reward dict; every call returns the same keys (verl stacks them per key)."""
    if isinstance(result, SandboxdError) or result.is_infrastructure_failure:
        if isinstance(result, InvalidRequest):
            status = "INVALID_REQUEST"
        elif isinstance(result, SandboxdError):
            status = "CLIENT_ERROR"
        else:
            status = result.status.name
        value = _infra_value(kwargs)
        message = str(result) if isinstance(result, SandboxdError) else result.message
        _warn_infra(value, status_and_message(status, message))
        return {
            "score": value,
            "acc": 0.0,
            "pass_rate": 0.0,
            "status": status,
            "infra_failure": True,
        }
    reward = result.reward if math.isfinite(result.reward) else float(kwargs.get("failure_value", -1.0))
    return {
        "score": reward,
        "acc": 1.0 if result.ok else 0.0,
        "pass_rate": result.pass_rate,
        "status": result.status.name,
        "infra_failure": False,
    }


# The reward settings already checked (check_reward_options), by their repr: every row brings them again.
_checked_settings: set[str] = set()
_CHECKED_SETTINGS_KEPT = 64


def _check_settings(kwargs: Mapping[str, Any]) -> None:
    settings = (kwargs.get("failure_value", -1.0), kwargs.get("code_options"), kwargs.get("math_options"))
    key = repr(settings)
    if key in _checked_settings:
        return
    failure_value, code_options, math_options = settings
    try:
        failure_value = float(failure_value)
    except (TypeError, ValueError):
        raise ValueError(f"failure_value must be a number, got {failure_value!r}") from None
    check_reward_options(failure_value, code_options, math_options)
    if len(_checked_settings) >= _CHECKED_SETTINGS_KEPT:
        _checked_settings.clear()
    _checked_settings.add(key)


def _prepare(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any, kwargs: Mapping[str, Any]
) -> pb.Job | InvalidRequest:
    _check_settings(kwargs)  # settings that no row can make valid stop the run (ValueError)
    kind_for(data_source, kwargs.get("data_source_kinds"))  # an unknown data source (ValueError) stops the run
    try:
        return _job(data_source, solution_str, ground_truth, extra_info, kwargs)
    except InvalidRequest as e:
        # A malformed row scores the infrastructure value.
        return e
    except (TypeError, ValueError, LookupError, AttributeError, RecursionError) as e:
        # A value no builder check foresaw (a ground truth whose tolist() fails): this row's score, not the run.
        return InvalidRequest(f"{type(e).__name__}: {e}")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """Score one completion: ``{"score", "acc", "pass_rate", "status", "infra_failure"}``.

    Math data sources compare ``solution_str`` with ``ground_truth``; code data
    sources run it against ``ground_truth`` as test cases (verl's JSON, or any
    shape :func:`code_job` accepts). Thread-safe.
    """
    prepared = _prepare(data_source, solution_str, ground_truth, extra_info, kwargs)
    if isinstance(prepared, InvalidRequest):
        return _score(prepared, kwargs)
    try:
        result: Result | SandboxdError = _client(kwargs.get("address"), kwargs.get("client_options")).run(
            prepared
        )
    except SandboxdError as e:
        result = e
    return _score(result, kwargs)


async def compute_score_async(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """The ``async def`` twin of :func:`compute_score` (one client per event loop)."""
    prepared = _prepare(data_source, solution_str, ground_truth, extra_info, kwargs)
    if isinstance(prepared, InvalidRequest):
        return _score(prepared, kwargs)
    try:
        client = _async_client(kwargs.get("address"), kwargs.get("client_options"))
        result: Result | SandboxdError = await client.run(prepared)
    except SandboxdError as e:
        result = e
    return _score(result, kwargs)


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Score a whole batch in one go, for verl's batch reward manager; results in input order."""
    n = len(solution_strs)
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
    if not (len(data_sources) == len(ground_truths) == len(extra_infos) == n):
        raise ValueError(
            f"batch columns differ in length: {len(data_sources)} data_sources, {n} solution_strs, "
            f"{len(ground_truths)} ground_truths, {len(extra_infos)} extra_infos"
        )
    prepared = [
        _prepare(*row, kwargs)
        for row in zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True)
    ]
    jobs = [p for p in prepared if isinstance(p, pb.Job)]
    results: list[Result | InvalidRequest] = []
    error: SandboxdError | None = None
    if jobs:
        try:
            results = score_rows(_client(kwargs.get("address"), kwargs.get("client_options")), jobs)
        except SandboxdError as e:
            error = e
    scored = iter(results)
    out = []
    for item in prepared:
        if isinstance(item, InvalidRequest):
            out.append(_score(item, kwargs))
        else:
            out.append(_score(error if error is not None else next(scored), kwargs))
    return out
