"""`langs`: stdin/stdout jobs in every language through sandboxd vs a naive `docker exec` judge.

The program of each job is one CodeContests-shaped problem (n lines of
"a b", print each sum; five cases, the largest 10,000 lines), solved in each
language the daemon lists. A job's time is its compile (C, C++, Java, Go,
Rust) plus its five runs; compiles take most of it.

- sandboxd: `client.run(code_job(...))` on the daemon's langs pool: a warm
  sandbox, the compile and each case in a fresh process under a uid of its
  own, with limits.
- baseline: what a judge without a daemon does: one `docker exec -i` per job
  into one of a few running containers of the same image
  (`sandboxd.images.image_tag("langs")`), each with a sandbox's CPU share
  (`--cpus`, 1 by default), where a small driver writes the source, compiles
  it and runs the cases with `subprocess.run`, no per-run isolation, as
  root. It uses the daemon's own commands and environment
  (`code.LANGUAGES`), so both sides use the image's precompiled C++ header,
  javac's class-data archive and Go's standard library cache: the
  comparison is of everything around the toolchain, not of the toolchain.

Two parts: serial jobs per language, alternating the sides job by job (p50
latency), then a batch of every language's jobs at once (throughput:
`score_batch` against a thread pool of 2x cores of `docker exec`, into as
many containers as the daemon's pool then holds sandboxes), in rounds that
alternate which side goes first. No target in the issues; the ratios are
reported.
"""

from __future__ import annotations

import json
import os
import queue
import random
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import (
    BenchResult,
    CpuMeter,
    alternate,
    cpu_note,
    docker_container,
    fmt,
    fmt_ratio,
    log,
    pool_state,
    ratio,
    spans,
    summary,
    wait_pool_settled,
)

TIMEOUT_SECONDS = 10.0
POOL = "langs"

SOLUTIONS = {
    "cpp": """\
#include <bits/stdc++.h>
using namespace std;
int main() {
    ios::sync_with_stdio(false);
    cin.tie(nullptr);
    int n;
    cin >> n;
    for (int i = 0; i < n; i++) {
        long long a, b;
        cin >> a >> b;
        cout << a + b << '\\n';
    }
}
""",
    "c": """\
#include <stdio.h>
int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 1;
    for (int i = 0; i < n; i++) {
        long long a, b;
        if (scanf("%lld %lld", &a, &b) != 2) return 1;
        printf("%lld\\n", a + b);
    }
    return 0;
}
""",
    "java": """\
import java.io.*;
import java.util.*;

public class Main {
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        int n = Integer.parseInt(in.readLine().trim());
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < n; i++) {
            StringTokenizer st = new StringTokenizer(in.readLine());
            long a = Long.parseLong(st.nextToken()), b = Long.parseLong(st.nextToken());
            out.append(a + b).append('\\n');
        }
        System.out.print(out);
    }
}
""",
    "go": """\
package main

import (
\t"bufio"
\t"fmt"
\t"os"
)

func main() {
\tin := bufio.NewReader(os.Stdin)
\tout := bufio.NewWriter(os.Stdout)
\tdefer out.Flush()
\tvar n int
\tfmt.Fscan(in, &n)
\tfor i := 0; i < n; i++ {
\t\tvar a, b int64
\t\tfmt.Fscan(in, &a, &b)
\t\tfmt.Fprintln(out, a+b)
\t}
}
""",
    "rust": """\
use std::io::{self, Read, Write};

fn main() {
    let mut s = String::new();
    io::stdin().read_to_string(&mut s).unwrap();
    let mut it = s.split_ascii_whitespace().map(|x| x.parse::<i64>().unwrap());
    let n = it.next().unwrap() as usize;
    let mut out = String::new();
    for _ in 0..n {
        let (a, b) = (it.next().unwrap(), it.next().unwrap());
        out.push_str(&format!("{}\\n", a + b));
    }
    io::stdout().write_all(out.as_bytes()).unwrap();
}
""",
    "javascript": """\
const words = require("fs").readFileSync(0, "utf8").split(/\\s+/).filter(Boolean).map(BigInt);
const n = Number(words[0]);
const out = [];
for (let i = 0; i < n; i++) out.push((words[1 + 2 * i] + words[2 + 2 * i]).toString());
console.log(out.join("\\n"));
""",
    "typescript": """\
const words: bigint[] = require("fs").readFileSync(0, "utf8").split(/\\s+/).filter(Boolean).map(BigInt);
const n: number = Number(words[0]);
const out: string[] = [];
for (let i = 0; i < n; i++) out.push((words[1 + 2 * i] + words[2 + 2 * i]).toString());
console.log(out.join("\\n"));
""",
    "bash": """\
read -r n
for ((i = 0; i < n; i++)); do
    read -r a b
    echo $((a + b))
done
""",
    "python": """\
import sys

words = sys.stdin.buffer.read().split()
n = int(words[0])
print("\\n".join(str(int(words[1 + 2 * i]) + int(words[2 + 2 * i])) for i in range(n)))
""",
}

