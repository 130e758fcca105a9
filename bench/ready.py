"""`ready`: time from `docker create` to an agent that answers, restored from a snapshot vs cold.

Measured directly with the daemon's own code (sandboxd.pool.Pool), so both
sides do exactly what a pool refill does: create the container, then either
copy the CRIU checkpoint in and `docker start --checkpoint`, or start it
cold and let the agent import and warm the verifier libraries; both end
when the agent has answered `hello` and `prepare` (which starts the math
pool's warm math servers). Restores and cold starts alternate, for the
python (code) pool and for the math pool.

Then the idle memory of every sandbox started, as `docker stats` counts it
(cgroup usage minus inactive page cache), a few seconds after it is ready.

When the bench started its own daemon, the daemon's Prometheus gauge
`sandboxd_sandbox_ready_seconds{pool,method}` (its last pool start of each
kind) is reported next to it as a cross-check.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench.common import (
    STATE_DIR,
    BenchResult,
    Target,
    fmt,
    fmt_ratio,
    log,
    ratio,
    scrape_metrics,
    summary,
    wait_pool_settled,
)

MB = 1_000_000  # decimal, as the target is stated
SETTLE_SECONDS = 3.0


def _cgroup_stat(container_id: str) -> dict[str, int]:
    """memory.stat of a container's cgroup (v1 or v2), {} when it cannot be read."""
    for path in (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.stat",
                 f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.stat"):
        try:
            with open(path) as f:
                return {k: int(v) for k, v in (line.split() for line in f if line.strip())}
        except (OSError, ValueError):
            continue
    return {}


PHASES = ("create", "install_checkpoint", "start")


def _host_busy_seconds() -> float:
    """CPU time the whole host has spent busy (all cores), from /proc/stat.

    A pool refills in the background, while jobs run: what a start costs the
    node's CPUs matters as much as how long it takes. Engine, containerd,
    CRIU and the agent are all counted; so is anything else running, which
    is why the bench waits for its daemon's pools to settle first.
    """
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _timed_backend(base: type) -> type:
    """The daemon's DockerBackend, timing each call that a sandbox start makes, by container."""

    class TimedBackend(base):
        phases: dict[str, dict[str, float]]

        def _note(self, container_id: str, phase: str, seconds: float) -> None:
            self.phases.setdefault(container_id, {})[phase] = seconds

        def create(self, spec: Any) -> str:
            t0 = time.monotonic()
            container_id = super().create(spec)
            self._note(container_id, "create", time.monotonic() - t0)
            return container_id

        def install_checkpoint(self, container_id: str, source: Any, name: str) -> None:
            t0 = time.monotonic()
            super().install_checkpoint(container_id, source, name)
            self._note(container_id, "install_checkpoint", time.monotonic() - t0)

        def start(self, container_id: str, checkpoint: str = "") -> None:
            t0 = time.monotonic()
            super().start(container_id, checkpoint)
            self._note(container_id, "start", time.monotonic() - t0)

    return TimedBackend


async def _measure(n: int, pool_name: str) -> dict[str, Any]:
    from sandboxd import config as config_module
    from sandboxd.backend import DockerBackend
    from sandboxd.images import image_tag
    from sandboxd.pool import Pool, stage_agent_code

    run_dir = tempfile.mkdtemp(prefix="sandboxd-bench-ready-")
    # Every start of this pool restores, whatever pool.restore = auto would pick here.
    config = config_module.load(environ={}, overrides={"sandbox.state_dir": STATE_DIR,
                                                       "sandbox.run_dir": run_dir, "pool.restore": "always"})
    cold_config = config_module.load(environ={}, overrides={"sandbox.state_dir": STATE_DIR,
                                                            "sandbox.run_dir": run_dir,
                                                            "pool.snapshots": False})
    backend = _timed_backend(DockerBackend)(config.docker.url, config.docker.timeout_seconds)
    backend.phases = {}
    code_dir, code_key = stage_agent_code(STATE_DIR)
    instance = f"bench{os.getpid() % 100000}"
    image = image_tag("python")
    common: dict[str, Any] = {"instance": instance, "node": f"bench-ready-{instance}", "code_dir": code_dir,
                              "code_key": code_key}
    restoring = Pool(pool_name, image, backend, config, **common)
    cold = Pool(pool_name, image, backend, cold_config, **common)
    out: dict[str, Any] = {"pool": pool_name, "image": image, "restore_s": [], "cold_s": [],
                           "host_cpu_s": {"restore": [], "cold": []},
                           "rss": {"restore": [], "cold": []}, "phases": {"restore": [], "cold": []}}
    started: list[tuple[str, Any, Any]] = []
    try:
        log(f"ready: {pool_name} pool: preparing the snapshot (built once per image and agent code, then reused)")
        t0 = time.monotonic()
        await restoring.snapshots.prepare(restoring.snapshot_key, restoring._start_template)
        out["snapshot_prepare_s"] = time.monotonic() - t0
        out["snapshot_state"] = restoring.snapshots.state
        if not restoring.snapshots.usable:
            out["error"] = f"snapshot not usable: {restoring.snapshots.state}"
        for i in range(n):
            order = [("restore", restoring), ("cold", cold)] if i % 2 == 0 else [("cold", cold),
                                                                                 ("restore", restoring)]
            for method, pool in order:
                if method == "restore" and not restoring.snapshots.usable:
                    continue
                busy_before = _host_busy_seconds()
                sandbox = await pool._start_sandbox()
                out["host_cpu_s"][method].append(_host_busy_seconds() - busy_before)
                if sandbox.started_by != method:
                    raise RuntimeError(f"asked for a {method} start, got {sandbox.started_by}")
                out[f"{method}_s"].append(sandbox.ready_seconds)
                phases = dict(backend.phases.get(sandbox.container_id, {}))
                # What is left after Docker's calls: the agent coming up (cold: importing
                # and warming the verifiers; restore: CRIU already did it) and polling.
                phases["until_agent_answers"] = sandbox.ready_seconds - sum(phases.values())
                out["phases"][method].append(phases)
                started.append((method, sandbox, pool))
            last_restore = out["restore_s"][-1] * 1000 if out["restore_s"] else float("nan")
            log(f"ready: {pool_name} pool: {i + 1}/{n}: restore {fmt(last_restore, 0)} ms, "
                f"cold {fmt(out['cold_s'][-1] * 1000, 0)} ms")
        # Idle memory: every sandbox just sat there; give the last one a moment too.
        await asyncio.sleep(SETTLE_SECONDS)
        log(f"ready: reading docker stats of {len(started)} idle sandboxes")
        with concurrent.futures.ThreadPoolExecutor(8) as executor:
            usages = list(executor.map(lambda item: backend.memory_usage(item[1].container_id), started))
        for (method, sandbox, _pool), usage in zip(started, usages, strict=False):
            stat = _cgroup_stat(sandbox.container_id)
            out["rss"][method].append({"docker_stats_bytes": usage,
                                       "rss_bytes": stat.get("total_rss", stat.get("anon", 0)),
                                       "cache_bytes": stat.get("total_cache", stat.get("file", 0))})
    finally:
        await asyncio.gather(*(pool._remove(sandbox) for _m, sandbox, pool in started), return_exceptions=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


# The python pool runs code jobs; the math pool (same image) warms sympy and
# Math-Verify, the warm-up the ready target is stated for.
POOLS = ("python", "math")


def run(client: Any, *, quick: bool, metrics_url: str | None = None) -> BenchResult:
    n = 2 if quick else 4
    # The bench's own daemon fills its pools when it starts (restores and cold
    # starts of its own); measured alongside them, a start here competed for the
    # same 2 cores and the engine (the daemon's first restore took 4 s).
    wait_pool_settled(client)
    measured = {name: asyncio.run(_measure(n, name)) for name in POOLS}
    result = BenchResult(
        name="ready",
        title="ready: create -> agent answers, snapshot restore vs cold start + warm-up (python image)",
        columns=["pool", "start", "n", "median ms", "min ms", "max ms", "vs restore", "host CPU ms",
                 "idle MB (docker stats)", "idle RSS MB"],
    )
    daemon_seen: dict[tuple[str, str], float] = {}
    if metrics_url:
        try:
            for labels, value in scrape_metrics(metrics_url, "sandboxd_sandbox_ready_seconds").items():
                named = dict(labels)
                if named.get("pool") in POOLS and value > 0:
                    daemon_seen[(named["pool"], named.get("method", "?"))] = value
        except OSError as exc:
            result.notes.append(f"could not read the daemon's metrics at {metrics_url}: {exc}")
    data: dict[str, Any] = {"daemon_metrics": {f"{pool}/{method}": v for (pool, method), v in daemon_seen.items()}}
    for name in POOLS:
        pool_measured = measured[name]
        restore, cold = pool_measured["restore_s"], pool_measured["cold_s"]
        r_sum, c_sum = summary(restore), summary(cold)

        def mem(method: str, key: str, pool_measured: dict[str, Any] = pool_measured) -> float:
            values = [item[key] for item in pool_measured["rss"][method]]
            return statistics.median(values) / MB if values else float("nan")

        def host_cpu_ms(method: str, pool_measured: dict[str, Any] = pool_measured) -> float:
            values = pool_measured["host_cpu_s"][method]
            return statistics.median(values) * 1000 if values else float("nan")

        for label, method, s in (("restore from snapshot", "restore", r_sum), ("cold start + warm-up", "cold", c_sum)):
            result.rows.append([name, label, str(s["n"]), fmt(s["p50_ms"], 0), fmt(s["min_ms"], 0),
                                fmt(s["max_ms"], 0), fmt_ratio(ratio(s["p50_ms"], r_sum["p50_ms"])),
                                fmt(host_cpu_ms(method), 0),
                                fmt(mem(method, "docker_stats_bytes"), 1), fmt(mem(method, "rss_bytes"), 1)])
        for (pool, method), value in sorted(daemon_seen.items()):
            if pool == name:
                result.rows.append([name, f"daemon's last {method} (Prometheus)", "1", fmt(value * 1000, 0),
                                    "", "", "", "", "", ""])
        share = ratio(r_sum["p50_ms"], c_sum["p50_ms"])
        idle_all = [item["docker_stats_bytes"] for items in pool_measured["rss"].values() for item in items]
        result.targets.append(
            Target(f"ready ({name} pool): restore vs cold+warm-up", "restore <= 1/3 of cold start + warm-up",
                   f"{share:.2f} of cold ({r_sum['p50_ms']:.0f} vs {c_sum['p50_ms']:.0f} ms median)"
                   if restore else pool_measured.get("error", "no restore"),
                   # The target is stated for the math image's warm-up.
                   ((share <= 1 / 3) if restore else None) if name == "math" else None))
        result.targets.append(
            Target(f"idle memory per {name} sandbox", "<= 30 MB (docker stats)",
                   f"{mem('restore', 'docker_stats_bytes'):.1f} MB restored, "
                   f"{mem('cold', 'docker_stats_bytes'):.1f} MB cold (median; "
                   f"max {max(idle_all) / MB if idle_all else float('nan'):.1f} MB)",
                   # Code sandboxes are the pool sized to the rollout batch; a math
                   # sandbox holds sympy and Math-Verify by design (about 80 MB).
                   ((statistics.median(idle_all) / MB <= 30.0) if idle_all else None) if name == "python" else None))
        for method in ("restore", "cold"):
            runs = pool_measured["phases"][method]
            if runs:
                names = [p for p in (*PHASES, "until_agent_answers") if any(p in r for r in runs)]
                parts = [f"{p} {statistics.median(r.get(p, 0.0) for r in runs) * 1000:.0f}" for p in names]
                result.notes.append(f"{name} {method} phases, median ms: " + ", ".join(parts))
        if pool_measured.get("error"):
            result.notes.append(f"{name}: {pool_measured['error']}")
        result.notes.append(f"{name} snapshot: {pool_measured.get('snapshot_state')} (prepare took "
                            f"{pool_measured.get('snapshot_prepare_s', 0):.1f} s; a first run builds it)")
        data[name] = {"restore": r_sum, "cold": c_sum, "raw": pool_measured}
    result.data = data
    return result
