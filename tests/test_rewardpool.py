"""Reward-model configuration, GPU placement and the container config sent to Docker (no engine needed)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from docker.types import DeviceRequest

from sandboxd import config, rewardpool
from sandboxd.agent.protocol import MODEL_MOUNT
from sandboxd.backend import container_config
from sandboxd.errors import ConfigError
from sandboxd.sandbox import Sandbox
from sandboxd.verifiers.rewardmodel import normalize

NO_GPU_INFO: dict[str, Any] = {"ServerVersion": "20.10.24", "Runtimes": {"runc": {}, "io.containerd.runc.v2": {}}}
NVIDIA_INFO: dict[str, Any] = {"ServerVersion": "26.1.0", "Runtimes": {"runc": {}, "nvidia": {}}}


def load(toml: str, tmp_path: Path, environ: dict[str, str] | None = None) -> config.Config:
    file = tmp_path / "c.toml"
    file.write_text(toml)
    return config.load(file, environ=environ or {})


def make_pool(model: config.ModelConfig, device: str, tmp_path: Path) -> rewardpool.RewardModelPool:
    settings = config.Config()
    settings.pool.snapshots = False
    settings.sandbox.state_dir = str(tmp_path / "state")
    backend: Any = SimpleNamespace(experimental=False, remove=lambda container_id: None)
    return rewardpool.RewardModelPool("rm", model, device, "sandboxd/reward-model:x", backend, settings,
                                      instance="i", node="n", code_dir="/code", code_key="k")


def docker_config(pool: rewardpool.RewardModelPool, name: str) -> dict[str, Any]:
    return container_config(pool._spec(name, f"/run/x/{name}"))


# ---- configuration ----------------------------------------------------------------------
def test_models_from_file_and_environment(tmp_path: Path) -> None:
    loaded = load('[models.skywork]\npath = "/models/skywork"\nmax_length = 4096\nnormalize = "sigmoid"\n'
                  'gpu_ids = ["0", "1"]\nsandboxes_per_gpu = 2\n', tmp_path,
                  environ={"SANDBOXD_MODELS_SKYWORK_BATCH_WAIT_MS": "2.5",
                           "SANDBOXD_MODELS_SMALL_RM_PATH": "/models/small", "SANDBOXD_MODELS_SMALL_RM_DEVICE": "cpu"})
    skywork, small = loaded.models["skywork"], loaded.models["small_rm"]
    assert (skywork.path, skywork.max_length, skywork.normalize) == ("/models/skywork", 4096, "sigmoid")
    assert (skywork.gpu_ids, skywork.sandboxes_per_gpu, skywork.batch_wait_ms) == (["0", "1"], 2, 2.5)
    assert (small.path, small.device) == ("/models/small", "cpu")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[models.m]\npath = "relative"\n', "models.m.path must be an absolute host path"),
        ('[models.m]\npath = "/m"\nnormalize = "tanh"\n', "models.m.normalize must be none, sigmoid or affine"),
        ('[models.m]\npath = "/m"\ndevice = "tpu"\n', "models.m.device must be auto, cpu or gpu"),
        ('[models.m]\npath = "/m"\ngpu_ids = ["0"]\ncdi_devices = ["nvidia.com/gpu=0"]\n',
         "models.m: set gpu_ids or cdi_devices, not both"),
        ('[models.m]\npath = "/m"\nmemory_fraction = 1.5\n', "models.m.memory_fraction must be between 0 and 1"),
        ('[models.m]\npath = "/m"\ncolour = "blue"\n', "unknown key models.m.colour"),
        ('[models.m]\npath = "/m"\nmax_batch = "many"\n', "expected an integer"),
        ('[models."Bad Name"]\npath = "/m"\n', "model name 'Bad Name'"),
    ],
)
def test_bad_model_settings_are_one_line_errors(toml: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load(toml, tmp_path)
    assert "\n" not in str(error.value)


# ---- placement and the DeviceRequest sent to Docker ----------------------------------------
def test_gpu_count_sandbox_asks_docker_for_gpus(tmp_path: Path) -> None:
    pool = make_pool(config.ModelConfig(path=str(tmp_path), gpu_count=1, sandboxes_per_gpu=2), "gpu", tmp_path)
    assert pool.target == 2
    created = docker_config(pool, "a")
    assert created["device_requests"] == [DeviceRequest(count=1, capabilities=[["gpu"]])]
    settings = json.loads(created["command"][created["command"].index("--reward-model") + 1])
    assert settings["device"] == "cuda"
    assert settings["memory_fraction"] == 0.5  # two sandboxes share the GPU
    assert pool.snapshots.state.startswith("disabled: the model is on a GPU and CRIU cannot capture GPU memory")


def test_gpu_ids_spread_sandboxes_over_gpus(tmp_path: Path) -> None:
    model = config.ModelConfig(path=str(tmp_path), gpu_ids=["0", "GPU-8a1b"], sandboxes_per_gpu=2,
                               memory_fraction=0.4)
    pool = make_pool(model, "gpu", tmp_path)
    assert pool.target == 4
    requests = [docker_config(pool, f"s{n}")["device_requests"] for n in range(4)]
    for request in requests:
        assert len(request) == 1 and request[0]["Capabilities"] == [["gpu"]] and not request[0]["Count"]
    assert sorted(request[0]["DeviceIDs"][0] for request in requests) == ["0", "0", "GPU-8a1b", "GPU-8a1b"]
    settings = json.loads(docker_config(pool, "s4")["command"][-1])
    assert settings["memory_fraction"] == 0.4


async def test_replacement_takes_the_freed_gpu(tmp_path: Path) -> None:
    pool = make_pool(config.ModelConfig(path=str(tmp_path), gpu_ids=["0", "1"]), "gpu", tmp_path)
    first, second = docker_config(pool, "a"), docker_config(pool, "b")
    assert {first["device_requests"][0]["DeviceIDs"][0], second["device_requests"][0]["DeviceIDs"][0]} == {"0", "1"}
    docker_config(pool, "x")  # a's GPU now has two sandboxes: c can only get it if removing a frees a place
    await pool._remove(Sandbox(name="a", pool="rm", container_id="a", control_dir=str(tmp_path / "a"),
                               started_by="cold"))
    assert docker_config(pool, "c")["device_requests"] == first["device_requests"]


async def test_a_gpu_is_not_handed_on_while_its_sandbox_removal_is_retried(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A container the engine would not remove yet still holds its GPU's memory: its replacement goes to
    another GPU, and the place is freed once the container is gone."""
    from sandboxd import pool as pool_module

    monkeypatch.setattr(pool_module, "REMOVE_RETRY_SECONDS", (0.0,))
    pool = make_pool(config.ModelConfig(path=str(tmp_path), gpu_ids=["0", "1"]), "gpu", tmp_path)
    first, _second, _third = docker_config(pool, "a"), docker_config(pool, "b"), docker_config(pool, "x")
    tries: list[str] = []

    def refuse_once(container_id: str) -> None:
        tries.append(container_id)
        if len(tries) == 1:
            raise RuntimeError("500 Server Error: containerd is busy")

    pool.backend = SimpleNamespace(experimental=False, remove=refuse_once)  # type: ignore[assignment]
    await pool._remove(Sandbox(name="a", pool="rm", container_id="a", control_dir=str(tmp_path / "a"),
                               started_by="cold"))
    assert docker_config(pool, "c")["device_requests"] != first["device_requests"]  # a still holds its GPU
    await asyncio.gather(*pool._tasks)
    assert tries == ["a", "a"]
    assert docker_config(pool, "d")["device_requests"] == first["device_requests"]


