"""`sandboxd score FILE.jsonl`: score a file of completions, with a progress bar."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("score", help="score a JSONL file of completions")
    parser.add_argument("file", help="JSONL: one object per line with kind (code|math), completion, and "
                                     "ground_truth (math) or tests (code)")
    parser.add_argument("-o", "--output", default="-", help="where to write results (JSONL; default stdout)")
    parser.add_argument("--address", default=None)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sandboxd_client import SandboxClient, requests
    from sandboxd_client.errors import SandboxdError
    from tqdm import tqdm

    rows = []
    with open(args.file) as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                print(f"sandboxd: error: {args.file}:{number}: not JSON: {exc}", file=sys.stderr)
                return 2
    try:
        jobs = [requests.job_from_row(row, index) for index, row in enumerate(rows)]
    except (ValueError, TypeError) as exc:
        print(f"sandboxd: error: {exc}", file=sys.stderr)
        return 2
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    try:
        with SandboxClient(args.address) as client, tqdm(total=len(jobs), unit="job", file=sys.stderr) as bar:
            for result in client.run_batch(jobs):
                results[result.index] = result.to_dict()
                bar.update(1)
    except SandboxdError as exc:
        print(f"sandboxd: error: {exc}", file=sys.stderr)
        return 1
    out = sys.stdout if args.output == "-" else open(args.output, "w")  # noqa: SIM115
    with out:
        for row, result in zip(rows, results, strict=True):
            out.write(json.dumps({**row, "result": result}) + "\n")
    return 0
