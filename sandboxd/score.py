"""`sandboxd score FILE.jsonl`: score a file of completions, with a progress bar.

Each input line is one JSON object, as ``sandboxd_client.requests.job_from_row``
reads it: ``kind`` (``code`` or ``math``; inferred from ``tests`` /
``ground_truth``), ``completion``, ``tests`` or ``ground_truth``, and any job
option by name (``language``, ``timeout``, ``failure_value``, ...). Every row is
written back, in input order, with a ``result`` key holding ``Result.to_dict()``.
The progress bar and a closing summary go to stderr.

Exit status: 0 every row scored and written (infrastructure failures that
survived the client's retries included: their results say so), 1 the daemon
could not be reached or refused the work, 2 bad input or output file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from typing import IO, Any


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "score",
        help="score a JSONL file of completions",
        description="Score a JSONL file of completions (one object per line: kind (code|math), completion, "
        "and ground_truth (math) or tests (code), plus job options by name). Writes each row back with a "
        "'result' key, in input order.",
    )
    parser.add_argument("file", help="the JSONL file ('-' for stdin)")
    parser.add_argument("-o", "--output", default="-", help="where to write results (JSONL; default stdout)")
    parser.add_argument("--address", default=None, help="default: SANDBOXD_ADDRESS or the local socket")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    parser.set_defaults(handler=run)


def _error(message: str) -> None:
    print(f"sandboxd: error: {message}", file=sys.stderr)


def _read_rows(file: IO[str], name: str) -> tuple[list[Any], list[int]]:
    """The JSON value of every non-blank line, and its line number."""
    rows: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(file, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{name}:{number}: not JSON: {exc}") from None
        lines.append(number)
    return rows, lines


def _summary(results: list[dict[str, Any]]) -> str:
    statuses = Counter(r["status"] for r in results)
    infra = sum(r["is_infrastructure_failure"] for r in results)
    mean = sum(r["reward"] for r in results) / len(results)
    counts = ", ".join(f"{name} {n}" for name, n in statuses.most_common())
    return f"scored {len(results)} rows: mean reward {mean:.4f}; {counts}; infrastructure failures {infra}"


def run(args: argparse.Namespace) -> int:
    from sandboxd_client import SandboxClient, requests
    from sandboxd_client.errors import SandboxdError
    from tqdm import tqdm

    name = "<stdin>" if args.file == "-" else args.file
    try:
        if args.file == "-":
            rows, lines = _read_rows(sys.stdin, name)
        else:
            with open(args.file) as file:
                rows, lines = _read_rows(file, name)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        _error(str(exc))
        return 2
    jobs = []
    # (key, the option it looks like, the row's kind) -> its lines: a typo'd option would silently take the default.
    ignored: dict[tuple[str, str, str], list[int]] = {}
    for index, (row, line) in enumerate(zip(rows, lines, strict=True)):
        try:
            jobs.append(requests.job_from_row(row, index))
        except (ValueError, TypeError) as exc:
            _error(f"{name}:{line}: {exc}")
            return 2
        for key, option in requests.ignored_row_options(row):
            ignored.setdefault((key, option, str(jobs[-1].WhichOneof("kind"))), []).append(line)
    for (key, option, kind), at in ignored.items():
        where = f"line {at[0]}" if len(at) == 1 else f"{len(at)} rows, the first at line {at[0]}"
        why = f"is not an option of {kind} rows" if key == option else f"is not a job option (did you mean {option!r}?)"
        print(f"sandboxd: warning: {name}: {key!r} {why}; ignored ({where})", file=sys.stderr)
    # Opened before scoring, so a bad path fails before the work rather than after it.
    try:
        output = contextlib.nullcontext(sys.stdout) if args.output == "-" else open(args.output, "w")  # noqa: SIM115
    except OSError as exc:
        _error(f"cannot write {args.output}: {exc}")
        return 2
    with output as out:
        if not jobs:
            if not args.quiet:
                print(f"{name}: no rows to score", file=sys.stderr)
            return 0
        results: list[dict[str, Any] | None] = [None] * len(jobs)
        try:
            with SandboxClient(args.address) as client:
                client.info()  # no daemon: one clear error now, not a file of UNAVAILABLE results later
                bar = tqdm(total=len(jobs), unit="job", file=sys.stderr, disable=args.quiet, dynamic_ncols=True)
                with bar:
                    for result in client.run_batch(jobs):
                        results[result.index] = result.to_dict()
                        bar.update(1)
        except SandboxdError as exc:
            _error(str(exc))
            return 1
        done = [r for r in results if r is not None]
        for row, row_result in zip(rows, results, strict=True):
            out.write(json.dumps({**row, "result": row_result}) + "\n")
        out.flush()
    if not args.quiet:
        print(_summary(done), file=sys.stderr)
    return 0

