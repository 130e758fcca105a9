"""Shared pieces of the benchmarks: progress, statistics, tables, a daemon to measure."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.backend import LABEL_NODE
from sandboxd.testing import DaemonProcess

REPO = Path(__file__).resolve().parent.parent
# Snapshots and staged agent code persist here between bench runs, as on a
# real node: the first run builds the python image's checkpoint, later runs
# restore it.
STATE_DIR = os.environ.get("SANDBOXD_BENCH_STATE_DIR", "/var/lib/sandboxd-bench")
_T0 = time.monotonic()


def log(message: str) -> None:
    """One progress line on stderr (stdout carries the tables)."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(seconds: list[float]) -> dict[str, float]:
    """Summary of durations in seconds, reported in milliseconds."""
    ms = [s * 1000.0 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms) if ms else float("nan"),
        "min_ms": min(ms) if ms else float("nan"),
        "max_ms": max(ms) if ms else float("nan"),
    }


def spans(total: int, rounds: int) -> list[tuple[int, int]]:
    """[lo, hi) index ranges that cut `total` items into `rounds` rounds of equal size (the last may be shorter)."""
    chunk = -(-total // rounds)
    return [(start, min(total, start + chunk)) for start in range(0, total, chunk)]


def ratio(numerator: float, denominator: float) -> float:
    if not denominator or denominator != denominator:
        return float("nan")
    return numerator / denominator


# ---------------------------------------------------------------------------
# Results and tables
# ---------------------------------------------------------------------------


@dataclass
class Target:
    """One goal from the issue, checked against what was measured."""

    name: str
    goal: str
    measured: str
    passed: bool | None  # None: could not be measured

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "goal": self.goal, "measured": self.measured,
                "result": "PASS" if self.passed else ("MISS" if self.passed is False else "N/A")}


@dataclass
class BenchResult:
    name: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "columns": self.columns, "rows": self.rows,
                "notes": self.notes, "targets": [t.to_dict() for t in self.targets], "data": self.data,
                "seconds": round(self.seconds, 2), "error": self.error}


def loadavg() -> list[str]:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return []


def format_table(columns: list[str], rows: list[list[str]], *, align_numbers: bool = True) -> list[str]:
    widths = [len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def numeric(i: int) -> bool:
        cells = [row[i] for row in rows if i < len(row) and row[i]]
        looks_numeric = all(c[0].isdigit() or c[0] == "-" or c == "n/a" for c in cells)
        return align_numbers and i > 0 and bool(cells) and looks_numeric

    right = [numeric(i) for i in range(len(columns))]

    def line(cells: list[str]) -> str:
        cells = cells + [""] * (len(columns) - len(cells))
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return "  " + "  ".join(parts).rstrip()

    out = [line(columns), "  " + "  ".join("-" * w for w in widths)]
    out += [line(row) for row in rows]
    return out


def fmt(value: float, digits: int = 1) -> str:
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float) -> str:
    if value != value:
        return "n/a"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


# ---------------------------------------------------------------------------
# Host facts
# ---------------------------------------------------------------------------


def venv_free_path() -> str:
    """PATH without this virtual environment's bin folder (to find the machine's own python3)."""
    venv_bin = os.path.join(sys.prefix, "bin")
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep)
             if p and os.path.realpath(p) != os.path.realpath(venv_bin)]
    return os.pathsep.join(parts)


def default_python3() -> str | None:
    return shutil.which("python3", path=venv_free_path())


def host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    try:
        facts["kernel"] = os.uname().release
        facts["docker"] = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                         capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    facts["loadavg_at_start"] = loadavg()
    return facts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_metrics(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of one Prometheus metric, keyed by their sorted labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[tuple[str, str], ...], float] = {}
    for raw in text.splitlines():
        if not raw.startswith(name):
            continue
        head, _, value = raw.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        labels = []
        for part in label_text.rstrip("}").split(","):
            if "=" in part:
                key, _, val = part.partition("=")
                labels.append((key.strip(), val.strip().strip('"')))
        samples[tuple(sorted(labels))] = float(value)
    return samples


