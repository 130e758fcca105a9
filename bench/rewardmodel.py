"""`rewardmodel`: pairs/s of a reward model scored through sandboxd vs the same model in-process.

    .venv/bin/python bench/run.py --only rewardmodel          # with the other benchmarks' report
    .venv/bin/python bench/rewardmodel.py [--quick]           # on its own
    python bench/rewardmodel.py --in-process --device cuda --size 8b   # the scorer alone, on a GPU

A Llama-shaped sequence-classification model with random weights (`small`: 2
layers, hidden 128, about 0.5 M parameters; see sandboxd/testmodels.py) is saved
to a temporary folder. The sandboxd side is a daemon of the bench's own with
that model as its only pool (one CPU sandbox, started cold and loading the
model: the bench's model config leaves `snapshot` off) and
`client.score_batch` of one reward_model job per pair: the daemon sends them
concurrently and the sandbox's agent batches them dynamically. The baseline
is the very same scorer code (sandboxd.verifiers.rewardmodel) in this
process, fed batches of `max_batch` pairs in a loop: what a trainer would do
with the model in its own process, with no isolation and no RPC. Both sides
use the same number of torch threads and score the same pairs, in rounds that
alternate which goes first; their scores are compared.

`--in-process` skips Docker and the daemon altogether (the GPU run in the
README; the GPU machine has no Docker engine): it times the scorer in this
process at several batch sizes on `--device`, then the same pairs through the
agent's RewardModelHost, the code a reward-model sandbox runs (the scorer in a
process of its own, fed over a socket, one concurrent job per pair, dynamic
batching), and prints the ratio. It needs only torch, transformers and
sandboxd's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":
    # Run as a script, this folder is sys.path[0]: import the package from the repository root instead.
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
        sys.path.pop(0)
    sys.path.insert(0, str(HERE.parent))

SEED = 20240607
MAX_BATCH = 32
MAX_LENGTH = 512
BATCH_WAIT_MS = 5  # how long the sandbox's agent waits to fill a batch


def make_pairs(count: int, seed: int = SEED, *, prompt_words: tuple[int, int] = (10, 60),
               completion_words: tuple[int, int] = (20, 200)) -> list[tuple[str, str]]:
    """(prompt, completion) pairs of the model's words, lengths drawn uniformly (one token per word)."""
    from sandboxd.testmodels import VOCABULARY

    rng = random.Random(seed)
    return [(" ".join(rng.choices(VOCABULARY, k=rng.randint(*prompt_words))),
             " ".join(rng.choices(VOCABULARY, k=rng.randint(*completion_words)))) for _ in range(count)]


def _in_process_scores(model: Any, pairs: list[tuple[str, str]], batch: int) -> list[float | None]:
    scores: list[float | None] = []
    for start in range(0, len(pairs), batch):
        scores.extend(score.raw for score in model.score(pairs[start:start + batch]))
    return scores


