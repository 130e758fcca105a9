"""`latency`: a trivial Python job (`print(1)`), serial, sandboxd vs the ways people run code today.

Four contenders, interleaved call by call so that noise hits them alike:

- sandboxd: one `Run` RPC from the blocking client (a fork of the warm zygote
  inside a pooled sandbox, uid per run, limits, output capture);
- `docker exec <c> python3 -c 'print(1)'` into a running container of the
  same image (the obvious "sandbox" without a daemon);
- `subprocess.run(["/usr/bin/python3", "-c", ...])`: no isolation at all,
  the plain interpreter;
- the same with the machine's default `python3` (here a pyenv shim).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from bench.common import BenchResult, Target, default_python3, docker_container, fmt, fmt_ratio, log, ratio, summary

CODE = "print(1)"


def _timed_subprocess(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, timeout=60)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or done.stdout.strip() != b"1":
        raise RuntimeError(f"{argv[:3]} failed: rc={done.returncode} {done.stderr[-300:]!r}")
    return elapsed


def run(client: Any, *, quick: bool) -> BenchResult:
    from sandboxd_client import execute_job

    from sandboxd.images import image_tag

    image = image_tag("python")  # the tag the daemon's python pool runs
    rounds = 5 if quick else 10
    sandboxd_per_round = 20 if quick else 30
    others_per_round = 3 if quick else 5
    job = execute_job(CODE)
    # Where sandboxd's time goes, from the daemon's own timings of each job:
    # in the sandbox (agent: fork, run, reap, clean up; plus the control
    # socket round trip), in the daemon outside it, and on the wire + client.
    breakdown: dict[str, list[float]] = {"client_total": [], "daemon_total": [], "sandbox_run": []}

    def sandboxd_once() -> float:
        started = time.perf_counter()
        result = client.run(job)
        elapsed = time.perf_counter() - started
        if not result.ok or result.details.stdout.strip() != b"1":
            raise RuntimeError(f"sandboxd print(1) failed: {result.status!r} {result.message}")
        breakdown["client_total"].append(elapsed)
        breakdown["daemon_total"].append(result.timings.total_seconds)
        breakdown["sandbox_run"].append(result.timings.run_seconds)
        return elapsed

    machine_python = default_python3()
    contenders: dict[str, Any] = {"sandboxd": sandboxd_once}
    container = ""
    try:
        log("latency: starting a container for docker exec")
        container = docker_container(image)
        exec_argv = ["docker", "exec", container, "python3", "-c", CODE]
        contenders["docker_exec"] = lambda: _timed_subprocess(exec_argv)
        contenders["usr_bin_python3"] = lambda: _timed_subprocess(["/usr/bin/python3", "-c", CODE])
        if machine_python:
            contenders["default_python3"] = lambda: _timed_subprocess([machine_python, "-c", CODE])

        # Warm-up: first calls pay connection set-up, page cache, the shim's first resolution.
        for _ in range(5):
            for call in contenders.values():
                call()

        for values in breakdown.values():
            values.clear()
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        every = max(1, sandboxd_per_round // others_per_round)
        for r in range(rounds):
            for i in range(sandboxd_per_round):
                samples["sandboxd"].append(sandboxd_once())
                if i % every == 0:
                    for name, call in contenders.items():
                        if name != "sandboxd":
                            samples[name].append(call())
            log(f"latency: round {r + 1}/{rounds}: " + ", ".join(
                f"{n} p50 {summary(s)['p50_ms']:.1f} ms" for n, s in samples.items()))
    finally:
        if container:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)

    stats = {name: summary(values) for name, values in samples.items()}
    base = stats["sandboxd"]["p50_ms"]
    labels = {
        "sandboxd": "sandboxd Run RPC (sync client, unix socket)",
        "docker_exec": f"docker exec <{image}> python3 -c",
        "usr_bin_python3": "subprocess /usr/bin/python3 -c (no isolation)",
        "default_python3": f"subprocess {machine_python} -c (no isolation)",
    }
    result = BenchResult(
        name="latency",
        title="latency: trivial Python job print(1), serial, interleaved",
        columns=["contender", "n", "p50 ms", "p90 ms", "p99 ms", "mean ms", "p50 / sandboxd p50"],
    )
    for name, s in stats.items():
        result.rows.append([labels[name], str(s["n"]), fmt(s["p50_ms"], 2), fmt(s["p90_ms"], 2),
                            fmt(s["p99_ms"], 2), fmt(s["mean_ms"], 2), fmt_ratio(ratio(s["p50_ms"], base))])
    vs_python = ratio(stats["usr_bin_python3"]["p50_ms"], base)
    vs_docker = ratio(stats["docker_exec"]["p50_ms"], base)
    result.targets = [
        Target("latency p50", "<= 2 ms", f"{base:.2f} ms (p99 {stats['sandboxd']['p99_ms']:.2f} ms)", base <= 2.0),
        Target("latency vs plain interpreter", ">= 5x faster than /usr/bin/python3 subprocess",
               f"{vs_python:.2f}x", vs_python >= 5.0),
        Target("latency vs docker exec", ">= 40x faster", f"{vs_docker:.1f}x", vs_docker >= 40.0),
    ]
    parts = {name: summary(values)["p50_ms"] for name, values in breakdown.items()}
    result.notes.append(
        f"sandboxd p50 breakdown (daemon's own timings): in the sandbox {parts['sandbox_run']:.2f} ms, "
        f"daemon outside the sandbox {parts['daemon_total'] - parts['sandbox_run']:.2f} ms, "
        f"gRPC + client {parts['client_total'] - parts['daemon_total']:.2f} ms")
    if "default_python3" in stats:
        result.notes.append(f"vs the default python3 ({machine_python}): "
                            f"{ratio(stats['default_python3']['p50_ms'], base):.1f}x")
    result.data = {"stats": stats, "sandboxd_breakdown_p50_ms": parts, "default_python3": machine_python,
                   "image": image, "code": CODE,
                   "rounds": rounds}
    return result
