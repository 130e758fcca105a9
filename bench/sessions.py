"""`sessions`: session open latency from a warm pool vs a cold container, and memory per idle session.

Warm side: the trainer's hint (`sessions=N`) sizes the sessions pool, the
bench waits until the pool has reached the target that hint gives it (N
slots plus the daemon's headroom, whatever its slots per sandbox), then
opens N sessions one after
another, timing each Open (the RPC, the agent forking the session's
interpreter from the warm zygote, the answer). Each session then runs one
trivial cell, so that it is a session that has been used, and all stay
open while the memory is read.

Cold side, the baseline a session would pay without a pool: `docker run`
of the same python image with the same network isolation, until an
interpreter has run a first statement (`python3 -c pass`), container
removed after.

Memory: the sessions pool's containers as `docker stats` counts them
(cgroup usage minus inactive page cache), read before the sessions are
opened and again with all N open and idle; the difference divided by N.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from bench.common import BenchResult, Target, fmt, fmt_ratio, log, ratio, summary
from sandboxd.backend import LABEL_NODE, LABEL_POOL

MB = 1_000_000  # decimal, as the target is stated
SETTLE_SECONDS = 3.0


def _pool_memory(node: str | None) -> tuple[int, int]:
    """(bytes, containers) of the sessions pool's sandboxes, cache excluded (as bench/ready.py reads them)."""
    import docker

    from sandboxd import config as config_module
    from sandboxd.backend import DockerBackend

    settings = config_module.load(environ={}).docker
    backend = DockerBackend(settings.url, settings.timeout_seconds)
    filters = {"label": [f"{LABEL_POOL}=sessions"] + ([f"{LABEL_NODE}={node}"] if node else [])}

    def usage(container_id: str) -> int | None:
        try:
            return max(0, backend.memory_usage(container_id))
        except docker.errors.APIError:  # gone since it was listed
            return None

    try:
        ids = [container["Id"] for container in backend.api.containers(filters=filters)]
        with concurrent.futures.ThreadPoolExecutor(8) as executor:
            usages = [u for u in executor.map(usage, ids) if u is not None]
    finally:
        backend.client.close()
    return sum(usages), len(usages)


def _cold_opens(image: str, runs: int) -> list[float]:
    import docker

    client = docker.from_env()
    seconds = []
    try:
        for _ in range(runs):
            t0 = time.monotonic()
            client.containers.run(image, ["python3", "-c", "pass"], network_mode="none", remove=True,
                                  cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True)
            seconds.append(time.monotonic() - t0)
    finally:
        client.close()
    return seconds


def _wait_slots(client: Any, wanted: int, timeout: float) -> Any:
    """Wait until the sessions pool has reached its target (which counts the session hint and slots per sandbox)."""
    deadline = time.monotonic() + timeout
    while True:
        status = client.pool_status()
        pool = next((p for p in status.pools if p.name == "sessions"), None)
        if pool is None:
            raise RuntimeError("the daemon has no sessions pool (sessions.enabled = false?)")
        if pool.ready >= pool.target and not pool.starting:
            return pool
        if time.monotonic() > deadline:
            raise RuntimeError(f"sessions pool not sized for {wanted} after {timeout:.0f} s: {pool}")
        time.sleep(0.5)


def run(client: Any, *, quick: bool = False, node: str | None = None) -> BenchResult:
    sessions = 32 if quick else 128
    cold_runs = 3 if quick else 8
    result = BenchResult(
        name="sessions",
        title=f"sessions: open latency, warm pool of {sessions} vs cold container; memory per idle session",
        columns=["what", "n", "p50 ms", "p99 ms", "mean ms"],
    )
    log(f"sessions: hinting {sessions} sessions and waiting for the pool")
    client.set_batch_hint(0, sessions=sessions)
    pool = _wait_slots(client, sessions, timeout=300.0)
    image = pool.image
    time.sleep(SETTLE_SECONDS)
    before, containers = _pool_memory(node)
    opened = []
    open_seconds = []
    try:
        for _ in range(sessions):
            t0 = time.monotonic()
            opened.append(client.open_session())
            open_seconds.append(time.monotonic() - t0)
        for session in opened:
            cell = session.run("1 + 1")
            if cell.value != "2":
                raise RuntimeError(f"a session answered {cell}")
        time.sleep(SETTLE_SECONDS)
        after, containers_after = _pool_memory(node)
    finally:
        for session in opened:
            session.close()
        client.set_batch_hint(0, sessions=0)
    log(f"sessions: {cold_runs} cold containers of {image}")
    cold_seconds = _cold_opens(image, cold_runs)
    warm, cold = summary(open_seconds), summary(cold_seconds)
    result.rows.append(["open a session (warm pool)", str(warm["n"]), fmt(warm["p50_ms"]), fmt(warm["p99_ms"]),
                        fmt(warm["mean_ms"])])
    result.rows.append(["docker run, first statement (cold)", str(cold["n"]), fmt(cold["p50_ms"]),
                        fmt(cold["p99_ms"]), fmt(cold["mean_ms"])])
    speedup = ratio(cold["p50_ms"], warm["p50_ms"])
    per_session = (after - before) / sessions if containers and containers_after == containers else float("nan")
    result.rows.append(["cold / warm (p50)", "", fmt_ratio(speedup), fmt_ratio(ratio(cold["p99_ms"],
                                                                                     warm["p99_ms"])), ""])
    result.notes.append(f"memory of the sessions pool ({containers} sandboxes): {before / MB:.1f} MB with no "
                        f"session, {after / MB:.1f} MB with {sessions} idle sessions open: "
                        f"{per_session / MB:.2f} MB per session")
    if containers_after != containers:
        result.notes.append(f"the pool changed size while measuring ({containers} -> {containers_after} "
                            "sandboxes); memory per session not computed")
    result.data = {"warm_open": warm, "cold_open": cold, "memory_before_bytes": before,
                   "memory_after_bytes": after, "per_session_bytes": per_session, "sessions": sessions}
    result.targets.append(Target("memory per idle session", "<= 10 MB", f"{per_session / MB:.2f} MB",
                                 None if per_session != per_session else per_session <= 10 * MB))
    result.targets.append(Target("session open, warm vs cold", "warm faster", fmt_ratio(speedup),
                                 None if speedup != speedup else speedup > 1))
    return result