def test_cdi_device_names(tmp_path: Path) -> None:
    pool = make_pool(config.ModelConfig(path=str(tmp_path), cdi_devices=["nvidia.com/gpu=0"]), "gpu", tmp_path)
    assert docker_config(pool, "a")["device_requests"] == [DeviceRequest(driver="cdi",
                                                                         device_ids=["nvidia.com/gpu=0"])]


def test_cpu_sandbox_has_no_devices_and_mounts_the_model_read_only(tmp_path: Path) -> None:
    model = config.ModelConfig(path=str(tmp_path), sandboxes=3, cpus=2.0, memory_bytes=4 << 30, max_batch=16,
                               max_batch_tokens=2048)
    pool = make_pool(model, "cpu", tmp_path)
    created = docker_config(pool, "a")
    assert created["device_requests"] is None
    mount = next(m for m in created["mounts"] if m["Target"] == MODEL_MOUNT)
    assert (mount["Source"], mount["ReadOnly"]) == (str(tmp_path.resolve()), True)
    assert (created["nano_cpus"], created["mem_limit"], created["network_mode"]) == (2_000_000_000, 4 << 30, "none")
    assert created["environment"]["HF_HUB_OFFLINE"] == "1"
    settings = json.loads(created["command"][-1])
    assert (settings["device"], settings["threads"], settings["path"]) == ("cpu", 2, MODEL_MOUNT)
    assert (settings["max_batch"], settings["max_batch_tokens"]) == (16, 2048)
    assert (pool.target, pool.capacity) == (3, 16 * rewardpool.BATCHES_IN_FLIGHT)
    assert pool.recycle_after_jobs == 0  # no job code runs there: never recycled for a job count


