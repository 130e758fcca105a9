"""`math`: pairs/s of sandboxd's math verifier (batch) vs Math-Verify in-process, one thread.

The pairs are generated (seeded) to mix what math RL datasets hold: plain
integers and decimals, fractions written several ways, LaTeX expressions
(roots, pi, polynomials), sets and intervals, about a fifth of them wrong.
The baseline is Math-Verify as its README uses it, in this process, one
thread: `verify(parse(gold), parse(completion))`, with `$...$` around the
gold. Both sides check the same pairs in rounds that alternate which goes
first, after both have scored as many other pairs (a trainer's earlier
steps; the fresh pool's rate on those is reported too). Their verdicts are
compared with each other and with the label the generator meant.
"""

from __future__ import annotations

import random
import statistics
import time
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

SEED = 20240601
PHRASES = [
    "Putting it together, the answer is $\\boxed{{{}}}$.",
    "So we get \\boxed{{{}}}.",
    "Therefore the final answer is $\\boxed{{{}}}$",
    "Adding the cases gives a total of $\\boxed{{{}}}$ ways.",
]


def _fraction_forms(rng: random.Random) -> tuple[str, list[str], str]:
    q = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 12])
    p = rng.choice([k for k in range(1, 3 * q) if k % q])
    from math import gcd

    g = gcd(p, q)
    p, q = p // g, q // g
    gold = f"\\frac{{{p}}}{{{q}}}"
    forms = [f"\\frac{{{p}}}{{{q}}}", f"\\dfrac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\frac{{{2 * p}}}{{{2 * q}}}"]
    if q in (2, 4, 5, 8):
        forms.append(f"{p / q:g}")
    wrong = f"\\frac{{{p + 1}}}{{{q}}}"
    return gold, forms, wrong


def make_pairs(n: int, seed: int = SEED) -> list[dict[str, Any]]:
    """n (completion, ground truth, expected verdict) triples, deterministic."""
    rng = random.Random(seed)
    pairs: list[dict[str, Any]] = []
    while len(pairs) < n:
        kind = rng.choice(["integer", "integer", "decimal", "fraction", "fraction", "expression", "expression",
                           "set", "interval"])
        if kind == "integer":
            whole = rng.randint(-50, 5000)
            gold, forms, wrong = str(whole), [str(whole), f"{whole}.0"], str(whole + rng.choice([-2, -1, 1, 3, 10]))
        elif kind == "decimal":
            value = rng.randint(1, 9999) / 100
            gold, forms, wrong = f"{value:g}", [f"{value:g}", f"{value:.2f}"], f"{value + 0.5:g}"
        elif kind == "fraction":
            gold, forms, wrong = _fraction_forms(rng)
        elif kind == "expression":
            a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
            choice = rng.randrange(4)
            if choice == 0:
                gold, forms, wrong = f"{a}\\sqrt{{{b}}}", [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}"], \
                    f"{a + 1}\\sqrt{{{b}}}"
            elif choice == 1:
                gold, forms, wrong = f"\\frac{{{a}\\pi}}{{{b}}}", [f"\\frac{{{a}\\pi}}{{{b}}}",
                                                                    f"{a}\\pi/{b}"], f"\\frac{{{a}\\pi}}{{{b + 1}}}"
            elif choice == 2:
                gold = f"x^2+{2 * a}x+{a * a}"
                forms, wrong = [f"(x+{a})^2", f"x^2 + {2 * a}x + {a * a}"], f"(x+{a + 1})^2"
            else:
                gold, forms, wrong = f"{a}+{b}i", [f"{a}+{b}i", f"{b}i+{a}"], f"{a}-{b}i"
        elif kind == "set":
            items = sorted(rng.sample(range(-9, 20), rng.randint(2, 4)))
            shuffled = items[:]
            rng.shuffle(shuffled)
            gold = "\\{" + ", ".join(map(str, items)) + "\\}"
            forms = ["\\{" + ",".join(map(str, shuffled)) + "\\}", ", ".join(map(str, items))]
            wrong = "\\{" + ", ".join(map(str, [*items[:-1], items[-1] + 1])) + "\\}"
        else:
            lo, hi = sorted(rng.sample(range(-10, 10), 2))
            gold = f"({lo}, {hi}]"
            forms, wrong = [f"({lo},{hi}]", f"\\left({lo}, {hi}\\right]"], f"[{lo}, {hi}]"
        correct = rng.random() >= 0.2
        answer = rng.choice(forms) if correct else wrong
        completion = f"We work through the problem step by step. {rng.choice(PHRASES).format(answer)}"
        pairs.append({"kind": kind, "completion": completion, "ground_truth": gold, "expected": correct})
    return pairs


def math_verify_check(completion: str, gold: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(f"${gold}$"), parse(completion)))


