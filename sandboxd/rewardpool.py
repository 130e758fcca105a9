"""Reward-model pools: one pool per configured model, its sandboxes on GPUs or on the CPU.

A reward-model sandbox runs the reward-model image with the model's folder
mounted read-only; its agent loads the model once, before it reports ready,
and batches the pairs it is sent (see ``sandboxd.agent.host.rewardmodel``). The
pool is a fixed size, never scaled down: a model is expensive to load.

Placement. With ``gpu_ids`` (or ``cdi_devices``) each sandbox gets one of those
GPUs, ``sandboxes_per_gpu`` sandboxes per GPU, each capped to its share of the
GPU's memory; otherwise every sandbox asks for ``gpu_count`` GPUs, which
Docker takes from the first ones. On the CPU the pool has ``sandboxes``
sandboxes. A GPU pool needs a GPU runtime in the engine: without one the
daemon refuses to start (``device = "gpu"``) or falls back to the CPU
(``device = "auto"``).

Warm start. Every sandbox is long-lived: it loads its model once and stays up.
A CPU-loaded model is in the memory a CRIU snapshot captures, so with
``snapshot = true`` clones are restored with the model loaded; it is off by
default because a restore is slower than a cold start (the dump holds
torch's whole heap). CRIU cannot capture GPU memory (NVIDIA's
cuda-checkpoint would be needed), so a GPU pool never snapshots.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.agent.protocol import MODEL_MOUNT
from sandboxd.backend import DockerBackend, SandboxSpec
from sandboxd.config import Config, ModelConfig
from sandboxd.errors import ConfigError
from sandboxd.images import LABEL_NAME, LABEL_TORCH, missing_image_message
from sandboxd.pool import Pool
from sandboxd.sandbox import Sandbox
from sandboxd.snapshots import SnapshotStore

log = logging.getLogger("sandboxd.rewardpool")
IMAGE = "reward-model"
POOL_PREFIX = "rm-"
GPU_SNAPSHOT_REASON = ("the model is on a GPU and CRIU cannot capture GPU memory (that needs NVIDIA's "
                       "cuda-checkpoint); its sandboxes load it once and stay warm")
NVIDIA_HOOK = "nvidia-container-runtime-hook"
# In-flight jobs per sandbox, in batches: one being scored and the next ones filling.
BATCHES_IN_FLIGHT = 4
# Starting a sandbox costs the model's load on top of the usual ready time.
READY_SLACK_SECONDS = 60.0
FINGERPRINT_CONTENT_BYTES = 16 << 20


def pool_name(model: str) -> str:
    return POOL_PREFIX + model


@dataclass(frozen=True)
class Attachment:
    """The GPUs one sandbox gets; all empty for a CPU sandbox."""

    gpu_count: int = 0
    gpu_ids: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] = ()

    @property
    def gpu(self) -> bool:
        return bool(self.gpu_count or self.gpu_ids or self.cdi_devices)

    def describe(self) -> str:
        if self.gpu_ids or self.cdi_devices:
            return ",".join(self.gpu_ids or self.cdi_devices)
        return "all GPUs" if self.gpu_count == -1 else f"first {self.gpu_count} GPU(s)"


def placement(model: ModelConfig, device: str) -> list[Attachment]:
    """What each sandbox of the model's pool is given, one entry per sandbox."""
    if device == "cpu":
        return [Attachment()] * model.sandboxes
    if model.gpu_ids:
        return [Attachment(gpu_ids=(gpu,)) for gpu in model.gpu_ids for _ in range(model.sandboxes_per_gpu)]
    if model.cdi_devices:
        return [Attachment(cdi_devices=(name,)) for name in model.cdi_devices for _ in range(model.sandboxes_per_gpu)]
    return [Attachment(gpu_count=model.gpu_count)] * model.sandboxes_per_gpu


def memory_fraction(model: ModelConfig) -> float:
    return model.memory_fraction or (1.0 / model.sandboxes_per_gpu if model.sandboxes_per_gpu > 1 else 0.0)


