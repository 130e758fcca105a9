"""`fleet-model`: one trainer-side client process balancing over 64 daemons, the daemons modeled by stand-ins.

The 64 daemons here are **not sandboxd**. Each is a stand-in: a small gRPC
server that implements sandboxd's `Jobs` service from the project's
generated protos (`Run` and the streaming `RunBatch`) and grpc.health.v1,
serves TLS, checks the bearer token, and answers every job `STATUS_OK`
after a modeled delay, running no code: a node of `slots` sandboxes where
each job takes `service_seconds` in one, first come first served. The
result's `message` names the stand-in that answered.

The client is the real one: `SandboxClient` given the 64 addresses (gRPC's
round_robin with health checks, TLS and a token, as a trainer would run it).
What is measured is what that client process can do: jobs/s, its own CPU per
job, the TCP connections it holds, and how evenly its batches spread
(jobs per stand-in: max/min and coefficient of variation).

The sides, in rounds that alternate their order, each sending the same
batches: for two job shapes (print(1), the smallest message; HumanEval's code
jobs, 1.7 kB each), 64 stand-ins of 20 ms a job with the client's defaults
(16 RunBatch streams at once), the same with as many streams as daemons
(`max_concurrent_batches=64`), and one stand-in with 64 times the slots (the
same capacity behind one address: what balancing itself costs); and 64
stand-ins of 0.5 s a job (a compiled language's job) with 16 and with 64
streams, where the jobs the client keeps in flight set the rate. The
stand-ins live in processes of their own (16 to a process), so the client's
CPU is its own; on this 2-core machine they still compete with it for the
cores, which its CPU per job depends on less than its jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from bench.common import (
    REPO,
    BenchResult,
    CpuMeter,
    alternate,
    fmt,
    fmt_ratio,
    log,
    process_cpu_seconds,
    ratio,
)

DAEMONS = 64
STAND_INS_PER_PROCESS = 16


@dataclass(frozen=True)
class NodeModel:
    """What a stand-in models: `slots` sandboxes, each job `service_seconds` in one, first come first served.

    The defaults stand for a 64-core rollout node running HumanEval-class
    jobs: a sandbox a core, and about 20 ms a job (this machine measures
    10-13 ms of sandbox CPU a HumanEval job): 3,200 jobs/s a node, 204,800
    for 64, far above what one client sends, so the client is what is measured.
    """

    slots: int = 64
    service_seconds: float = 0.020


class StandIn(pb_grpc.JobsServicer):
    """sandboxd's Jobs service answered by a model (see the module's docstring): it runs nothing."""

    def __init__(self, name: str, model: NodeModel, token: str | None = None) -> None:
        self.name = name
        self.model = model
        self._authorization = f"Bearer {token}" if token else None
        # When each slot is next free, on the event loop's clock: a min-heap.
        self._free = [0.0] * model.slots
        self.answered = 0

    def admit(self, count: int, now: float) -> list[float]:
        """When each of `count` jobs arriving at `now` finishes: on the earliest free slot, in arrival order."""
        ends = []
        for _ in range(count):
            start = max(now, heapq.heappop(self._free))
            end = start + self.model.service_seconds
            heapq.heappush(self._free, end)
            ends.append(end)
        return ends

    async def _check_token(self, context: grpc.aio.ServicerContext) -> None:
        if self._authorization is None:
            return
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != self._authorization:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown bearer token")

    def _result(self, job: pb.Job, admitted: float, end: float) -> pb.JobResult:
        self.answered += 1
        result = pb.JobResult(
            index=job.index, reward=1.0, status=pb.STATUS_OK, attempts=1, message=self.name,
            timings=pb.Timings(run_seconds=self.model.service_seconds, total_seconds=end - admitted,
                               queued_seconds=end - admitted - self.model.service_seconds))
        kind = job.WhichOneof("kind")
        if kind == "code":  # the detail a real daemon sends for the job's kind, so the answer is as large
            tests = len(job.code.tests.stdio) + len(job.code.tests.function) or 1
            result.code.CopyFrom(pb.CodeDetail(language="python", tests_passed=tests, tests_total=tests))
        elif kind == "math":
            result.math.CopyFrom(pb.MathDetail(extracted_answer=job.math.ground_truth))
        else:
            result.execute.CopyFrom(pb.ExecuteOutput(exit_code=0, stdout=b"1\n"))
        return result

    async def Run(self, request: pb.Job, context: grpc.aio.ServicerContext) -> pb.JobResult:
        await self._check_token(context)
        loop = asyncio.get_running_loop()
        admitted = loop.time()
        (end,) = self.admit(1, admitted)
        await asyncio.sleep(end - admitted)
        return self._result(request, admitted, end)

    async def RunBatch(
        self, request: pb.RunBatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.JobResult]:
        await self._check_token(context)
        loop = asyncio.get_running_loop()
        admitted = loop.time()
        ends = self.admit(len(request.jobs), admitted)
        order = sorted(range(len(ends)), key=ends.__getitem__)
        # One sleep per wave of jobs that finish together, not one per job: a stand-in must cost
        # little next to the client it measures.
        i = 0
        while i < len(order):
            delay = ends[order[i]] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            while i < len(order) and ends[order[i]] <= now:
                yield self._result(request.jobs[order[i]], admitted, ends[order[i]])
                i += 1


@dataclass(frozen=True)
class Tls:
    """PEM files of a stand-in's server certificate and key."""

    cert: Path
    key: Path