# ---- refusing a GPU pool without a GPU runtime ----------------------------------------------
def test_gpu_model_refused_without_gpu_runtime() -> None:
    model = config.ModelConfig(path="/m", device="gpu")
    with pytest.raises(ConfigError) as error:
        rewardpool.resolve_device("big", model, NO_GPU_INFO, local_engine=False)
    message = str(error.value)
    assert message.startswith('models.big: device = "gpu", but the Docker engine has no GPU runtime (runtimes: ')
    assert "nvidia-ctk runtime configure" in message and "\n" not in message


def test_auto_falls_back_to_cpu_and_uses_a_gpu_runtime() -> None:
    model = config.ModelConfig(path="/m")
    assert rewardpool.resolve_device("m", model, NO_GPU_INFO, local_engine=False) == "cpu"
    assert rewardpool.resolve_device("m", model, NVIDIA_INFO, local_engine=False) == "gpu"
    assert rewardpool.resolve_device("m", config.ModelConfig(path="/m", device="cpu"), NVIDIA_INFO) == "cpu"


def test_a_gpu_model_needs_an_image_with_cuda_torch() -> None:
    image = "sandboxd/reward-model:abc"
    cpu_image = rewardpool.image_torch_problem(image, {"org.sandboxd.image": "reward-model",
                                                        "org.sandboxd.torch": "cpu"})
    assert "has the CPU build of torch" in cpu_image and "SANDBOXD_TORCH=cuda" in cpu_image
    # Built before the label: every such image holds the CPU build.
    assert rewardpool.image_torch_problem(image, {"org.sandboxd.image": "reward-model"}) == cpu_image
    assert rewardpool.image_torch_problem(image, {"org.sandboxd.image": "reward-model",
                                                   "org.sandboxd.torch": "cuda"}) == ""
    assert rewardpool.image_torch_problem(image, {}) == ""  # an image from elsewhere is taken as it is
    with pytest.raises(ConfigError) as error:
        rewardpool.resolve_device("big", config.ModelConfig(path="/m", device="gpu"), NVIDIA_INFO,
                                  image_problem=cpu_image)
    assert str(error.value).startswith(f'models.big: device = "gpu", but the image {image} has the CPU build')
    assert rewardpool.resolve_device("m", config.ModelConfig(path="/m"), NVIDIA_INFO, image_problem=cpu_image) == "cpu"
    assert rewardpool.resolve_device("m", config.ModelConfig(path="/m"), NVIDIA_INFO, image_problem="") == "gpu"