def gpu_runtime_problem(info: dict[str, Any], model: ModelConfig, *, local_engine: bool = True) -> str:
    """'' when the engine (``docker info``) can attach the GPUs ``model`` asks for, else why not."""
    if model.cdi_devices:
        if not info.get("CDISpecDirs"):
            return (f"the Docker engine {info.get('ServerVersion', '?')} has no CDI support (docker info lists no "
                    "CDISpecDirs; CDI needs Docker 25 or later with the cdi feature)")
        discovered = info.get("DiscoveredDevices")
        if discovered is not None:  # Docker 28+ lists the CDI devices it found
            known = {str(device.get("ID")) for device in discovered if device.get("Source") == "cdi"}
            missing = [name for name in model.cdi_devices if name not in known]
            if missing:
                return f"the Docker engine knows no CDI device {', '.join(missing)} (known: {', '.join(known) or '-'})"
        return ""
    runtimes = sorted(info.get("Runtimes") or {})
    if "nvidia" in runtimes or (local_engine and shutil.which(NVIDIA_HOOK)):
        return ""
    return (f"the Docker engine has no GPU runtime (runtimes: {', '.join(runtimes) or '-'}; no {NVIDIA_HOOK}): "
            "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`")


def image_torch_problem(image: str, labels: dict[str, str]) -> str:
    """'' unless the reward-model image (its ``labels``) is known to hold the CPU build of torch.

    Images sandboxd built say which build they hold (images.LABEL_TORCH); those built before
    that label were all CPU builds. An image from elsewhere (no labels) is taken as it is.
    """
    build = labels.get(LABEL_TORCH) or ("cpu" if labels.get(LABEL_NAME) == IMAGE else "")
    if build != "cpu":
        return ""
    return (f"the image {image} has the CPU build of torch: rebuild it with the CUDA build, "
            "`SANDBOXD_TORCH=cuda python -m sandboxd.images build reward-model`")


def resolve_device(name: str, model: ModelConfig, info: dict[str, Any], *, local_engine: bool = True,
                   image_problem: str = "") -> str:
    """"gpu" or "cpu" for ``model``; ConfigError for a GPU model the engine or the image cannot serve."""
    if model.device == "cpu":
        return "cpu"
    problem = gpu_runtime_problem(info, model, local_engine=local_engine) or image_problem
    if not problem:
        return "gpu"
    if model.device == "gpu":
        raise ConfigError(f"models.{name}: device = \"gpu\", but {problem}; or set device = \"cpu\"")
    log.warning("models.%s: no GPU (%s); scoring on the CPU", name, problem)
    return "cpu"


def check_models(config: Config, backend: DockerBackend, image: str) -> dict[str, str]:
    """Start-up checks for every configured model; returns name -> "gpu" | "cpu".

    Blocking (runs in a thread). Every problem is a ConfigError of one line.
    """
    if not config.models:
        return {}
    labels = backend.image_labels(image)
    if labels is None:
        others = backend.images_labelled(LABEL_NAME, IMAGE)
        raise ConfigError(f"reward models need the reward-model image; {missing_image_message(IMAGE, image, others)}")
    # The hook can only be looked for on this machine, so only for a local engine.
    local = config.docker.url.startswith("unix://")
    image_problem = image_torch_problem(image, labels)
    devices = {}
    for name, model in config.models.items():
        folder = Path(model.path)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"models.{name}.path: {folder} is not a model folder (no config.json)")
        devices[name] = resolve_device(name, model, backend.info, local_engine=local, image_problem=image_problem)
    return devices


