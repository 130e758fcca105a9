"""Benchmarks for sandboxd, each against its baseline in the same run.

    .venv/bin/python bench/run.py [--quick] [--only latency,ready,humaneval,math] [--address ADDR]

Without --address it starts its own daemon (python image only, and the
langs image for `langs`; defaults otherwise) on a temporary socket. Progress goes to stderr, the tables to
stdout, and everything measured to bench/results/latest.json.
See bench/README.md for what each benchmark does and what it compares.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

HERE = Path(__file__).resolve().parent
# Run as a script, this folder is sys.path[0]: import the package from the
# repository root instead, so no module here can shadow a standard one.
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)
sys.path.insert(0, str(HERE.parent))

from bench import tls  # noqa: E402
from bench.common import (  # noqa: E402
    STATE_DIR,
    BenchDaemon,
    BenchResult,
    CpuMeter,
    format_table,
    host_facts,
    loadavg,
    log,
    pool_state,
    wait_pool_settled,
)
from sandboxd.daemon import node_id  # noqa: E402

if TYPE_CHECKING:
    from sandboxd_client import SandboxClient

BENCHMARKS = ["latency", "ready", "humaneval", "math", "sessions", "rewardmodel", "langs", "tls", "fleet-model"]
# Benchmarks that need no sandboxd daemon: selected alone, the bench starts none.
DAEMONLESS = {"fleet-model"}
RESULTS = HERE / "results"


def _run_one(name: str, client: SandboxClient | None, args: argparse.Namespace, metrics_url: str | None,
             meter: CpuMeter, node: str | None, door: tls.Door | None) -> BenchResult:
    if name == "fleet-model":
        from bench import fleet_model

        return fleet_model.run(quick=args.quick)
    if name == "rewardmodel":
        from bench import rewardmodel

        # A daemon of its own, with the benchmark's model as its only pool.
        return rewardmodel.run(quick=args.quick)
    assert client is not None
    if name == "tls":
        return tls.run(client, quick=args.quick, door=door, unix_address=args.address or client.address, cpu=meter)
    if name == "latency":
        from bench import latency

        return latency.run(client, quick=args.quick)
    if name == "ready":
        from bench import ready

        return ready.run(client, quick=args.quick, metrics_url=metrics_url)
    if name == "humaneval":
        from bench import humaneval

        return humaneval.run(client, quick=args.quick, jobs=args.humaneval_jobs, cpu=meter)
    if name == "math":
        from bench import mathbench

        return mathbench.run(client, quick=args.quick, pairs=args.math_pairs, cpu=meter)
    if name == "sessions":
        from bench import sessions

        return sessions.run(client, quick=args.quick, node=node)
    if name == "langs":
        from bench import langs

        return langs.run(client, quick=args.quick, cpu=meter)
    raise ValueError(name)


def print_report(results: list[BenchResult], header: str) -> None:
    print()
    print(header)
    for result in results:
        print()
        print(f"== {result.title}  ({result.seconds:.0f} s)")
        if result.error:
            print(f"  ERROR: {result.error}")
            continue
        for line in format_table(result.columns, result.rows):
            print(line)
        for note in result.notes:
            print(f"  note: {note}")
    targets = [t for r in results for t in r.targets]
    if targets:
        print()
        print("== targets")
        rows = [[t.name, t.goal, t.measured, t.to_dict()["result"]] for t in targets]
        for line in format_table(["target", "goal", "measured", "result"], rows, align_numbers=False):
            print(line)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and jobs (a smoke test)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(BENCHMARKS)}")
    parser.add_argument("--address", default=None, help="use a running daemon instead of starting one")
    parser.add_argument("--metrics", default=None,
                        help="that daemon's Prometheus URL (e.g. http://127.0.0.1:9464/metrics), for `ready`")
    parser.add_argument("--humaneval-jobs", type=int, default=None, help="default 1024 (128 with --quick)")
    parser.add_argument("--math-pairs", type=int, default=None, help="default 500 (100 with --quick)")
    parser.add_argument("--output", default=str(RESULTS / "latest.json"))
    args = parser.parse_args(argv)

    selected = [n.strip() for n in args.only.split(",") if n.strip()] or BENCHMARKS
    unknown = [n for n in selected if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")

    from sandboxd_client import SandboxClient

    started = time.monotonic()
    daemon: BenchDaemon | None = None
    door: tls.Door | None = None
    client: SandboxClient | None = None
    results: list[BenchResult] = []
    report: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick, "benchmarks": selected, "host": host_facts(), "state_dir": STATE_DIR,
    }
    try:
        if all(name in DAEMONLESS for name in selected):
            address, metrics_url, meter, node = "", None, CpuMeter(), None
        elif args.address:
            address, metrics_url = args.address, args.metrics
            meter = CpuMeter()  # another daemon's process and sandboxes are not ours to find
            node = None
            log(f"using the daemon at {address}")
        else:
            # The langs image (1.95 GB) only where a benchmark runs its jobs.
            # `tls` measures this daemon's TCP door (mutual TLS, a token) against its Unix socket.
            door = tls.make_door() if "tls" in selected else None
            daemon = BenchDaemon(door.daemon_env() if door else None,
                                 images="python,langs" if "langs" in selected else "python")
            address, metrics_url = daemon.address, daemon.metrics_url
            node = node_id(daemon.socket, door.tcp if door else "")  # the label of its sandboxes
            meter = CpuMeter(daemon.process.pid, node)
            log(f"starting sandboxd on {daemon.socket} (state {STATE_DIR}; log {daemon.log_path})")
            daemon.wait_serving()
        if address:
            client = SandboxClient(address, job_timeout=30.0)
            info = client.info()
            status = wait_pool_settled(client, timeout=300.0)
            report["daemon"] = {"address": address, "version": info.version, "snapshots": info.snapshots,
                                "snapshot_state": info.snapshot_state, "pool": pool_state(status)}
            log(f"daemon {info.version} ready: pool {pool_state(status)}")
        for name in selected:
            log(f"--- {name}")
            t0 = time.monotonic()
            try:
                result = _run_one(name, client, args, metrics_url, meter, node, door)
            except Exception as exc:  # one benchmark failing must not hide the others
                traceback.print_exc()
                result = BenchResult(name=name, title=name, columns=[], error=f"{type(exc).__name__}: {exc}")
            result.seconds = time.monotonic() - t0
            results.append(result)
            log(f"--- {name} done in {result.seconds:.0f} s")
        if client is not None:
            if {"humaneval", "math"} & set(selected):
                client.set_batch_hint(0)  # the benchmarks hinted their batch sizes; let the pool shrink back
            client.close()
    finally:
        if daemon is not None:
            log("stopping the daemon")
            daemon.stop()
        if door is not None:
            door.remove()

    report["seconds"] = round(time.monotonic() - started, 1)
    report["host"]["loadavg_at_end"] = loadavg()
    report["results"] = {r.name: r.to_dict() for r in results}
    report["targets"] = [t.to_dict() for r in results for t in r.targets]
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    host = report["host"]
    print_report(results, f"sandboxd bench ({'quick' if args.quick else 'full'}): {host.get('cpus')} cores, "
                          f"kernel {host.get('kernel')}, docker {host.get('docker')}; "
                          f"total {report['seconds']:.0f} s; load average (1/5/15 min) "
                          f"{'/'.join(host.get('loadavg_at_start', []))} at start, "
                          f"{'/'.join(host.get('loadavg_at_end', []))} at end; JSON: {output}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