def test_cdi_needs_an_engine_with_cdi() -> None:
    model = config.ModelConfig(path="/m", device="gpu", cdi_devices=["nvidia.com/gpu=1"])
    assert "no CDI support" in rewardpool.gpu_runtime_problem(NO_GPU_INFO, model)
    discovered = {"CDISpecDirs": ["/etc/cdi"], "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}
    assert "no CDI device nvidia.com/gpu=1" in rewardpool.gpu_runtime_problem(discovered, model)
    assert rewardpool.gpu_runtime_problem({"CDISpecDirs": ["/etc/cdi"]}, model) == ""


# ---- normalisation -----------------------------------------------------------------------
def test_normalize() -> None:
    assert normalize(2.5, "none", 3.0, 1.0) == 2.5
    assert normalize(2.5, "affine", 2.0, -1.0) == 4.0
    assert normalize(0.0, "sigmoid") == 0.5
    assert normalize(1.0, "sigmoid", 2.0, 1.0) == pytest.approx(1 / (1 + math.exp(-3.0)))
    assert normalize(-1e6, "sigmoid") == 0.0 and normalize(1e6, "sigmoid") == 1.0


# ---- jobs: validation at the door and the result -------------------------------------------
def reward_job(model: str = "", prompt: str = "p", completion: str = "c") -> Any:
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

    return pb.Job(index=3, reward_model=pb.RewardModelJob(model=model, prompt=prompt, completion=completion))


def with_models(**models: config.ModelConfig) -> config.Config:
    settings = config.Config()
    settings.models = dict(models)
    return settings


def test_reward_model_jobs_are_validated() -> None:
    from sandboxd import jobs
    from sandboxd.errors import InvalidRequest, Unsupported

    with pytest.raises(Unsupported, match=r"no reward models \(configure one as \[models.NAME\]\)"):
        jobs.prepare(reward_job("rm"), config.Config())
    one = with_models(rm=config.ModelConfig(path="/m"))
    prepared = jobs.prepare(reward_job(), one)  # the only model is the default
    assert (prepared.kind, prepared.pool) == ("reward_model", "rm-rm")
    assert prepared.agent_job is not None and prepared.agent_job["kind"] == "reward_model"
    assert prepared.agent_job["prompt"] == "p"
    two = with_models(a=config.ModelConfig(path="/a"), b=config.ModelConfig(path="/b"))
    with pytest.raises(InvalidRequest, match=r"jobs\[3\].reward_model.model '' is not configured \(configured: a, b\)"):
        jobs.prepare(reward_job(), two)
    with pytest.raises(InvalidRequest, match="limited to"):
        jobs.prepare(reward_job("a", completion="x" * (jobs.MAX_REWARD_MODEL_CHARS + 1)), two)


def test_reward_model_result_is_normalised_and_never_nan() -> None:
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

    from sandboxd import jobs

    settings = with_models(rm=config.ModelConfig(path="/m", normalize="affine", scale=2.0, shift=-1.0))
    prepared = jobs.prepare(reward_job("rm"), settings)
    ok = jobs.to_result(prepared, {"status": "ok", "reward_model": {"raw_score": 0.75, "model": "rm",
                                                                    "device": "cpu"}}, 1)
    assert (ok.status, ok.reward, ok.reward_model.raw_score, ok.reward_model.device) == (pb.STATUS_OK, 0.5, 0.75,
                                                                                        "cpu")
    broken = jobs.to_result(prepared, {"status": "ok", "reward_model": {"raw_score": float("nan")}}, 1)
    assert (broken.status, broken.reward) == (pb.STATUS_INTERNAL, -1.0)
    oom = jobs.to_result(prepared, {"status": "memory_limit", "limit": "memory", "message": "CUDA out of memory"}, 1)
    assert (oom.status, oom.limit_hit, oom.reward) == (pb.STATUS_MEMORY_LIMIT, pb.LIMIT_MEMORY, -1.0)


def test_a_model_starts_all_its_sandboxes_whatever_the_job_pools_ceiling(tmp_path: Path) -> None:
    """pool.max_size caps the job pools; a reward model's sandboxes are its own count (regression: capped at 2)."""
    pool = make_pool(config.ModelConfig(path=str(tmp_path), sandboxes=6, device="cpu"), "cpu", tmp_path)
    pool.config.pool.max_size = 2
    started: list[int] = []

    async def add_one() -> None:
        started.append(1)
        pool.starting -= 1

    pool._add_one = add_one  # type: ignore[method-assign]
    asyncio.run(pool._reconcile())
    assert (pool.most_sandboxes, len(started)) == (6, 6)