def docker_container(image: str, *options: str) -> str:
    """Name of a new running container of `image` that sleeps (`docker run -d --rm --network none` and
    `options`), for `docker exec` baselines; the caller removes it."""
    name = f"sandboxd-bench-exec-{time.time_ns() % 10**12}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--network", "none", *options,
                    "--entrypoint", "sleep", image, "infinity"],
                   check=True, capture_output=True, text=True, timeout=120)
    return name


# ---------------------------------------------------------------------------
# A daemon of our own
# ---------------------------------------------------------------------------


class BenchDaemon(DaemonProcess):
    """A daemon for the benchmarks: the python image (its python, math and
    sessions pools) and, for `langs` only, the langs image; its own snapshot
    state, and a metrics endpoint on a free port."""

    def __init__(self, extra_env: dict[str, str] | None = None, *, images: str = "python") -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="sandboxd-bench-"))
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        env = {
            "SANDBOXD_SERVER_METRICS": f"127.0.0.1:{port}",
            "SANDBOXD_SANDBOX_STATE_DIR": STATE_DIR,
            "SANDBOXD_POOL_IMAGES": images,
            **(extra_env or {}),
        }
        super().__init__(self.tmp, "sandboxd", env=env)

    def wait_serving(self, timeout: float = 300.0) -> None:
        super().wait_serving(timeout)

    def stop(self, timeout: float = 60.0) -> int:
        status = super().stop(timeout)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return status


# A benchmark times its rounds only once no job pool is still starting
# sandboxes on the same cores (an earlier benchmark's hint may be growing one).
JOB_POOLS = ("python", "math")


def wait_pool_settled(client: Any, timeout: float = 180.0, *, want_ready: int | None = None) -> Any:
    """Wait until every job pool has its target ready and nothing starting; returns the status."""
    deadline = time.monotonic() + timeout
    status = client.pool_status()
    while time.monotonic() < deadline:
        status = client.pool_status()
        states = [p for p in status.pools if p.name in JOB_POOLS]
        if states and all(
            state.snapshot != "building" and state.starting == 0
            and state.ready >= (state.target if want_ready is None else min(want_ready, state.target))
            for state in states
        ):
            return status
        time.sleep(0.5)
    return status


def pool_state(status: Any, pool: str = "python") -> dict[str, Any]:
    for state in status.pools:
        if state.name == pool:
            return {"target": state.target, "ready": state.ready, "busy": state.busy, "starting": state.starting,
                    "snapshot": state.snapshot, "jobs_total": state.jobs_total,
                    "recycled_total": state.recycled_total}
    return {}