# The baseline's judge, run by `python3 -c` in the container: the job as JSON on stdin, the tally on stdout.
DRIVER = """\
import json, os, shutil, subprocess, sys, tempfile, time
job = json.load(sys.stdin)
work = tempfile.mkdtemp(dir="/tmp")
env = dict(os.environ, **{k: v.replace("{workdir}", work) for k, v in job["env"].items()})
with open(os.path.join(work, job["source_file"]), "w") as f:
    f.write(job["source"])
tally = {"compile_seconds": 0.0, "passed": 0}
try:
    if job["compile"]:
        t0 = time.perf_counter()
        done = subprocess.run(job["compile"], cwd=work, env=env, capture_output=True, timeout=60)
        tally["compile_seconds"] = time.perf_counter() - t0
        if done.returncode:
            tally["error"] = done.stderr.decode(errors="replace")[-500:]
            job["cases"] = []
    for stdin, expected in job["cases"]:
        try:
            done = subprocess.run(job["run"], cwd=work, env=env, input=stdin.encode(), capture_output=True,
                                  timeout=job["timeout"])
        except subprocess.TimeoutExpired:
            continue
        tally["passed"] += done.returncode == 0 and done.stdout.split() == expected.encode().split()
finally:
    shutil.rmtree(work, ignore_errors=True)
print(json.dumps(tally))
"""


def make_cases() -> list[tuple[str, str]]:
    """Five cases, 1 to 10,000 lines; the same every run."""
    rng = random.Random(20261126)
    cases = []
    for n in (1, 3, 10, 1000, 10_000):
        pairs = [(rng.randint(-10**17, 10**17), rng.randint(-10**17, 10**17)) for _ in range(n)]
        stdin = f"{n}\n" + "".join(f"{a} {b}\n" for a, b in pairs)
        cases.append((stdin, "".join(f"{a + b}\n" for a, b in pairs)))
    return cases


def _baseline_job(language: str, cases: list[tuple[str, str]]) -> bytes:
    from sandboxd.verifiers.code import LANGUAGES

    spec = LANGUAGES[language]
    return json.dumps({
        "source_file": spec.source_file, "source": SOLUTIONS[language], "compile": spec.compile_argv,
        "run": spec.run_argv, "env": dict(spec.env), "cases": cases, "timeout": TIMEOUT_SECONDS,
    }).encode()