def run(client: Any, *, quick: bool, pairs: int | None = None, cpu: CpuMeter | None = None) -> BenchResult:
    from sandboxd_client import math_job

    total = pairs or (100 if quick else 500)
    round_count = 2 if quick else 4
    items = make_pairs(total)
    jobs = [math_job(p["completion"], p["ground_truth"]) for p in items]
    spans = common.spans(total, round_count)
    chunk = spans[0][1] - spans[0][0]  # a full round: the batch hint

    # Warm-up as a trainer's earlier steps: as many other pairs as are
    # measured, through both sides. Math-Verify keeps its parse caches and its
    # one warm heap in-process; sandboxd's math servers (one per sandbox,
    # forked from the math pool's zygote) copy the pages they write on first use,
    # which a run pays once per server and 500 jobs (README: where the time goes).
    # The fresh pool's first batch is timed and reported too.
    warm_items = make_pairs(total, seed=SEED + 1)
    t0 = time.perf_counter()
    for p in warm_items:
        math_verify_check(p["completion"], p["ground_truth"])
    warm_inprocess = time.perf_counter() - t0
    client.set_batch_hint(chunk, pools=["math"])
    wait_pool_settled(client, timeout=180.0)
    t0 = time.perf_counter()
    client.score_batch([math_job(p["completion"], p["ground_truth"]) for p in warm_items])
    warm_sandboxd = time.perf_counter() - t0
    status = wait_pool_settled(client, timeout=180.0)
    log(f"math: warm-up done ({total} other pairs: Math-Verify {total / warm_inprocess:.0f} pairs/s, "
        f"sandboxd's fresh pool {total / warm_sandboxd:.0f} pairs/s); pool {pool_state(status, 'math')}")

    rounds = alternate("math", spans, {
        "sandboxd": lambda lo, hi: client.score_batch(jobs[lo:hi]),
        "math_verify": lambda lo, hi: [math_verify_check(p["completion"], p["ground_truth"]) for p in items[lo:hi]],
    }, cpu or CpuMeter(), unit="pairs")
    seconds, cpu_used = rounds.seconds, rounds.cpu
    verdicts: dict[str, list[bool]] = {"sandboxd": [False] * total, "math_verify": [False] * total}
    infra = 0
    run_seconds: list[float] = []
    for lo, results in rounds.outputs["sandboxd"]:
        for offset, x in enumerate(results):
            verdicts["sandboxd"][lo + offset] = x.ok and x.reward == 1.0
            infra += int(x.is_infrastructure_failure)
            run_seconds.append(x.timings.run_seconds)
    for lo, checks in rounds.outputs["math_verify"]:
        verdicts["math_verify"][lo:lo + len(checks)] = checks
    pool = pool_state(client.pool_status(), "math")

    rate = {side: total / s for side, s in seconds.items()}
    speedup = ratio(rate["sandboxd"], rate["math_verify"])
    expected = [p["expected"] for p in items]
    accuracy = {side: sum(v == e for v, e in zip(vs, expected, strict=True)) / total for side, vs in verdicts.items()}
    agreement = sum(a == b for a, b in zip(verdicts["sandboxd"], verdicts["math_verify"], strict=True)) / total
    disagreements = [
        {"completion": items[i]["completion"], "ground_truth": items[i]["ground_truth"],
         "expected": expected[i], "sandboxd": verdicts["sandboxd"][i], "math_verify": verdicts["math_verify"][i]}
        for i in range(total) if verdicts["sandboxd"][i] != verdicts["math_verify"][i]
    ]
    result = BenchResult(
        name="math",
        title=f"math: {total} (completion, ground truth) pairs, throughput",
        columns=["verifier", "pairs", "seconds", "pairs/s", "vs Math-Verify", "matches label"],
    )
    result.rows = [
        ["Math-Verify in-process, 1 thread (no isolation)", str(total), fmt(seconds["math_verify"], 2),
         fmt(rate["math_verify"], 1), "1.00x", f"{accuracy['math_verify']:.1%}"],
        ["sandboxd score_batch (sync client)", str(total), fmt(seconds["sandboxd"], 2), fmt(rate["sandboxd"], 1),
         fmt_ratio(speedup), f"{accuracy['sandboxd']:.1%}"],
    ]
    result.targets = [Target("math throughput", "no slower than Math-Verify in-process (>= 1.0x)",
                             f"{speedup:.2f}x ({rate['sandboxd']:.0f} vs {rate['math_verify']:.0f} pairs/s)",
                             speedup >= 1.0)]
    sandbox_ms = statistics.median(run_seconds) * 1000 if run_seconds else float("nan")
    result.notes.append(f"median per pair: sandboxd {sandbox_ms:.1f} ms in the sandbox (jobs run concurrently), "
                        f"Math-Verify {seconds['math_verify'] / total * 1000:.1f} ms (serial)")
    result.notes.append(f"warm-up on {total} other pairs first (a trainer's earlier steps): Math-Verify "
                        f"{total / warm_inprocess:.1f} pairs/s, sandboxd's fresh pool {total / warm_sandboxd:.1f} "
                        f"pairs/s ({ratio(warm_inprocess, warm_sandboxd):.2f}x)")
    result.notes.append(cpu_note("sandboxd", cpu_used["sandboxd"], total, ["sandboxes", "daemon", "client"]))
    result.notes.append(cpu_note("Math-Verify", cpu_used["math_verify"], total, ["client"]))
    result.notes.append(f"verdicts agree on {agreement:.1%} of pairs; {infra} infrastructure failures; "
                        f"pool had {pool.get('ready')} ready sandboxes")
    for d in disagreements[:3]:
        result.notes.append(f"  disagree: gt={d['ground_truth']!r} completion=...{d['completion'][-40:]!r} "
                            f"sandboxd={d['sandboxd']} math_verify={d['math_verify']} label={d['expected']}")
    kinds: dict[str, int] = {}
    for p in items:
        kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
    result.data = {"pairs": total, "rounds": len(spans), "kinds": kinds, "seconds": seconds, "pairs_per_s": rate,
                   "accuracy_vs_label": accuracy, "agreement": agreement, "infrastructure_failures": infra,
                   "disagreements": disagreements[:50], "pool": pool,
                   "math_verify_warmup_seconds": warm_inprocess, "median_sandbox_run_ms": sandbox_ms,
                   "cpu_seconds": cpu_used}
    return result