def run(*, quick: bool, pairs: int | None = None, threads: int = 2, gpu: str = "", size: str = "small",
        dtype: str = "auto", memory_bytes: int = 0) -> Any:
    """The sandboxd-vs-in-process comparison as a BenchResult (bench/run.py calls this).

    ``gpu`` (a TOML line naming the GPU, e.g. ``cdi_devices = ["nvidia.com/gpu=0"]``) puts the
    sandbox's model on that GPU through the engine, and the in-process baseline on CUDA.
    """
    from bench import common
    from bench.common import BenchDaemon, BenchResult, Target, alternate, fmt, fmt_ratio, log, ratio

    result = BenchResult(name="rewardmodel", title="rewardmodel: (prompt, completion) pairs, throughput",
                         columns=["scorer", "pairs", "seconds", "pairs/s", "vs in-process", "p50 one pair ms"])
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        result.notes.append(f"skipped: {exc.name} is not installed (pip install torch==2.13.0 transformers)")
        return result
    from sandboxd_client import SandboxClient, reward_model_job

    from sandboxd import images
    from sandboxd.testmodels import make_reward_model
    from sandboxd.verifiers import rewardmodel

    total = pairs or (128 if quick else 512)
    round_count = 2 if quick else 4
    singles = 10 if quick else 30
    images.ensure_images(["reward-model"], progress=False)
    folder = Path(tempfile.mkdtemp(prefix="sandboxd-bench-rm-"))
    model_dir = make_reward_model(folder / "model", size=size)
    config = folder / "sandboxd.toml"
    placement = f'device = "gpu"\n{gpu}\n' if gpu else ""
    if memory_bytes:
        placement += f"memory_bytes = {memory_bytes}\n"
    config.write_text(f'[models.bench]\npath = "{model_dir}"\nmax_length = {MAX_LENGTH}\nmax_batch = {MAX_BATCH}\n'
                      f'batch_wait_ms = {BATCH_WAIT_MS}\ncpus = {threads}\nthreads = {threads}\ndtype = "{dtype}"\n'
                      f"{placement}")
    items = make_pairs(total)
    spans = common.spans(total, round_count)
    daemon = BenchDaemon({"SANDBOXD_CONFIG": str(config), "SANDBOXD_POOL_IMAGES": ""})
    try:
        log(f"rewardmodel: starting a daemon with the model (log {daemon.log_path})")
        daemon.wait_serving()
        local = rewardmodel.load(rewardmodel.ScorerSettings(name="bench", path=str(model_dir), max_length=MAX_LENGTH,
                                                            threads=threads, device="cuda" if gpu else "cpu",
                                                            dtype=dtype))
        with SandboxClient(daemon.address, job_timeout=120.0) as client:
            info = client.info()
            pool = next(p for p in client.pool_status().pools if p.name == "rm-bench")
            warm = make_pairs(2 * MAX_BATCH, seed=SEED + 1)
            client.score_batch([reward_model_job(p, c, model="bench") for p, c in warm])
            _in_process_scores(local, warm, MAX_BATCH)
            rounds = alternate("rewardmodel", spans, {
                "sandboxd": lambda lo, hi: client.score_batch(
                    [reward_model_job(p, c, model="bench") for p, c in items[lo:hi]]),
                "in_process": lambda lo, hi: _in_process_scores(local, items[lo:hi], MAX_BATCH),
            }, unit="pairs")
            seconds = rounds.seconds
            scores: dict[str, list[float | None]] = {"sandboxd": [None] * total, "in_process": [None] * total}
            failures = 0
            for lo, results in rounds.outputs["sandboxd"]:
                scores["sandboxd"][lo:lo + len(results)] = [x.details.raw_score if x.ok else None for x in results]
                failures += sum(not x.ok for x in results)
            for lo, got in rounds.outputs["in_process"]:
                scores["in_process"][lo:lo + len(got)] = got
            one: dict[str, list[float]] = {"sandboxd": [], "in_process": []}
            on_sandbox = []  # the daemon's run_seconds: its sandbox's part of a lone pair
            cgroup_before = _sandbox_cgroup("rm-bench")
            for prompt, completion in items[:singles]:
                t0 = time.perf_counter()
                answer = client.run(reward_model_job(prompt, completion, model="bench"))
                one["sandboxd"].append(time.perf_counter() - t0)
                on_sandbox.append(answer.timings.run_seconds)
                t0 = time.perf_counter()
                local.score([(prompt, completion)])
                one["in_process"].append(time.perf_counter() - t0)
            cgroup_after = _sandbox_cgroup("rm-bench")
    finally:
        daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)
    rate = {side: total / s for side, s in seconds.items()}
    overhead = ratio(rate["in_process"], rate["sandboxd"])
    p50 = {side: statistics.median(values) * 1000 for side, values in one.items()}
    p50_on_sandbox = statistics.median(on_sandbox) * 1000
    # CFS throttling while the lone pairs ran: a sandbox over its cpus quota waits out the period.
    throttled = {key: cgroup_after[key] - cgroup_before[key] for key in ("nr_throttled", "throttled_usec", "usage_usec")
                 if key in cgroup_after and key in cgroup_before}
    diffs = [abs(a - b) for a, b in zip(scores["sandboxd"], scores["in_process"], strict=True)
             if a is not None and b is not None]
    where = f"on {local.describe()['device_name']}" if gpu else f"{threads} threads"
    result.rows = [
        [f"same scorer in-process, batches of {MAX_BATCH}, {where} (no isolation)", str(total),
         fmt(seconds["in_process"], 2), fmt(rate["in_process"], 1), "1.00x", fmt(p50["in_process"], 1)],
        [f"sandboxd score_batch, 1 sandbox ({where}), dynamic batching", str(total),
         fmt(seconds["sandboxd"], 2), fmt(rate["sandboxd"], 1), fmt_ratio(ratio(rate["sandboxd"], rate["in_process"])),
         fmt(p50["sandboxd"], 1)],
    ]
    result.targets = [Target("reward-model overhead", "reported, no target in the issue",
                             f"in-process / sandboxd = {overhead:.2f}x", None)]
    result.notes.append(f"overhead ratio (in-process pairs/s / sandboxd pairs/s): {overhead:.2f}x")
    result.notes.append(f"model: {local.describe()['parameters'] / 1e6:.1f} M parameters, {local.describe()['dtype']}, "
                        f"max_length {MAX_LENGTH}, "
                        f"{statistics.mean(len(local.encode(p, c)) for p, c in items):.0f} tokens per pair on average")
    result.notes.append(f"scores agree: max |sandboxd - in-process| = {max(diffs) if diffs else float('nan'):.2e} "
                        f"over {len(diffs)} pairs; {failures} failed jobs")
    result.notes.append(f"one pair alone (serial): sandboxd p50 {p50['sandboxd']:.1f} ms (includes the "
                        f"{BATCH_WAIT_MS} ms batch window), of it on the sandbox (the daemon's run_seconds) "
                        f"{p50_on_sandbox:.1f} ms; in-process {p50['in_process']:.1f} ms")
    if throttled:
        result.notes.append(f"model sandbox over its {threads} cpus during the {singles} lone pairs: "
                            f"throttled {throttled.get('nr_throttled', 0)} times, "
                            f"{throttled.get('throttled_usec', 0) / 1000:.1f} ms in all; "
                            f"{throttled.get('usage_usec', 0) / 1000 / singles:.1f} ms of CPU per pair")
    result.notes.append(f"pool: {pool.ready} ready, snapshot {pool.snapshot}; daemon {info.version}")
    sandbox_memory = {key: value for key, value in cgroup_after.items() if key in ("max", "current", "peak")}
    if sandbox_memory:
        result.notes.append("model sandbox's memory (cgroup, MiB): " + ", ".join(
            f"{key} {value / 2**20:.0f}" for key, value in sandbox_memory.items()))
    result.data = {"pairs": total, "rounds": len(spans), "seconds": seconds, "pairs_per_s": rate,
                   "overhead_ratio": overhead, "one_pair_p50_ms": p50,
                   "one_pair_on_sandbox_p50_ms": p50_on_sandbox, "lone_pairs_cpu": throttled,
                   "max_abs_diff": max(diffs) if diffs else None,
                   "failures": failures, "threads": threads, "max_batch": MAX_BATCH, "max_length": MAX_LENGTH,
                   "gpu": gpu, "size": size, "device": local.describe()["device_name"] if gpu else "cpu",
                   "sandbox_memory": sandbox_memory}
    return result


