"""Small builders for raw API calls, and checks, that integration tests share."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from sandboxd_client import SandboxdError
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from sandboxd import auth
from tests.conftest import skip_or_fail

if TYPE_CHECKING:
    import trustme

# 0.11 s of CPU alone (/usr/bin/python3 here); a program that shares one CPU with 30 busy processes gets about
# 1/31 of it, so 3.4 s or more: over a 2 s limit.
NEEDS_CPU = "print(sum(i * i for i in range(3_000_000)) % 7)"


def write_leaf(folder: Path, name: str, leaf: trustme.LeafCert) -> None:
    """`leaf`'s key as `folder`/`name`.key and its certificate chain as `folder`/`name`.pem."""
    leaf.private_key_pem.write_to_path(folder / f"{name}.key")
    for pem in leaf.cert_chain_pems:
        pem.write_to_path(folder / f"{name}.pem", append=True)


def refusal(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """The status and message a call was refused with (the client's error, or the raw gRPC one)."""
    try:
        call()
    except SandboxdError as error:
        return error.code or grpc.StatusCode.UNKNOWN, error.message
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def assert_strangers_refused(refusals: dict[str, tuple[grpc.StatusCode, str]]) -> None:
    """Each kind of stranger at a TCP door (mutual TLS and tokens) was refused with its own status and message."""
    assert {name: code for name, (code, _) in refusals.items()} == {
        "no token": grpc.StatusCode.UNAUTHENTICATED,
        "wrong token": grpc.StatusCode.UNAUTHENTICATED,
        "jobs token, batch hint": grpc.StatusCode.PERMISSION_DENIED,
        # The TLS handshake fails: the call never reaches the daemon's code.
        "certificate of another CA": grpc.StatusCode.UNAVAILABLE,
        "plaintext": grpc.StatusCode.UNAVAILABLE,
    }, refusals
    # Which refusal, and nothing else (the client puts the status's name first).
    assert refusals["no token"][1] == refusals["wrong token"][1] == f"UNAUTHENTICATED: {auth.UNAUTHENTICATED_MESSAGE}"
    assert refusals["jobs token, batch hint"][1] == f"PERMISSION_DENIED: {auth.PERMISSION_DENIED_MESSAGE}"


# How a run others kept off the CPU for more of its time than its deadline could move for is answered
# (runner.starved_reason): retried, and SANDBOX_LOST once the daemon's attempts are spent, whose message is the last
# attempt's (a session's cell: INTERNAL, "not charged"). On a host that leaves a sandbox less than a third of a CPU a
# busy loop is answered so too: no count tells it from a correct program that needed its time.
KEPT_OFF = re.compile(r"took (?:the sandbox's|its) CPU: in ([\d.]+) s this run ran ([\d.]+) s")


def kept_off_the_cpu(result: pb.JobResult) -> bool:
    """Whether `result` is the uncharged answer of a run that others kept off the CPU for most of its time."""
    return result.status == pb.STATUS_SANDBOX_LOST and KEPT_OFF.search(result.message) is not None


def run(channel: grpc.Channel, job: pb.Job, timeout: float = 120) -> pb.JobResult:
    return pb_grpc.JobsStub(channel).Run(job, timeout=timeout)


def execute(code: str, *, language: str = "python", stdin: bytes = b"", timeout: float = 5.0,
            memory: int = 0, output: int = 0, **fields: Any) -> pb.Job:
    return pb.Job(limits=pb.Limits(timeout_seconds=timeout, memory_bytes=memory, output_bytes=output),
                  execute=pb.ExecuteJob(language=language, code=code, stdin=stdin, **fields))


def code(completion: str, tests: dict[str, Any] | None = None, *, language: str = "python",
         timeout: float = 5.0, **fields: Any) -> pb.Job:
    return pb.Job(limits=pb.Limits(timeout_seconds=timeout),
                  code=pb.CodeJob(completion=completion, language=language,
                                  tests=pb.CodeTests(dataset_json=json.dumps(tests or {})), **fields))


def math(completion: str, ground_truth: str, *, timeout: float = 5.0) -> pb.Job:
    return pb.Job(limits=pb.Limits(timeout_seconds=timeout),
                  math=pb.MathJob(completion=completion, ground_truth=ground_truth))


def require_snapshot(state: str, where: str = "") -> None:
    """Skip where a pool's snapshot store is off (by configuration, or where CRIU or the engine cannot
    checkpoint: the store says "disabled"); fail where it tried and failed, which is a bug."""
    if state.startswith("disabled"):
        pytest.skip(f"snapshots are off here: {where}{state}")
    assert state == "ready", f"a snapshot failed: {where}{state}"


def require_snapshots(info: pb.Info) -> None:
    """require_snapshot() for every pool of a daemon, from its Info.snapshot_state."""
    for part in info.snapshot_state.split("; "):
        name, _, state = part.partition(": ")
        if not state.startswith("disabled"):
            require_snapshot(state, f"{name}: ")
    if not info.snapshots:
        pytest.skip(f"snapshots are off here: {info.snapshot_state}")


def pool_settled(pool: pb_grpc.PoolStub, name: str, ready: int) -> pb.PoolState:
    """Wait (up to 120 s) until pool `name` has `ready` sandboxes and starts no more."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = pool.GetStatus(pb.GetPoolStatusRequest(), timeout=5)
        state = next(p for p in status.pools if p.name == name)
        if state.ready >= ready and not state.starting:
            return state
        time.sleep(0.3)
    pytest.fail(f"pool {name} did not reach {ready} ready sandboxes: {state}")


@contextlib.contextmanager
def trl_offline(monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[None]:
    """For a test that runs TRL on a tiny model: skip (fail under CI) without its libraries; no Hugging Face hub,
    HF_HOME at ``home``, TRL's experimental-feature warning silenced, and one torch thread while it lasts.

    One thread: a 2-layer, hidden-64 model's products are too small to share, and on 2 cores that other processes
    keep busy two intra-op threads mostly wait for each other (a GRPOTrainer step of test_trl_tools.py: 51 s of
    wall clock with two, 6.4 s with one, at a load average of 20).
    """
    missing = [m for m in ("torch", "transformers", "trl", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        skip_or_fail(f"no {', '.join(missing)}: run scripts/setup.sh (the test extra; torch==2.13.0 first)")
    for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                       "HF_HOME": str(home), "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1",
                       "WANDB_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
