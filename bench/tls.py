"""`tls`: one daemon through its Unix socket and through its locked TCP door (mutual TLS + bearer token).

Both doors belong to the same daemon (the bench starts it with a TCP
listener on 127.0.0.1, a private CA's server certificate, a client CA and a
tokens file; sandboxd.auth checks the token of every call), so the pools,
sandboxes and jobs are the same and only the transport differs:

- serial `Run` of `print(1)`, alternating call by call: p50/p90/p99 per job;
- `score_batch` of `print(1)` jobs at several batch sizes, in rounds that
  alternate which door goes first: jobs/s and wall milliseconds per job;
- a new client's first call (channel, connection, TLS handshake, GetInfo).

`print(1)` is the cheapest job there is, so the transport's share of it is
the largest any job shows: a HumanEval job spends about 10 ms of CPU in its
sandbox against print(1)'s 2-3 ms, and the same transport cost is a smaller
fraction of it.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    BenchResult,
    CpuMeter,
    Target,
    alternate,
    fmt,
    fmt_ratio,
    free_port,
    log,
    pool_state,
    ratio,
    summary,
    wait_pool_settled,
)

CODE = "print(1)"
# The issue's goal: the door costs at most 10 % per job at batch sizes of 256 and more.
GOAL_OVERHEAD = 0.10
GOAL_MIN_BATCH = 256


@dataclass
class Door:
    """A TCP door's files and token: what the daemon is started with and what a trainer's client is given."""

    tcp: str
    folder: Path
    token: str

    def daemon_env(self) -> dict[str, str]:
        """SANDBOXD_* settings that open the door (mutual TLS and the tokens file)."""
        return {
            "SANDBOXD_SERVER_TCP": self.tcp,
            "SANDBOXD_SERVER_TLS_CERT": str(self.folder / "server.pem"),
            "SANDBOXD_SERVER_TLS_KEY": str(self.folder / "server.key"),
            "SANDBOXD_SERVER_TLS_CLIENT_CA": str(self.folder / "ca.pem"),
            "SANDBOXD_SERVER_TOKENS_FILE": str(self.folder / "tokens"),
        }

    def client_kwargs(self) -> dict[str, Any]:
        """SandboxClient arguments for a trainer holding the `jobs` token and a client certificate."""
        return {"token": self.token, "tls_ca": str(self.folder / "ca.pem"),
                "tls_cert": str(self.folder / "client.pem"), "tls_key": str(self.folder / "client.key")}

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def make_door(host: str = "127.0.0.1") -> Door:
    """A private CA (trustme), a server certificate for `host`, a client certificate, a `jobs` token, a free port."""
    import trustme

    folder = Path(tempfile.mkdtemp(prefix="sandboxd-bench-tls-"))
    ca = trustme.CA()
    ca.cert_pem.write_to_path(folder / "ca.pem")
    for name, identity in (("server", host), ("client", "trainer@sandboxd.bench")):
        leaf = ca.issue_cert(identity)
        leaf.private_key_pem.write_to_path(folder / f"{name}.key")
        for pem in leaf.cert_chain_pems:
            pem.write_to_path(folder / f"{name}.pem", append=True)
    token = secrets.token_hex(32)
    tokens = folder / "tokens"
    tokens.write_text(f"bench jobs {token}\n")
    os.chmod(tokens, 0o600)  # the daemon refuses a tokens file open to group or others
    return Door(f"{host}:{free_port()}", folder, token)


def _score(client: Any, jobs: list[Any], lo: int, hi: int) -> tuple[float, list[Any]]:
    """(seconds, results) of one batch: the round's own time, for the per-round ratios."""
    t0 = time.perf_counter()
    results = client.score_batch(jobs[lo:hi])
    return time.perf_counter() - t0, results


def _own_cpu_ms(cpu: dict[str, float | None], jobs: int) -> float:
    """CPU milliseconds a job took in the sandboxes, the daemon and this process: what the job cost, whatever else
    the machine ran meanwhile (NaN when a part could not be read)."""
    parts = [cpu.get(key) for key in ("sandboxes", "daemon", "client")]
    if any(part is None for part in parts) or not jobs:
        return float("nan")
    return sum(part for part in parts if part is not None) / jobs * 1000


def _cpu_ms(cpu: dict[str, float | None], key: str, jobs: int) -> str:
    value = cpu.get(key)
    return "n/a" if value is None or not jobs else fmt(value / jobs * 1000, 2)


