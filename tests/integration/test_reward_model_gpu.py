"""Reward models on a GPU through a real daemon and a real Docker engine.

The GPU is attached to each sandbox by the engine, as a CDI device
(``nvidia.com/gpu=0``) or through the NVIDIA runtime (``DeviceRequest``),
whichever the engine has; the scorer inside loads the model on CUDA, and its
scores equal plain transformers on the CPU in this process.

Runs where the engine can attach a GPU and this process sees CUDA: the GPU
machine (docs/reward-models.md says how its engine was set up). Skipped
everywhere else, CI included: CI has no GPU, so these are skips, never failures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from sandboxd import images, rewardpool
from sandboxd.backend import LABEL_POOL
from sandboxd.config import ModelConfig
from sandboxd.testmodels import make_reward_model
from tests.conftest import DaemonProcess
from tests.integration.test_reward_model import job, make_pairs, model_daemon, reference_scores, sandbox_states

torch = pytest.importorskip("torch")
docker = pytest.importorskip("docker")

pytestmark = [pytest.mark.docker, pytest.mark.gpu]
MAX_LENGTH = 40
MAX_BATCH = 8
SANDBOXES_PER_GPU = 2
POOL = rewardpool.pool_name("chat")
# float32 on both sides; the GPU's kernels sum in another order than the CPU's.
REL, ABS = 1e-4, 1e-4


class Attachment(NamedTuple):
    """How the engine attaches the GPU: a CDI device, or a GPU id through the NVIDIA runtime."""

    driver: str  # "cdi" | "nvidia"
    device_ids: list[str]

    @property
    def toml(self) -> str:
        key = "cdi_devices" if self.driver == "cdi" else "gpu_ids"
        return f"{key} = {json.dumps(self.device_ids)}"

    def request(self) -> Any:
        if self.driver == "cdi":
            return docker.types.DeviceRequest(driver="cdi", device_ids=self.device_ids)
        return docker.types.DeviceRequest(device_ids=self.device_ids, capabilities=[["gpu"]])

    def assert_carried_by(self, container: Any) -> None:
        [request] = container.attrs["HostConfig"]["DeviceRequests"]
        assert request["DeviceIDs"] == self.device_ids, request
        if self.driver == "cdi":
            assert request["Driver"] == "cdi", request
        else:
            assert request["Capabilities"] == [["gpu"]], request


def engine_attachment(info: dict[str, Any]) -> Attachment:
    """The GPU attachment the engine can make, or skip."""
    for folder in info.get("CDISpecDirs") or []:
        specs = [path for path in sorted(Path(folder).glob("*")) if path.suffix in (".json", ".yaml", ".yml")]
        # An engine with CDI on lists its spec folders whether or not they name a GPU.
        if any("nvidia.com/gpu" in path.read_text(errors="replace") for path in specs):
            return Attachment("cdi", ["nvidia.com/gpu=0"])
    if not rewardpool.gpu_runtime_problem(info, ModelConfig(path="-", gpu_ids=["0"])):
        return Attachment("nvidia", ["0"])
    pytest.skip("the Docker engine cannot attach a GPU (no NVIDIA CDI spec, no NVIDIA runtime)")


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker engine: {exc}")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def attachment(engine: Any) -> Attachment:
    return engine_attachment(engine.info())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_reward_model(tmp_path_factory.mktemp("models") / "chat", kind="llama")


@pytest.fixture(scope="module")
def reward_image(engine: Any) -> str:
    try:
        return images.ensure_images(["reward-model"], progress=False)["reward-model"]
    except images.ImageError as exc:
        pytest.skip(f"the reward-model image cannot be built here: {exc}")


@pytest.fixture(scope="module")
def gpu_daemon(reward_image: str, attachment: Attachment, model: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Path]]:
    folder = tmp_path_factory.mktemp("gpu-daemon")
    config = folder / "sandboxd.toml"
    config.write_text(f"""