def run(client: Any, *, quick: bool, cpu: CpuMeter | None = None) -> BenchResult:
    from sandboxd_client import code_job

    from sandboxd.config import SandboxConfig
    from sandboxd.images import image_tag

    available = set(client.info().languages)
    languages = [lang for lang in SOLUTIONS if lang in available]
    if not languages:
        raise RuntimeError(f"the daemon lists none of {', '.join(SOLUTIONS)} (is the langs image in pool.images?)")
    cases = make_cases()
    tests = {"inputs": [stdin for stdin, _ in cases], "outputs": [out for _, out in cases]}
    sandbox_jobs = {lang: code_job(f"```{lang}\n{SOLUTIONS[lang]}```", tests, language=lang, timeout=TIMEOUT_SECONDS)
                    for lang in languages}
    baseline_jobs = {lang: _baseline_job(lang, cases) for lang in languages}
    image = image_tag(POOL)
    per_language = 3 if quick else 8
    batch_rounds = 2 if quick else 4
    batch = [lang for lang in languages for _ in range(2 if quick else 4)]
    threads = 2 * (os.cpu_count() or 1)

    containers: queue.SimpleQueue[str] = queue.SimpleQueue()
    names: list[str] = []
    try:
        # As many containers as the batch has threads, each with a sandbox's CPU share, as the
        # daemon's pool has sandboxes; serial jobs take them in turn.
        log(f"langs: starting {threads} {image} containers for docker exec")
        for _ in range(threads):
            # The JVM and V8 start with several threads, which a container with both cores
            # finishes sooner than a sandbox with one.
            names.append(docker_container(image, "--cpus", str(SandboxConfig().cpus)))
            containers.put(names[-1])

        def baseline(lang: str) -> tuple[float, dict[str, Any]]:
            container = containers.get()
            try:
                t0 = time.perf_counter()
                done = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", DRIVER],
                                      input=baseline_jobs[lang], capture_output=True, timeout=300)
                elapsed = time.perf_counter() - t0
            finally:
                containers.put(container)
            if done.returncode:
                raise RuntimeError(f"docker exec {lang}: rc={done.returncode} {done.stderr[-300:]!r}")
            return elapsed, json.loads(done.stdout)

        def in_sandboxd(lang: str) -> tuple[float, Any]:
            t0 = time.perf_counter()
            result = client.run(sandbox_jobs[lang])
            return time.perf_counter() - t0, result

        status = client.set_batch_hint(len(batch), pools=[POOL])
        log(f"langs: batch hint {len(batch)}; waiting for the pool (target {pool_state(status, POOL).get('target')})")
        wait_pool_settled(client, timeout=300.0)
        for lang in languages:  # warm-up: the toolchains' files into the page cache, on both sides
            in_sandboxd(lang)
            baseline(lang)

        serial: dict[str, dict[str, list[float]]] = {lang: {"sandboxd": [], "baseline": [], "in_sandbox": [],
                                                            "baseline_compile": []} for lang in languages}
        passed = {"sandboxd": 0, "baseline": 0}
        failures: list[str] = []
        for i in range(per_language):
            for lang in languages:
                order = ("sandboxd", "baseline") if i % 2 == 0 else ("baseline", "sandboxd")
                for side in order:
                    if side == "sandboxd":
                        seconds, result = in_sandboxd(lang)
                        serial[lang]["in_sandbox"].append(result.timings.run_seconds)
                        passed["sandboxd"] += result.ok
                        if not result.ok and len(failures) < 5:
                            failures.append(f"sandboxd {lang}: {result.status.name} {result.message[:160]}")
                    else:
                        seconds, tally = baseline(lang)
                        serial[lang]["baseline_compile"].append(tally["compile_seconds"])
                        passed["baseline"] += tally["passed"] == len(cases)
                        if tally["passed"] != len(cases) and len(failures) < 5:
                            failures.append(f"docker exec {lang}: {tally}")
                    serial[lang][side].append(seconds)
            log(f"langs: serial round {i + 1}/{per_language}: " + ", ".join(
                f"{lang} {statistics.median(serial[lang]['sandboxd']) * 1000:.0f}/"
                f"{statistics.median(serial[lang]['baseline']) * 1000:.0f} ms" for lang in languages))

        wait_pool_settled(client, timeout=120.0)
        pool_before = pool_state(client.pool_status(), POOL)
        batched = batch * batch_rounds
        batch_jobs = [sandbox_jobs[lang] for lang in batched]
        with ThreadPoolExecutor(threads) as executor:
            rounds = alternate("langs batch", spans(len(batched), batch_rounds), {
                "sandboxd": lambda lo, hi: client.score_batch(batch_jobs[lo:hi]),
                "baseline": lambda lo, hi: list(executor.map(baseline, batched[lo:hi])),
            }, cpu or CpuMeter())
    finally:
        client.set_batch_hint(0, pools=[POOL])
        if names:
            subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=120)

    for _lo, results in rounds.outputs["sandboxd"]:
        passed["sandboxd"] += sum(1 for x in results if x.ok)
    for _lo, outcomes in rounds.outputs["baseline"]:
        passed["baseline"] += sum(1 for _, tally in outcomes if tally["passed"] == len(cases))
    total = len(languages) * per_language + len(batch) * batch_rounds

    result = BenchResult(
        name="langs",
        title=f"langs: one stdin/stdout problem (5 cases, up to 10,000 lines) per language; serial p50 of "
              f"{per_language} jobs each, alternating, then batches of {len(batch)}",
        columns=["language", "sandboxd p50 ms", "in sandbox p50 ms", "docker exec p50 ms", "its compile p50 ms",
                 "docker exec / sandboxd"],
    )
    stats: dict[str, dict[str, float]] = {}
    for lang in languages:
        mine, theirs = summary(serial[lang]["sandboxd"]), summary(serial[lang]["baseline"])
        in_sandbox = statistics.median(serial[lang]["in_sandbox"]) * 1000
        compile_ms = statistics.median(serial[lang]["baseline_compile"]) * 1000
        stats[lang] = {"sandboxd_p50_ms": mine["p50_ms"], "in_sandbox_p50_ms": in_sandbox,
                       "docker_exec_p50_ms": theirs["p50_ms"], "docker_exec_compile_p50_ms": compile_ms}
        result.rows.append([lang, fmt(mine["p50_ms"]), fmt(in_sandbox), fmt(theirs["p50_ms"]),
                            fmt(compile_ms) if compile_ms else "-",
                            fmt_ratio(ratio(theirs["p50_ms"], mine["p50_ms"]))])
    rate = {side: len(batch) * batch_rounds / s for side, s in rounds.seconds.items()}
    result.rows.append([f"batch of {len(batch)}, all languages (jobs/s)", fmt(rate["sandboxd"], 2), "",
                        fmt(rate["baseline"], 2), f"{threads} threads", fmt_ratio(ratio(rate["sandboxd"],
                                                                                          rate["baseline"]))])
    result.notes.append(f"passed: sandboxd {passed['sandboxd']}/{total}, docker exec {passed['baseline']}/{total}")
    result.notes += [f"  {line}" for line in failures]
    result.notes.append("its compile: the compile step alone, timed by the driver inside the container")
    result.notes.append(f"batch: the langs pool held {pool_before.get('ready')} ready sandboxes, against "
                        f"{threads} containers for docker exec")
    jobs = len(batch) * batch_rounds
    result.notes.append(cpu_note("sandboxd batch", rounds.cpu["sandboxd"], jobs, ["sandboxes", "daemon", "client"]))
    result.notes.append(cpu_note("docker exec batch", rounds.cpu["baseline"], jobs, ["client"]))
    result.data = {"languages": languages, "per_language": per_language, "serial_ms": stats,
                   "serial_samples_s": serial, "batch": batch, "batch_rounds": batch_rounds,
                   "batch_jobs_per_s": rate, "batch_seconds": rounds.seconds, "cpu_seconds": rounds.cpu,
                   "passed": passed, "jobs": total, "failures": failures, "pool_before": pool_before,
                   "image": image}
    return result