def run(client: Any, *, quick: bool, door: Door | None, unix_address: str, cpu: CpuMeter | None = None,
        sizes: list[int] | None = None) -> BenchResult:
    from sandboxd_client import SandboxClient, execute_job

    if door is None:
        raise RuntimeError("the tls benchmark opens its daemon's TCP door itself: run it without --address")
    sizes = sizes or [64, 256, 1024]
    round_count = 4 if quick else 8  # even: each door goes first as often as the other
    serial = 100 if quick else 300
    fresh = 10 if quick else 30
    job = execute_job(CODE, timeout=10)
    meter = cpu or CpuMeter()
    clients = {"unix": client, "tls": SandboxClient(door.tcp, job_timeout=30.0, **door.client_kwargs())}

    # A call's time outside the daemon (the client's wall time less the daemon's own timing of the job): the
    # transport and the client, without the sandbox's time, which the machine's other work moves by tens of ms.
    outside: dict[str, list[float]] = {side: [] for side in clients}

    def run_once(side: str) -> float:
        t0 = time.perf_counter()
        result = clients[side].run(job)
        elapsed = time.perf_counter() - t0
        if not result.ok or result.details.stdout.strip() != b"1":
            raise RuntimeError(f"{side}: print(1) failed: {result.status!r} {result.message}")
        outside[side].append(elapsed - result.timings.total_seconds)
        return elapsed

    def first_call(side: str) -> float:
        address, kwargs = (unix_address, {}) if side == "unix" else (door.tcp, door.client_kwargs())
        t0 = time.perf_counter()
        with SandboxClient(address, max_retries=0, **kwargs) as new:
            new.info()
            return time.perf_counter() - t0

    try:
        # The batch hint sizes the python pool for the largest batch (capped by pool.max_size);
        # admin-only on the door, so it goes through the Unix socket.
        status = client.set_batch_hint(max(sizes), pools=["python"])
        log(f"tls: batch hint {max(sizes)}; waiting for the pool (target {pool_state(status).get('target')})")
        for side in clients:  # first connections, handshakes, page cache
            for _ in range(20):
                run_once(side)
        status = wait_pool_settled(client, timeout=180.0)
        pool_before = pool_state(status)

        samples: dict[str, list[float]] = {side: [] for side in clients}
        for values in outside.values():
            values.clear()  # the warm-up's
        for i in range(serial):
            for side in (("unix", "tls") if i % 2 == 0 else ("tls", "unix")):
                samples[side].append(run_once(side))
        serial_stats = {side: summary(values) for side, values in samples.items()}
        outside_stats = {side: summary(values) for side, values in outside.items()}
        log("tls: serial p50 " + ", ".join(f"{side} {s['p50_ms']:.2f} ms" for side, s in serial_stats.items()))

        connects: dict[str, list[float]] = {side: [] for side in clients}
        for i in range(fresh):
            for side in (("unix", "tls") if i % 2 == 0 else ("tls", "unix")):
                connects[side].append(first_call(side))
        connect_stats = {side: summary(values) for side, values in connects.items()}

        batches: dict[int, dict[str, Any]] = {}
        for size in sizes:
            jobs = [job] * (size * round_count)
            spans = [(r * size, (r + 1) * size) for r in range(round_count)]
            rounds = alternate(f"tls batch {size}", spans,
                               {side: functools.partial(_score, c, jobs) for side, c in clients.items()}, meter)
            total = size * round_count
            failed = {side: sum(1 for _, (_, results) in rounds.outputs[side] for r in results if not r.ok)
                      for side in clients}
            if any(failed.values()):
                raise RuntimeError(f"batch {size}: jobs failed: {failed}")
            # Each round's TLS time over its Unix time: the two ran back to back, so a burst of the machine's
            # other work moves one round's ratio, where it moves the totals' by all it took.
            per_round = [t / u for (_, (t, _)), (_, (u, _)) in zip(rounds.outputs["tls"], rounds.outputs["unix"],
                                                                     strict=True)]
            batches[size] = {"jobs": total, "seconds": rounds.seconds, "cpu_seconds": rounds.cpu,
                             "round_ratios": per_round,
                             "jobs_per_s": {s: total / sec for s, sec in rounds.seconds.items()},
                             "ms_per_job": {s: sec / total * 1000 for s, sec in rounds.seconds.items()}}
        pool_after = pool_state(client.pool_status())
    finally:
        clients["tls"].close()
        client.set_batch_hint(0, pools=["python"])

    result = BenchResult(
        name="tls",
        title="tls: print(1) through one daemon's Unix socket and its TCP door (mutual TLS + bearer token, "
              "loopback), alternating",
        columns=["measure", "unix socket", "TLS + token", "TLS / unix", "rounds' TLS / unix: median (range)",
                 "CPU ms/job unix / TLS (ratio)", "of which client", "of which daemon"],
    )
    u, t = serial_stats["unix"], serial_stats["tls"]
    for label, key in (("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms")):
        result.rows.append([f"serial Run, {label} ms (n={u['n']} each)", fmt(u[key], 2), fmt(t[key], 2),
                            fmt_ratio(ratio(t[key], u[key])), "", "", "", ""])
    uo, to = outside_stats["unix"], outside_stats["tls"]
    result.rows.append(["serial Run, outside the daemon (gRPC + client), p50 ms", fmt(uo["p50_ms"], 3),
                        fmt(to["p50_ms"], 3), fmt_ratio(ratio(to["p50_ms"], uo["p50_ms"])), "", "", "", ""])
    overheads: dict[int, float] = {}
    cpu_overheads: dict[int, float] = {}
    for size, b in batches.items():
        ms, cpu_used, per_round = b["ms_per_job"], b["cpu_seconds"], b["round_ratios"]
        overheads[size] = statistics.median(per_round) - 1.0
        own = {side: _own_cpu_ms(cpu_used[side], b["jobs"]) for side in ("unix", "tls")}
        cpu_overheads[size] = ratio(own["tls"], own["unix"]) - 1.0
        b["own_cpu_ms_per_job"] = own
        result.rows.append([
            f"batch {size} x {round_count}: ms per job (jobs/s)",
            f"{fmt(ms['unix'], 3)} ({fmt(b['jobs_per_s']['unix'], 0)})",
            f"{fmt(ms['tls'], 3)} ({fmt(b['jobs_per_s']['tls'], 0)})",
            fmt_ratio(ratio(ms["tls"], ms["unix"])),
            f"{fmt_ratio(statistics.median(per_round))} ({min(per_round):.2f}-{max(per_round):.2f})",
            f"{fmt(own['unix'], 2)} / {fmt(own['tls'], 2)} ({fmt_ratio(ratio(own['tls'], own['unix']))})",
            f"{_cpu_ms(cpu_used['unix'], 'client', b['jobs'])} / {_cpu_ms(cpu_used['tls'], 'client', b['jobs'])}",
            f"{_cpu_ms(cpu_used['unix'], 'daemon', b['jobs'])} / {_cpu_ms(cpu_used['tls'], 'daemon', b['jobs'])}",
        ])
    cu, ct = connect_stats["unix"], connect_stats["tls"]
    result.rows.append([f"new client's first call, p50 ms (n={cu['n']} each)", fmt(cu["p50_ms"], 2),
                        fmt(ct["p50_ms"], 2), fmt_ratio(ratio(ct["p50_ms"], cu["p50_ms"])), "", "", "", ""])
    judged = {size: o for size, o in overheads.items() if size >= GOAL_MIN_BATCH}
    worst = max(judged.values()) if judged else float("nan")
    result.targets = [Target(
        "TLS + token overhead per job", f"<= {GOAL_OVERHEAD:.0%} at batch sizes >= {GOAL_MIN_BATCH} (median of "
        "the rounds' ratios)",
        ", ".join(f"{size}: {o:+.1%}" for size, o in judged.items()) or "n/a",
        (worst <= GOAL_OVERHEAD) if judged else None)]
    cpu_judged = {size: o for size, o in cpu_overheads.items() if size >= GOAL_MIN_BATCH and o == o}
    if cpu_judged:
        result.targets.append(Target(
            "TLS + token CPU per job", f"<= {GOAL_OVERHEAD:.0%} at batch sizes >= {GOAL_MIN_BATCH} (sandboxes + "
            "daemon + client)", ", ".join(f"{size}: {o:+.1%}" for size, o in cpu_judged.items()),
            max(cpu_judged.values()) <= GOAL_OVERHEAD))
    result.notes.append("the door: mutual TLS (a trustme CA) and a `jobs` bearer token checked on every call; "
                        "both sides are the sync client with its defaults (a batch goes out as RunBatch streams of "
                        "batch_size jobs, max_concurrent_batches at once), one HTTP/2 connection per door")
    result.notes.append("CPU per job: the daemon's sandboxes (cgroups), the daemon's process (its TLS and token "
                        "check included) and this whole process (both clients' threads and gRPC's), not the rest "
                        "of the machine: on a saturated machine jobs/s is its cores over this, and it moves "
                        "less with other work than the wall time does")
    result.notes.append(f"pool before timing: {pool_before.get('ready')} ready python sandboxes (target "
                        f"{pool_before.get('target')}); after: {pool_after.get('ready')}")
    result.data = {"serial": serial_stats, "serial_outside_daemon": outside_stats, "first_call": connect_stats,
                   "batches": batches,
                   "overhead_per_job": overheads, "cpu_overhead_per_job": cpu_overheads, "rounds": round_count,
                   "pool_before": pool_before, "pool_after": pool_after, "code": CODE}
    return result