def _sandbox_cgroup(pool: str) -> dict[str, int]:
    """The cgroup figures of ``pool``'s first sandbox: memory (``max``, ``current``, ``peak``, in
    bytes: what the model costs the host, GPU or not) and cpu.stat's counters (``usage_usec``,
    ``nr_throttled``, ``throttled_usec``: time the sandbox waited over its ``cpus`` quota), from
    cgroup v2 or v1. Empty where they cannot be read (a remote engine, the systemd driver on
    v1, an engine error): a report without them rather than none."""
    import docker

    from bench.common import log
    from sandboxd.backend import LABEL_POOL

    try:
        client = docker.from_env()
        try:
            containers = client.containers.list(filters={"label": f"{LABEL_POOL}={pool}"})
        finally:
            client.close()
        if not containers:
            return {}
        full_id = containers[0].id
        # cgroup v2: the systemd cgroup driver's folder, then cgroupfs's (dockerd without systemd).
        for folder in (Path(f"/sys/fs/cgroup/system.slice/docker-{full_id}.scope"),
                       Path(f"/sys/fs/cgroup/docker/{full_id}")):
            if (folder / "memory.current").exists():
                return _cgroup_figures({f"memory.{key}": key for key in ("max", "current", "peak")}, folder, folder)
        # cgroup v1 (cgroupfs driver): one hierarchy per controller, other names, ns for the CPU's times.
        memory, cpu = Path(f"/sys/fs/cgroup/memory/docker/{full_id}"), Path(f"/sys/fs/cgroup/cpu/docker/{full_id}")
        if memory.exists():
            figures = _cgroup_figures({"memory.limit_in_bytes": "max", "memory.usage_in_bytes": "current",
                                       "memory.max_usage_in_bytes": "peak"}, memory, cpu)
            if "throttled_time" in figures:
                figures["throttled_usec"] = figures.pop("throttled_time") // 1000
            usage = Path(f"/sys/fs/cgroup/cpuacct/docker/{full_id}/cpuacct.usage")
            if usage.exists():
                figures["usage_usec"] = int(usage.read_text()) // 1000
            return figures
    except Exception as exc:  # a figure of the report, not the run
        log(f"rewardmodel: could not read the model sandbox's cgroup: {exc}")
    return {}