class StandInFleet:
    """`count` stand-ins, each its own gRPC server on 127.0.0.1, on an event loop in a thread of this process."""

    def __init__(self, count: int, model: NodeModel, *, tls: Tls | None = None, token: str | None = None,
                 first: int = 0) -> None:
        self.stand_ins = [StandIn(f"stand-in-{first + i}", model, token) for i in range(count)]
        self.addresses: list[str] = []
        self._tls = tls
        self._servers: list[grpc.aio.Server] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stand-ins", daemon=True)

    def start(self) -> list[str]:
        """Start serving; returns the addresses ("127.0.0.1:port"), in the stand-ins' order."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        return self.addresses

    async def _start(self) -> None:
        credentials = None
        if self._tls is not None:
            credentials = grpc.ssl_server_credentials([(self._tls.key.read_bytes(), self._tls.cert.read_bytes())])
        for stand_in in self.stand_ins:
            server = grpc.aio.server()
            pb_grpc.add_JobsServicer_to_server(stand_in, server)
            health_servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            port = (server.add_secure_port("127.0.0.1:0", credentials) if credentials is not None
                    else server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
            self._servers.append(server)
            self.addresses.append(f"127.0.0.1:{port}")

    async def _stop(self) -> None:
        await asyncio.gather(*(server.stop(None) for server in self._servers))

    def close(self) -> None:
        """Stop the servers and the loop's thread."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> StandInFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StandInProcess:
    """A StandInFleet in a child process (`python -m bench.fleet_model host`), so its CPU is not the client's."""

    def __init__(self, count: int, model: NodeModel, *, tls: Tls, token: str, first: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.fleet_model", "host", "--count", str(count), "--first", str(first),
             "--slots", str(model.slots), "--service-seconds", str(model.service_seconds),
             "--cert", str(tls.cert), "--key", str(tls.key)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "STAND_IN_TOKEN": token})  # not on the command line, where ps shows it
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"stand-in process exited {self.process.wait()} before serving")
        self.addresses: list[str] = json.loads(line)["addresses"]

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid) or 0.0

    def close(self) -> None:
        """Close its stdin (it stops its servers and exits); SIGKILL if it hangs."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def spread(counts: Sequence[int]) -> dict[str, float]:
    """How evenly jobs went to daemons: totals, min, max, max/min (inf when one got none), CV, idle daemons."""
    if not counts:
        raise ValueError("no daemons")
    mean = statistics.fmean(counts)
    low, high = min(counts), max(counts)
    return {"daemons": len(counts), "jobs": sum(counts), "min": low, "max": high,
            "max_over_min": high / low if low else float("inf"),
            "cv": statistics.pstdev(counts) / mean if mean else float("nan"),
            "idle": sum(1 for c in counts if c == 0)}


def tally(results: Sequence[Any], names: Sequence[str]) -> list[int]:
    """Jobs each stand-in of `names` answered (its name is the result's message), zeros included."""
    counter = Counter(result.message for result in results)
    unknown = set(counter) - set(names)
    if unknown:
        raise RuntimeError(f"results from no known stand-in: {sorted(unknown)[:3]}")
    return [counter[name] for name in names]


def established_connections(ports: set[int]) -> int:
    """This process's established TCP connections to `ports` (from /proc/self/net/tcp and tcp6: gRPC's sockets
    are dual-stack, so its connections to 127.0.0.1 are listed as IPv6)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for name in ("tcp", "tcp6"):
        with open(f"/proc/self/net/{name}") as table:
            next(table)
            for row in table:
                fields = row.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote_port in ports and fields[9] in inodes:  # 01: ESTABLISHED
                    count += 1
    return count


def job_shapes(count: int) -> dict[str, list[Any]]:
    """`count` jobs of each shape the model sends: the cheapest message (print(1)) and HumanEval's code jobs (the
    164 problems' canonical solutions with their tests, cycled, as bench/humaneval.py builds them)."""
    from sandboxd_client import code_job, execute_job

    from bench.humaneval import load_problems

    problems = load_problems()
    humaneval = [
        code_job(f"```python\n{p['prompt']}{p['canonical_solution']}\n```",
                 {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]}, timeout=10.0)
        for p in problems
    ]
    return {"print(1)": [execute_job("print(1)", timeout=10)] * count,
            "HumanEval": [humaneval[i % len(humaneval)] for i in range(count)]}