# ---------------------------------------------------------------------------
# CPU accounting: where the cycles of a throughput run went
# ---------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def _container_cpu_seconds(container_id: str) -> float | None:
    for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage", 1e-9),
                        (f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage", 1e-9)):
        try:
            with open(path) as f:
                return int(f.read().strip()) * scale
        except (OSError, ValueError):
            continue
    try:
        with open(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) * 1e-6
    except (OSError, ValueError):
        pass
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (its threads, not its children); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / _TICKS


class CpuMeter:
    """CPU seconds spent by the sandboxes, the daemon, this process and its children, and the machine."""

    def __init__(self, daemon_pid: int | None = None, node: str | None = None) -> None:
        self.daemon_pid = daemon_pid
        self.node = node
        self._backend: Any = None

    def _containers(self) -> list[str]:
        # Through the engine's API, as the daemon lists its containers: a `docker ps`
        # child would be counted in this process's children, the reference's column.
        if not self.node:
            return []
        if self._backend is None:
            from sandboxd import config as config_module
            from sandboxd.backend import DockerBackend

            settings = config_module.load(environ={}).docker
            self._backend = DockerBackend(settings.url, settings.timeout_seconds)
        return [c["Id"] for c in self._backend.api.containers(filters={"label": [f"{LABEL_NODE}={self.node}"]})]

    def snapshot(self) -> dict[str, Any]:
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        containers = {cid: _container_cpu_seconds(cid) for cid in self._containers()}
        return {
            "wall": time.perf_counter(),
            "client": time.process_time(),
            "children": children.ru_utime + children.ru_stime,
            "daemon": process_cpu_seconds(self.daemon_pid) if self.daemon_pid else None,
            "containers": {k: v for k, v in containers.items() if v is not None},
            "machine": _machine_busy_seconds(),
        }

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
        """CPU seconds per consumer between two snapshots (sandboxes: those alive at both)."""
        shared = set(before["containers"]) & set(after["containers"])
        return {
            "wall": after["wall"] - before["wall"],
            "sandboxes": (sum(after["containers"][c] - before["containers"][c] for c in shared)
                          if shared else None),
            "sandbox_count": len(shared),
            "daemon": (after["daemon"] - before["daemon"]
                       if before["daemon"] is not None and after["daemon"] is not None else None),
            "client": after["client"] - before["client"],
            "children": after["children"] - before["children"],
            "machine": after["machine"] - before["machine"],
        }


def add_cpu(total: dict[str, float | None], part: dict[str, float | None]) -> None:
    for key, value in part.items():
        if key == "sandbox_count":
            total[key] = max(total.get(key) or 0, value or 0)
        elif value is None or total.get(key, 0.0) is None:
            total[key] = None
        else:
            total[key] = (total.get(key) or 0.0) + value


@dataclass
class Rounds:
    """What `alternate` measured: seconds and CPU per side, and each side's output per span."""

    seconds: dict[str, float]
    cpu: dict[str, dict[str, float | None]]
    outputs: dict[str, list[tuple[int, Any]]]  # (lo, what the side returned for [lo, hi))


def alternate(name: str, spans: list[tuple[int, int]], sides: dict[str, Callable[[int, int], Any]],
              meter: CpuMeter | None = None, unit: str = "jobs") -> Rounds:
    """Run every side on every span, alternating which goes first; time only the side's call.

    The benchmarks' method (bench/README.md): baseline and sandboxd share the
    machine's noise by taking turns, and their outputs are tallied afterwards,
    outside the timing.
    """
    names = list(sides)
    rounds = Rounds({side: 0.0 for side in names}, {side: {} for side in names}, {side: [] for side in names})
    for r, (lo, hi) in enumerate(spans):
        for side in names if r % 2 == 0 else names[::-1]:
            before = meter.snapshot() if meter is not None else None
            t0 = time.perf_counter()
            output = sides[side](lo, hi)
            rounds.seconds[side] += time.perf_counter() - t0
            if meter is not None and before is not None:
                add_cpu(rounds.cpu[side], CpuMeter.delta(before, meter.snapshot()))
            rounds.outputs[side].append((lo, output))
        rates = ", ".join(f"{side} {hi / rounds.seconds[side]:.1f} {unit}/s" for side in names)
        log(f"{name}: round {r + 1}/{len(spans)} ({hi - lo} {unit} each): {rates} (cumulative)")
    return rounds


def cpu_note(label: str, cpu: dict[str, float | None], jobs: int, keys: list[str]) -> str:
    """'label: X ms CPU per job (sandboxes a, daemon b, ...); machine busy c ms/job'."""
    parts = []
    for key in keys:
        value = cpu.get(key)
        parts.append(f"{key} {value / jobs * 1000:.1f}" if value is not None else f"{key} n/a")
    machine = cpu.get("machine")
    wall = cpu.get("wall") or 0.0
    busy = f"; whole machine busy {machine / jobs * 1000:.1f} ms/job ({machine / wall / (os.cpu_count() or 1):.0%} " \
           f"of {os.cpu_count()} cores)" if machine is not None and wall else ""
    return f"{label} CPU ms per job: " + ", ".join(parts) + busy
