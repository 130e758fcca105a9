"""Where a code sandbox's CPU goes, by process, over a batch of HumanEval jobs.

Why: the `humaneval` benchmark gives the sandboxes' CPU per job as one figure;
finding what a change costs needs it by process. This starts a bench daemon
from the tree it runs in (so two trees compare by running it from each, one
after the other), sizes the python pool with a batch hint, runs a warm-up
batch, then reads `/proc/<pid>/stat` of every process of every python-image
sandbox before and after the measured batch:

- the agent (each sandbox's PID 1);
- the zygote (its own CPU: the forks), and the workers it reaped meanwhile (its
  `cutime`/`cminflt`: the candidates, and any judge replaced in between);
- the resident processes alive at both reads (judges, math servers).

CPU and minor page faults (copy-on-write first) are per job. With `--perf
FILE`, `perf record -a` runs during the batch (`perf report -i FILE --sort
comm,dso` then splits the kernel's share by process name).

    PYTHONPATH=.:client .venv/bin/python bench/by_process.py [--jobs 656] [--perf /tmp/perf.data]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)
sys.path.insert(0, str(HERE.parent))

from sandboxd_client import SandboxClient, code_job  # noqa: E402

from bench.common import BenchDaemon, wait_pool_settled  # noqa: E402
from bench.humaneval import TIMEOUT_SECONDS, load_problems  # noqa: E402
from sandboxd import config as config_module  # noqa: E402
from sandboxd.backend import LABEL_NODE, DockerBackend  # noqa: E402
from sandboxd.daemon import node_id  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ("agent", "zygote", "zygote's reaped workers", "resident")


def _stat(pid: int) -> dict[str, float] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command's ")": state ppid ... minflt cminflt majflt cmajflt utime stime cutime cstime (proc(5)).
    return {"ppid": int(fields[1]), "minflt": int(fields[7]), "cminflt": int(fields[8]),
            "cpu": (int(fields[11]) + int(fields[12])) / TICKS, "ccpu": (int(fields[13]) + int(fields[14])) / TICKS}


def _tree(pid: int) -> dict[int, dict[str, float]]:
    """The stat of `pid` and of all its descendants."""
    found: dict[int, dict[str, float]] = {}
    pending = [pid]
    while pending:
        current = pending.pop()
        stat = _stat(current)
        if stat is None:
            continue
        found[current] = stat
        try:
            with open(f"/proc/{current}/task/{current}/children", encoding="ascii") as children:
                pending += [int(child) for child in children.read().split()]
        except OSError:
            pass
    return found


Stats = dict[int, dict[str, float]]


def _roles(init: int, before: Stats, after: Stats) -> dict[str, list[float]]:
    """(CPU seconds, minor faults) of each role in one sandbox between two reads of its process tree."""
    totals = {role: [0.0, 0.0] for role in ROLES}
    parents = {stat["ppid"] for stat in after.values()}
    for pid, now in after.items():
        then = before.get(pid)
        if then is None:
            continue
        if pid == init:
            role = "agent"
        elif now["ppid"] == init and pid in parents:
            role = "zygote"
            totals["zygote's reaped workers"][0] += now["ccpu"] - then["ccpu"]
            totals["zygote's reaped workers"][1] += now["cminflt"] - then["cminflt"]
        else:
            role = "resident"
        totals[role][0] += now["cpu"] - then["cpu"]
        totals[role][1] += now["minflt"] - then["minflt"]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=656, help="HumanEval jobs measured (problems cycled)")
    parser.add_argument("--perf", default="", help="also record `perf record -a` into this file during the batch")
    args = parser.parse_args()

    daemon = BenchDaemon()
    daemon.wait_serving()
    try:
        client = SandboxClient(daemon.address)
        jobs = [code_job(f"```python\n{p['prompt']}{p['canonical_solution']}\n```",
                         {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]},
                         timeout=TIMEOUT_SECONDS) for p in load_problems()]
        jobs = [jobs[i % len(jobs)] for i in range(args.jobs)]
        client.set_batch_hint(8, pools=["python"])
        wait_pool_settled(client, timeout=180)
        client.score_batch(jobs[:64])
        settings = config_module.load(environ={}).docker
        api = DockerBackend(settings.url, settings.timeout_seconds).api
        # This daemon's sandboxes only (others may run beside it), of the python image (code, math, sessions pools).
        mine = api.containers(filters={"label": [f"{LABEL_NODE}={node_id(daemon.socket, '')}"]})
        inits = {c["Id"]: api.inspect_container(c["Id"])["State"]["Pid"] for c in mine if "python:" in c["Image"]}
        before = {cid: _tree(init) for cid, init in inits.items()}
        perf = (subprocess.Popen(["perf", "record", "-a", "-F", "2999", "-o", args.perf],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.perf else None)
        if perf is not None:
            time.sleep(0.5)
        started = time.perf_counter()
        results = client.score_batch(jobs)
        seconds = time.perf_counter() - started
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        after = {cid: _tree(init) for cid, init in inits.items()}
        totals = {role: [0.0, 0.0] for role in ROLES}
        for cid, init in inits.items():
            for role, (cpu, faults) in _roles(init, before[cid], after[cid]).items():
                totals[role][0] += cpu
                totals[role][1] += faults
        report: dict[str, Any] = {"jobs": args.jobs, "passed": sum(result.ok for result in results),
                                  "sandboxes": len(inits), "seconds": round(seconds, 2)}
        for role, (cpu, faults) in totals.items():
            report[role] = {"ms_per_job": round(cpu / args.jobs * 1e3, 2),
                            "faults_per_job": round(faults / args.jobs, 1)}
        print(json.dumps(report, indent=1))
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