@dataclass
class Side:
    """One contender of the benchmark: a client, the jobs it sends, and the stand-ins that may answer them."""

    client: Any
    jobs: list[Any]
    names: list[str]


def run(*, quick: bool, daemons: int = DAEMONS, fast: NodeModel | None = None,
        slow: NodeModel | None = None) -> BenchResult:
    """`fast`: HumanEval-class nodes (the default NodeModel); `slow`: nodes whose jobs take 0.5 s (a compiled
    language's compile and run, bench/langs.py measures 0.07-0.65 s), where how many jobs the client keeps in
    flight, not its CPU, sets the rate."""
    from sandboxd_client import SandboxClient

    from bench.tls import make_door

    fast = fast or NodeModel()
    slow = slow or NodeModel(slots=fast.slots, service_seconds=0.5)
    batch = 4096 if quick else 16384
    round_count = 3 if quick else 5
    door = make_door()  # a CA, a server certificate for 127.0.0.1 and a token; its port goes unused
    tls = Tls(door.folder / "server.pem", door.folder / "server.key")
    hosts: list[StandInProcess] = []
    clients: list[Any] = []
    first = 0

    def fleet(count: int, model: NodeModel) -> tuple[list[str], list[str]]:
        """Start `count` stand-ins of `model`, STAND_INS_PER_PROCESS to a process: (addresses, names)."""
        nonlocal first
        addresses, names = [], []
        for offset in range(0, count, STAND_INS_PER_PROCESS):
            host = StandInProcess(min(STAND_INS_PER_PROCESS, count - offset), model, tls=tls, token=door.token,
                                  first=first)
            hosts.append(host)
            addresses += host.addresses
            names += [f"stand-in-{first + i}" for i in range(len(host.addresses))]
            first += len(host.addresses)
        return addresses, names

    def client(addresses: list[str], **options: Any) -> Any:
        # An address list's channel checks every daemon's certificate against one name (a list's own
        # authority is the list's text): the name the stand-ins' certificate carries, as a fleet's carry a shared one.
        made = SandboxClient(addresses, token=door.token, tls_ca=str(door.folder / "ca.pem"),
                             tls_server_name="127.0.0.1", job_timeout=30.0, **options)
        clients.append(made)
        return made

    try:
        log(f"fleet-model: starting {daemons} stand-ins of {fast.service_seconds * 1000:.0f} ms, {daemons} of "
            f"{slow.service_seconds * 1000:.0f} ms ({STAND_INS_PER_PROCESS} a process) and one of {daemons}x the slots")
        fast_fleet, fast_names = fleet(daemons, fast)
        slow_fleet, slow_names = fleet(daemons, slow)
        one, one_name = fleet(1, NodeModel(slots=fast.slots * daemons, service_seconds=fast.service_seconds))
        shapes = job_shapes(batch)
        fast_default, fast_wide = client(fast_fleet), client(fast_fleet, max_concurrent_batches=daemons)
        slow_default, slow_wide = client(slow_fleet), client(slow_fleet, max_concurrent_batches=daemons)
        single = client(one)
        fast_ms, slow_ms = f"{fast.service_seconds * 1000:.0f} ms", f"{slow.service_seconds * 1000:.0f} ms"
        sides: dict[str, Side] = {}
        for shape, jobs in shapes.items():
            sides[f"{shape}, {daemons} x {fast_ms}, 16 streams (defaults)"] = Side(fast_default, jobs, fast_names)
            sides[f"{shape}, {daemons} x {fast_ms}, {daemons} streams"] = Side(fast_wide, jobs, fast_names)
            sides[f"{shape}, 1 x {fast_ms} with {daemons}x slots"] = Side(single, jobs, one_name)
        sides[f"HumanEval, {daemons} x {slow_ms}, 16 streams (defaults)"] = Side(slow_default, shapes["HumanEval"],
                                                                                   slow_names)
        sides[f"HumanEval, {daemons} x {slow_ms}, {daemons} streams"] = Side(slow_wide, shapes["HumanEval"],
                                                                               slow_names)

        # Warm-up: until every stand-in has answered. round_robin sends only to daemons it is connected to, and
        # connects to all of them at the first call: a batch sent at once would queue on the first few.
        for made, names in ((fast_default, fast_names), (fast_wide, fast_names), (slow_default, slow_names),
                            (slow_wide, slow_names), (single, one_name)):
            made.run(shapes["print(1)"][0])
            time.sleep(1.0)
            warm_ups, counts = 0, [0]
            while not all(counts) and warm_ups < 10:
                counts = tally(made.score_batch(shapes["print(1)"][: 64 * len(names)]), names)
                warm_ups += 1
            log(f"fleet-model: a client of {len(names)} stand-in(s): warm after {warm_ups} batch(es), "
                f"{sum(1 for c in counts if c == 0)} idle")

        cpu_before = sum(host.cpu_seconds() for host in hosts)

        def side_call(side: Side) -> Any:
            def call(lo: int, hi: int) -> tuple[list[int], int]:
                results = side.client.score_batch(side.jobs[: hi - lo])
                return tally(results, side.names), sum(1 for r in results if not r.ok)
            return call

        spans = [(r * batch, (r + 1) * batch) for r in range(round_count)]
        rounds = alternate("fleet-model", spans, {label: side_call(side) for label, side in sides.items()},
                           CpuMeter())
        stand_in_cpu = sum(host.cpu_seconds() for host in hosts) - cpu_before
        ports = {int(a.rsplit(":", 1)[1]) for a in fast_fleet}
        connections = established_connections(ports)
        threads = threading.active_count()
    finally:
        for made in clients:
            made.close()
        for host in hosts:
            host.close()
        door.remove()

    total = batch * round_count
    result = BenchResult(
        name="fleet-model",
        title=f"fleet-model: one client process, batches of {batch:,} jobs over {daemons} STAND-IN daemons (gRPC "
              f"servers of the real Jobs proto, TLS + token, answering OK after a modeled delay on {fast.slots} "
              "slots each; not sandboxd), alternating",
        columns=["side", "jobs", "jobs/s", "client CPU ms/job", "jobs/s per client core", "per daemon min / max",
                 "max / min", "CV", "daemons a batch reaches"],
    )
    data: dict[str, Any] = {}
    for label, side in sides.items():
        outputs = rounds.outputs[label]
        counts = [sum(column) for column in zip(*(tallied for _, (tallied, _) in outputs), strict=True)]
        failed = sum(f for _, (_, f) in outputs)
        if failed:
            raise RuntimeError(f"{label}: {failed} jobs failed")
        stats = spread(counts)
        reached = [sum(1 for c in tallied if c) for _, (tallied, _) in outputs]
        rate = total / rounds.seconds[label]
        client_cpu = rounds.cpu[label].get("client") or float("nan")
        cpu_ms = client_cpu / total * 1000
        many = len(side.names) > 1
        result.rows.append([
            label, f"{total:,}", fmt(rate, 0), fmt(cpu_ms, 3), fmt(ratio(1000.0, cpu_ms), 0),
            f"{stats['min']:,} / {stats['max']:,}" if many else "n/a",
            fmt_ratio(stats["max_over_min"]) if many else "n/a",
            f"{stats['cv']:.3f}" if many else "n/a",
            f"{min(reached)}-{max(reached)}" if many else "1",
        ])
        data[label] = {"jobs": total, "seconds": rounds.seconds[label], "jobs_per_s": rate,
                       "client_cpu_ms_per_job": cpu_ms, "cpu_seconds": rounds.cpu[label], "counts": counts,
                       "spread": stats, "daemons_reached_per_batch": reached}
    machine = [rounds.cpu[label].get("machine") or 0.0 for label in sides]
    wall = [rounds.cpu[label].get("wall") or 0.0 for label in sides]
    busy = sum(machine) / sum(wall) / (os.cpu_count() or 1) if sum(wall) else float("nan")
    stand_in_ms = stand_in_cpu / (total * len(sides)) * 1000
    job_bytes = {shape: statistics.fmean(job.ByteSize() for job in jobs) for shape, jobs in shapes.items()}
    result.notes.append(
        f"stand-ins: {fast_ms} ({fast.slots} slots: {fast.slots / fast.service_seconds:,.0f} jobs/s a daemon) or "
        f"{slow_ms} ({slow.slots / slow.service_seconds:,.0f} jobs/s a daemon) a job; {len(hosts)} processes of up "
        f"to {STAND_INS_PER_PROCESS}; they spent {stand_in_ms:.3f} ms CPU a job")
    result.notes.append(
        f"the machine was {busy:.0%} busy over the timed rounds ({os.cpu_count()} cores, shared with the stand-ins "
        "and other work): jobs/s here is a floor; 1000 / client CPU ms a job is what one client core sustains")
    result.notes.append(f"a client of {daemons} daemons holds {connections // 2} TCP connections to them, one a "
                        f"daemon ({connections} for the two clients of the {fast_ms} fleet); this process ran "
                        f"{threads} threads ({len(clients)} clients' batch threads, gRPC's own)")
    result.notes.append("spread: jobs per stand-in summed over the timed rounds; CV = population stdev / mean")
    result.notes.append("jobs: " + "; ".join(f"{shape}, {size:,.0f} bytes a job" for shape, size in job_bytes.items()))
    result.data = {"fast": {"slots": fast.slots, "service_seconds": fast.service_seconds},
                   "slow": {"slots": slow.slots, "service_seconds": slow.service_seconds}, "daemons": daemons,
                   "batch": batch, "rounds": round_count, "sides": data, "job_bytes": job_bytes,
                   "stand_in_cpu_seconds": stand_in_cpu, "connections": connections, "threads": threads}
    return result


def _host(argv: list[str]) -> int:
    """`python -m bench.fleet_model host ...`: serve stand-ins, print their addresses, exit when stdin closes."""
    parser = argparse.ArgumentParser(prog="bench.fleet_model host")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--service-seconds", type=float, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    fleet = StandInFleet(args.count, NodeModel(args.slots, args.service_seconds),
                         tls=Tls(Path(args.cert), Path(args.key)), token=os.environ.get("STAND_IN_TOKEN"),
                         first=args.first)
    try:
        print(json.dumps({"addresses": fleet.start()}), flush=True)
        sys.stdin.read()
    finally:
        fleet.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["host"]:
        sys.exit("usage: python -m bench.fleet_model host --count N ... (bench/run.py --only fleet-model runs it)")
    sys.exit(_host(sys.argv[2:]))