def _cgroup_figures(memory_files: dict[str, str], memory: Path, cpu: Path) -> dict[str, int]:
    """The named memory files of the folder ``memory`` and the counters of ``cpu``/cpu.stat."""
    texts = {key: (memory / name).read_text().strip() for name, key in memory_files.items()
             if (memory / name).exists()}
    if (cpu / "cpu.stat").exists():
        for line in (cpu / "cpu.stat").read_text().splitlines():
            fields = line.split()
            if len(fields) == 2:
                texts[fields[0]] = fields[1]
    return {key: int(text) for key, text in texts.items() if text.isdigit()}


def _agent_hosts(settings: dict[str, Any], items: list[tuple[str, str]], singles: int, hosts: int,
                 local: Any) -> dict[str, Any]:
    """Score ``items`` through ``hosts`` of the agent's RewardModelHost: the scorer process, its
    socket and the dynamic batching a sandbox runs, outside a container; several hosts stand
    for several sandboxes on one GPU (``sandboxes_per_gpu``), each with its share of the GPU's
    memory. Every pair is one concurrent job, dealt round-robin as the daemon spreads them;
    then ``singles`` pairs one at a time, each also scored by ``local`` (the in-process model)
    just before, so that both sides of the lone-pair comparison see the same pairs at the
    same moment."""
    import asyncio

    from sandboxd.agent.host.rewardmodel import RewardModelHost
    from sandboxd.agent.messages import JobResult

    async def main() -> dict[str, Any]:
        share = {"memory_fraction": round(0.9 / hosts, 3)} if hosts > 1 else {}
        started_hosts = [RewardModelHost({**settings, **share}) for _ in range(hosts)]
        t0 = time.perf_counter()
        await asyncio.gather(*(host.start() for host in started_hosts))
        started = time.perf_counter() - t0
        try:
            for host in started_hosts:
                if host.state.get("state") != "ready":
                    raise RuntimeError(f"a scorer did not load the model: {host.state}")

            async def job(index: int, prompt: str, completion: str) -> tuple[float, JobResult]:
                b0 = time.perf_counter()
                answer = await started_hosts[index % hosts].run(
                    {"prompt": prompt, "completion": completion, "limits": {"timeout": 600}})
                return time.perf_counter() - b0, answer

            async def status() -> tuple[int, int]:
                states = [host.status() for host in started_hosts]
                return sum(state["pairs"] for state in states), sum(state["batches"] for state in states)

            await asyncio.gather(*(job(n, p, c) for n, (p, c) in enumerate(items[:2 * MAX_BATCH * hosts])))
            before = await status()
            t0 = time.perf_counter()
            answers = await asyncio.gather(*(job(n, p, c) for n, (p, c) in enumerate(items)))
            elapsed = time.perf_counter() - t0
            after = await status()
            alone = []
            local_alone = []
            for prompt, completion in items[:singles]:
                b0 = time.perf_counter()
                local.score([(prompt, completion)])
                local_alone.append(time.perf_counter() - b0)
                scored = started_hosts[0].scoring_seconds
                seconds, _ = await job(0, prompt, completion)
                alone.append((seconds, started_hosts[0].scoring_seconds - scored))
        finally:
            await asyncio.gather(*(host.close() for host in started_hosts))
        failed = [a for _, a in answers if a["status"] != "ok"]
        if failed:
            raise RuntimeError(f"{len(failed)} jobs failed, the first: {failed[0]}")
        latencies = sorted(seconds for seconds, _ in answers)
        return {"hosts": hosts, **share, "start_seconds": round(started, 2),
                "pairs_per_s": round(len(items) / elapsed, 1),
                "job_p50_ms": round(statistics.median(latencies) * 1000, 1),
                "job_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1),
                "one_pair_p50_ms": round(statistics.median(total for total, _ in alone) * 1000, 1),
                "one_pair_scorer_p50_ms": round(statistics.median(scorer for _, scorer in alone) * 1000, 1),
                "one_pair_in_process_p50_ms": round(statistics.median(local_alone) * 1000, 1),
                "mean_batch": round((after[0] - before[0]) / (after[1] - before[1]), 1),
                "raw": [a["reward_model"]["raw_score"] for _, a in answers]}

    return asyncio.run(main())