def model_fingerprint(folder: str) -> str:
    """What identifies the model's files: a changed model rebuilds the snapshot.

    Small files (configs, tokenizer, small weights) by content, so that the same model
    saved again keeps its snapshot; large ones by size and modification time, because
    hashing gigabytes of weights would hold up every start.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file():
            continue
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0".encode())
        if stat.st_size <= FINGERPRINT_CONTENT_BYTES:
            digest.update(path.read_bytes())
        else:
            digest.update(str(stat.st_mtime_ns).encode())
    return digest.hexdigest()[:16]


class RewardModelPool(Pool):
    """The sandboxes of one reward model."""

    # A model loads for up to load_timeout_seconds (600 s) per try. Gating health on it would make the whole
    # daemon NOT_SERVING meanwhile, and every code and math job on the node refused UNAVAILABLE. Its own jobs
    # wait for it instead, as for any pool that is filling.
    gates_health = False

    def __init__(self, model_name: str, model: ModelConfig, device: str, image: str, backend: DockerBackend,
                 config: Config, *, instance: str, node: str, code_dir: str, code_key: str,
                 on_change: Callable[[], None] = lambda: None) -> None:
        super().__init__(pool_name(model_name), image, backend, config, instance=instance, node=node,
                         code_dir=code_dir, code_key=code_key, on_change=on_change)
        self.model_name = model_name
        self.model = model
        self.device = device
        self.attachments = placement(model, device)
        self.model_state: dict[str, Any] = {}
        self.ready_timeout = model.load_timeout_seconds + READY_SLACK_SECONDS
        # No job code runs in these sandboxes (the scorer only reads text), so nothing
        # accumulates that recycling would clear, and a reload can take minutes.
        self.recycle_after_jobs = 0
        self._attached: dict[str, Attachment] = {}
        if device == "gpu":
            self.snapshots.disable(GPU_SNAPSHOT_REASON)
        elif not model.snapshot:
            self.snapshots.disable(f"models.{model_name}.snapshot is off (restoring a CPU-loaded model measured "
                                   "slower than loading it cold; see docs/reward-models.md)")
        else:
            self.snapshot_key = SnapshotStore.key({
                "base": self.snapshot_key, "settings": self.settings(Attachment()),
                "model": model_fingerprint(model.path), "memory": self._memory_bytes(),
                "cpus": self._cpus(),
            })

    # ---- sizing: fixed, always warm ------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.model.max_batch * BATCHES_IN_FLIGHT

    @property
    def target(self) -> int:
        return len(self.attachments)

    @property
    def most_sandboxes(self) -> int:
        return len(self.attachments)

    @property
    def min_ready(self) -> int:
        return 1

    # ---- what a sandbox is given -------------------------------------------------------
    def _cpus(self) -> float:
        return self.model.cpus or self.config.sandbox.cpus

    def _memory_bytes(self) -> int:
        return self.model.memory_bytes or self.config.sandbox.memory_bytes

    def settings(self, attachment: Attachment) -> dict[str, Any]:
        """The agent's ``--reward-model`` settings for a sandbox with ``attachment``."""
        model = self.model
        return {
            "name": self.model_name, "path": MODEL_MOUNT, "device": "cuda" if attachment.gpu else "cpu",
            "max_length": model.max_length, "dtype": model.dtype, "label": model.label,
            "threads": model.threads or max(1, math.ceil(self._cpus())),
            "memory_fraction": memory_fraction(model) if attachment.gpu else 0.0,
            "max_batch": model.max_batch, "batch_wait_ms": model.batch_wait_ms,
            "max_batch_tokens": model.max_batch_tokens,
            "load_timeout_seconds": model.load_timeout_seconds,
        }

    def _next_attachment(self) -> Attachment:
        """The least used of the pool's attachments (a replacement takes the place it frees)."""
        used = Counter(self._attached.values())
        return min(self.attachments, key=lambda attachment: used[attachment] / self.attachments.count(attachment))

    def _spec(self, name: str, control_dir: str) -> SandboxSpec:
        spec = super()._spec(name, control_dir)
        attachment = self._next_attachment()
        if attachment.gpu:
            self._attached[name] = attachment
        spec.command = ["python3", "-m", "sandboxd.agent", "--private-tmp",
                        "--reward-model", json.dumps(self.settings(attachment), sort_keys=True)]
        spec.read_only_mounts = [(os.path.realpath(self.model.path), MODEL_MOUNT)]
        spec.memory_bytes = self._memory_bytes()
        spec.nano_cpus = int(self._cpus() * 1e9)
        spec.gpu_count = attachment.gpu_count
        spec.gpu_device_ids = list(attachment.gpu_ids)
        spec.cdi_devices = list(attachment.cdi_devices)
        # No hub: the model is the mounted folder; caches go to the sandbox's tmpfs.
        spec.environment = {**spec.environment, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                            "HF_HOME": "/tmp/.cache/huggingface", "TOKENIZERS_PARALLELISM": "false"}
        return spec

    def _on_ready(self, sandbox: Sandbox, ready: dict[str, Any]) -> None:
        # The image has python3 and bash, but this pool runs no code jobs: Info.languages must not say so.
        sandbox.languages = []
        self.model_state = dict(ready.get("reward_model") or {})
        if self.model_state.get("state") == "failed":
            log.error("pool %s: model %s failed to load: %s", self.name, self.model_name,
                      self.model_state.get("error", ""))

    def _removed(self, sandbox: Sandbox) -> None:
        # Only once the container is gone: while a removal is retried it still holds its GPU's
        # memory, and a replacement should go to another GPU if the pool has one.
        self._attached.pop(sandbox.name, None)

    def gpus(self) -> list[str]:
        """The GPUs this pool's sandboxes use, for Info.gpus."""
        if self.device != "gpu":
            return []
        name = self.model_state.get("device_name", "")
        return sorted({f"{attachment.describe()}{f' ({name})' if name else ''}" for attachment in self.attachments})