[pool]
images = []
[models.chat]
path = "{model}"
device = "gpu"
{attachment.toml}
sandboxes_per_gpu = {SANDBOXES_PER_GPU}
dtype = "float32"
max_length = {MAX_LENGTH}
max_batch = {MAX_BATCH}
batch_wait_ms = 20
""")
    with model_daemon(folder, "gpu") as running:
        yield running


@pytest.fixture(scope="module")
def channel(gpu_daemon: tuple[DaemonProcess, Path]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gpu_daemon[0].address) as channel:
        yield channel


def pool_containers(engine: Any) -> list[Any]:
    return [container for container in engine.containers.list(filters={"label": f"{LABEL_POOL}={POOL}"})
            if container.status == "running"]


def wait_ready(channel: grpc.Channel, count: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = pb_grpc.PoolStub(channel).GetStatus(pb.GetPoolStatusRequest(), timeout=10)
        if any(pool.name == POOL and pool.ready >= count for pool in status.pools):
            return
        time.sleep(1)
    raise AssertionError(f"{POOL} did not get {count} ready sandboxes in {timeout:.0f} s")


def score_batch(channel: grpc.Channel, pairs: list[tuple[str, str]]) -> list[pb.JobResult]:
    request = pb.RunBatchRequest(jobs=[job("chat", p, c, index) for index, (p, c) in enumerate(pairs)])
    results = sorted(pb_grpc.JobsStub(channel).RunBatch(request, timeout=300), key=lambda r: r.index)
    assert [r.index for r in results] == list(range(len(pairs)))
    return results


def assert_scores(results: list[pb.JobResult], expected: list[float]) -> None:
    for result, want in zip(results, expected, strict=True):
        assert result.status == pb.STATUS_OK, (result.index, result.message)
        assert result.reward_model.device == "cuda:0", result.index
        assert result.reward_model.raw_score == pytest.approx(want, rel=REL, abs=ABS), result.index


def test_only_an_attached_container_sees_the_gpu(engine: Any, reward_image: str, attachment: Attachment) -> None:
    """The image holds no GPU of its own: the device nodes come from the engine's attachment alone."""
    listing = ["python3", "-c", "import os; print(sorted(n for n in os.listdir('/dev') if n.startswith('nvidia')))"]
    plain = engine.containers.run(reward_image, listing, network_mode="none", remove=True)
    attached = engine.containers.run(reward_image, listing, network_mode="none", remove=True,
                                     device_requests=[attachment.request()])
    assert plain.decode().strip() == "[]"
    assert "nvidia0" in attached.decode() and "nvidiactl" in attached.decode()


def test_scores_on_the_gpu_equal_the_cpu_reference(channel: grpc.Channel, model: Path) -> None:
    pairs = make_pairs(48, seed=11)
    expected = reference_scores(model, pairs, MAX_LENGTH)
    assert_scores(score_batch(channel, pairs), expected)
    # Alone, each pair is a batch of one: no padding on either side.
    stub = pb_grpc.JobsStub(channel)
    alone = [stub.Run(job("chat", prompt, completion), timeout=120) for prompt, completion in pairs[:6]]
    assert_scores(alone, expected[:6])


def test_every_sandbox_is_on_the_gpu_the_engine_attached(channel: grpc.Channel, engine: Any,
                                                         gpu_daemon: tuple[DaemonProcess, Path],
                                                         attachment: Attachment) -> None:
    wait_ready(channel, SANDBOXES_PER_GPU)
    containers = pool_containers(engine)
    assert len(containers) == SANDBOXES_PER_GPU
    for container in containers:
        attachment.assert_carried_by(container)
    states = [state for state in sandbox_states(gpu_daemon[1]) if state.get("name") == "chat"]
    assert len(states) == SANDBOXES_PER_GPU
    for state in states:
        assert state["device"] == "cuda:0" and state["dtype"] == "float32"
        assert state["device_name"] != "cpu"
    info = pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
    [gpu] = info.gpus
    assert gpu == f"{attachment.device_ids[0]} ({states[0]['device_name']})"


def test_a_killed_gpu_sandbox_costs_no_pair_and_is_replaced_on_the_gpu(
        channel: grpc.Channel, engine: Any, model: Path, attachment: Attachment) -> None:
    wait_ready(channel, SANDBOXES_PER_GPU)
    victim = pool_containers(engine)[0]
    pairs = make_pairs(64, seed=12)
    expected = reference_scores(model, pairs, MAX_LENGTH)
    # The batch goes out at once, before the daemon's engine watch (every second) has seen the
    # death: pairs dealt to the dead sandbox fail there and are scored again on the other one.
    victim.kill()
    assert_scores(score_batch(channel, pairs), expected)
    deadline = time.monotonic() + 240
    while len(replacements := [c for c in pool_containers(engine) if c.id != victim.id]) < SANDBOXES_PER_GPU:
        assert time.monotonic() < deadline, "the killed GPU sandbox was not replaced in 240 s"
        time.sleep(1)
    wait_ready(channel, SANDBOXES_PER_GPU)
    for container in replacements:
        attachment.assert_carried_by(container)
    assert_scores(score_batch(channel, pairs[:16]), expected[:16])