def in_process(device: str, size: str, pairs: int, batches: list[int], dtype: str, max_length: int,
               hosts: list[int], batch_tokens: list[int] | None = None) -> dict[str, Any]:
    """No Docker, no daemon: the scorer in this process at each batch size, then the same pairs
    through each count in ``hosts`` of the agent's reward-model host, side by side, with the ratio.
    Each of ``batch_tokens`` (the scorer's max_batch_tokens, 0 its default) gets its own in-process
    runs, the comparison of forward-pass sizes; the hosts use the first."""
    from sandboxd.testmodels import make_reward_model
    from sandboxd.verifiers import rewardmodel

    folder = Path(tempfile.mkdtemp(prefix="sandboxd-rm-"))
    t0 = time.perf_counter()
    make_reward_model(folder / "model", size=size, dtype="bfloat16" if size in ("1b", "8b") else "float32",
                      init_device=device)
    made = time.perf_counter() - t0
    settings: dict[str, Any] = {"name": size, "path": str(folder / "model"), "device": device, "max_length": max_length,
                "dtype": dtype}
    model = rewardmodel.load(rewardmodel.ScorerSettings(**settings))
    described = model.describe()
    items = make_pairs(pairs, prompt_words=(50, 150), completion_words=(100, 400))
    tokens = statistics.mean(len(model.encode(p, c)) for p, c in items)
    report: dict[str, Any] = {"model": described, "made_seconds": round(made, 1), "pairs": pairs,
                              "mean_tokens": round(tokens, 1), "runs": []}
    raw: list[float | None] = []
    budgets = batch_tokens or [0]
    for budget in budgets:
        model.settings.max_batch_tokens = budget
        for batch in batches:
            model.score(items[:batch])  # warm-up at this size
            latencies = []
            t0 = time.perf_counter()
            scored: list[float | None] = []
            for start in range(0, pairs, batch):
                b0 = time.perf_counter()
                scores = model.score(items[start:start + batch])
                latencies.append(time.perf_counter() - b0)
                assert all(s.status == "ok" for s in scores), [s.message for s in scores if s.status != "ok"][:1]
                scored.extend(s.raw for s in scores)
            elapsed = time.perf_counter() - t0
            run = {"batch": batch, "max_batch_tokens": budget, "pairs_per_s": round(pairs / elapsed, 1),
                   "batch_p50_ms": round(statistics.median(latencies) * 1000, 1),
                   "batch_max_ms": round(max(latencies) * 1000, 1)}
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
            if budget == budgets[0]:
                raw = scored
    model.settings.max_batch_tokens = budgets[0]
    settings["max_batch_tokens"] = budgets[0]
    if device == "cuda":
        import torch

        report["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / (1 << 30), 2)
    reference = next((run for run in report["runs"] if run["batch"] == MAX_BATCH), report["runs"][0])
    report["agent_hosts"] = []
    for count in hosts:
        # The in-process model stays loaded: all fit on one GPU, and each host's scorer is a
        # process of its own, as in a sandbox.
        through = _agent_hosts({**settings, "max_batch": MAX_BATCH, "batch_wait_ms": BATCH_WAIT_MS},
                               items, singles=20, hosts=count, local=model)
        agent_raw = through.pop("raw")
        through["vs_in_process"] = (f"{through['pairs_per_s'] / reference['pairs_per_s']:.2f}x of batches of "
                                    f"{reference['batch']}")
        # Same pairs, same weights, but other batch neighbours and padding: bf16 rounding may differ.
        through["max_abs_diff_vs_in_process"] = max(abs(a - b) for a, b in zip(agent_raw, raw, strict=True)
                                                    if a is not None and b is not None)
        report["agent_hosts"].append(through)
        print(json.dumps({"agent_hosts": through}), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/rewardmodel.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides (and sandbox CPUs)")
    parser.add_argument("--in-process", action="store_true", help="time the scorer alone, no Docker, no daemon")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", default="small", help="small, 1b or 8b (see sandboxd/testmodels.py)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--batch-tokens", default="0",
                        help="with --in-process: the scorer's max_batch_tokens, each in turn (0: its default)")
    parser.add_argument("--gpu", default="",
                        help="through the daemon: the TOML line that gives the model's sandbox its GPU, "
                             "e.g. 'cdi_devices = [\"nvidia.com/gpu=0\"]' or 'gpu_ids = [\"0\"]'")
    parser.add_argument("--memory-bytes", type=int, default=0,
                        help="through the daemon: the model sandbox's memory limit (0: the [sandbox] default)")
    parser.add_argument("--hosts", default="1",
                        help="with --in-process: also score through this many agent hosts on one device, "
                             "each count in turn (e.g. 1,2; 0 for none)")
    args = parser.parse_args(argv)
    if args.in_process:
        report = in_process(args.device, args.size, args.pairs or 512,
                            [int(b) for b in args.batches.split(",")], args.dtype, args.max_length,
                            [int(n) for n in args.hosts.split(",") if n.strip() and int(n) > 0],
                            [int(n) for n in args.batch_tokens.split(",")])
        print(json.dumps(report, indent=2))
        return 0
    from bench.run import print_report

    result = run(quick=args.quick, pairs=args.pairs, threads=args.threads, gpu=args.gpu, size=args.size,
                 dtype=args.dtype, memory_bytes=args.memory_bytes)
    print_report([result], "sandboxd bench: rewardmodel")
    return 1 if result.error else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
