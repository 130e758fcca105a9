"""Docker, and nothing else: containers, labels, checkpoints.

docker-py's friendly layer covers create/start/remove; checkpoint/restore is
only in the Engine API, so the two raw endpoints are called through
docker-py's low-level client. Every call here is blocking: callers run them
in a thread (asyncio.to_thread) so the event loop never waits on Docker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import DeviceRequest, Mount, Ulimit

from sandboxd import seccomp
from sandboxd.config import DEFAULT_TMPFS_INODES
from sandboxd.errors import BackendUnavailable, SandboxLost

LABEL_MANAGED = "io.sandboxd.managed"
LABEL_INSTANCE = "io.sandboxd.instance"
LABEL_POOL = "io.sandboxd.pool"
# Which daemon (by its listening addresses) owns a sandbox: orphans are reaped per node.
LABEL_NODE = "io.sandboxd.node"
# Which process owns a sandbox (pool.owner_token): a daemon on this host that has died, whatever it listened on.
LABEL_OWNER = "io.sandboxd.owner"
LABEL_IMAGE = "io.sandboxd.image"

# The agent runs as root inside the sandbox, stripped of every capability
# but these: dropping each job to a uid of its own (SETUID, SETGID), killing
# what a job leaves behind (KILL), and giving the job a work dir and
# removing it afterwards whatever the job did to its permissions (CHOWN,
# DAC_OVERRIDE, FOWNER). Jobs themselves run with none: a uid change away
# from 0 clears the capability sets, and no-new-privileges keeps them clear.
AGENT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"]

# PTYs are a host-wide count (kernel.pty.max): a job that opens every one
# makes `docker run -t` fail on the host. An empty, read-only tmpfs replaces
# the container's devpts (Docker drops its default mount where ours has the
# same path), so /dev/ptmx, a link to pts/ptmx, leads nowhere and openpty()
# fails with ENOENT; without CAP_MKNOD or CAP_SYS_ADMIN nothing in the
# sandbox can make another. Nothing there needs a terminal.
MASKED_PTS = "/dev/pts"

# What exit_report quotes of a stopped container's output: enough for a
# Python traceback's last frames, short enough for one log line.
EXIT_REPORT_LINES = 20
EXIT_REPORT_CHARS = 2000


@dataclass
class SandboxSpec:
    """Everything Docker needs to create one sandbox container."""

    name: str
    image: str
    command: list[str]
    control_dir: str  # host folder bind-mounted at CONTROL_MOUNT
    code_dir: str  # host folder with the agent's code, mounted read-only
    labels: dict[str, str]
    memory_bytes: int
    nano_cpus: int
    pids: int
    tmpfs_bytes: int
    # Entries (files, folders, hard links) /tmp and /dev/shm may each hold: config.DEFAULT_TMPFS_INODES.
    tmpfs_inodes: int = DEFAULT_TMPFS_INODES
    # GPUs: Docker picks `gpu_count` (-1: all), or exactly `gpu_device_ids` (indexes or UUIDs),
    # through the engine's NVIDIA driver; `cdi_devices` names devices for the engine's CDI
    # driver instead ("nvidia.com/gpu=0"). Either way the container sees only those.
    gpu_count: int = 0
    gpu_device_ids: list[str] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    # (host folder, container path) pairs mounted read-only: a reward model's weights.
    read_only_mounts: list[tuple[str, str]] = field(default_factory=list)
    # IP sockets on the sandbox's loopback (sandbox.loopback); refused by the seccomp profile otherwise.
    loopback: bool = False


CONTROL_MOUNT = "/run/sandboxd-agent"
CLONE_NONCE_FILE = "sandboxd-clone"
CODE_MOUNT = "/opt/sandboxd"


# Per sandbox (IPC namespace). Segments at most 64 MiB in all (shmall is in
# 4 KiB pages) and 256 of them; 32 message queues of 16 KiB; 128 semaphore
# sets of 8,192 semaphores in all (Linux's defaults are practically unbounded).
IPC_SYSCTLS = {
    "kernel.shm_rmid_forced": "1",
    "kernel.shmmax": str(64 << 20),
    "kernel.shmall": str((64 << 20) // 4096),
    "kernel.shmmni": "256",
    "kernel.msgmni": "32",
    "kernel.msgmnb": "16384",
    "kernel.sem": "250 8192 32 128",
}


def container_config(spec: SandboxSpec) -> dict[str, Any]:
    """The create-container arguments for a sandbox: the hardening profile lives here."""
    device_requests = []
    if spec.gpu_device_ids:
        device_requests.append(DeviceRequest(device_ids=spec.gpu_device_ids, capabilities=[["gpu"]]))
    elif spec.gpu_count:
        device_requests.append(DeviceRequest(count=spec.gpu_count, capabilities=[["gpu"]]))
    if spec.cdi_devices:
        device_requests.append(DeviceRequest(driver="cdi", device_ids=spec.cdi_devices))
    return {
        "image": spec.image,
        "command": spec.command,
        "name": spec.name,
        "labels": spec.labels,
        "environment": {"PYTHONPATH": CODE_MOUNT, "PYTHONDONTWRITEBYTECODE": "1", **spec.environment},
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "cap_add": AGENT_CAPABILITIES,
        # Docker's default seccomp profile less kernel AIO, io_uring, memfd_secret and (unless
        # sandbox.loopback) IP sockets: sandboxd/seccomp.py.
        "security_opt": ["no-new-privileges", f"seccomp={seccomp.profile_json(loopback=spec.loopback)}"],
        "read_only": True,
        # mode=755: only the agent creates folders here, one per run, so a
        # job has no shared place to leave files for the next one. nr_inodes:
        # the size caps bytes only, and hard links take none (see config).
        # /dev/shm is mounted here too, as Docker would (64 MiB), for its nr_inodes.
        "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={spec.tmpfs_bytes},nr_inodes={spec.tmpfs_inodes},mode=755",
                  "/dev/shm": f"rw,noexec,nosuid,nodev,size={64 << 20},nr_inodes={spec.tmpfs_inodes},mode=1777"},
        # System V IPC: a shared memory segment that no process maps is charged
        # to the sandbox's memory but belongs to no process, so RLIMIT_AS
        # (one mapping at a time) and the OOM killer (it frees processes) cannot
        # take it back: with 2 GiB of detached segments left by a run, the OOM
        # killer can only kill the agent, and every job in the sandbox is lost.
        # shm_rmid_forced frees a segment as soon as no
        # process maps it (while mapped it is a process's memory, under its
        # limits); the others cap what the namespace's objects can hold.
        "sysctls": IPC_SYSCTLS,
        "mem_limit": spec.memory_bytes,
        "memswap_limit": spec.memory_bytes,
        "nano_cpus": spec.nano_cpus,
        "pids_limit": spec.pids,
        "ulimits": [Ulimit(name="nofile", soft=4096, hard=4096), Ulimit(name="core", soft=0, hard=0)],
        "mounts": [
            Mount(target=CONTROL_MOUNT, source=spec.control_dir, type="bind"),
            Mount(target=CODE_MOUNT, source=spec.code_dir, type="bind", read_only=True),
            Mount(target=MASKED_PTS, source=None, type="tmpfs", read_only=True, tmpfs_size=4096, tmpfs_mode=0o755),
            *(Mount(target=target, source=source, type="bind", read_only=True)
              for source, target in spec.read_only_mounts),
        ],
        "device_requests": device_requests or None,
        "detach": True,
    }


def profile_key() -> str:
    """A digest of what container_config() sets beyond a pool's settings: the seccomp profile, mounts, limits.

    It keys snapshots (SnapshotStore.key): a restored process keeps what
    CRIU dumped from the template, its seccomp filter, rlimits and tmpfs
    mounts included, not what its clone's container asks for, so a
    checkpoint made under another profile must not be restored.
    """
    probe = SandboxSpec(name="", image="", command=[], control_dir="/control", code_dir="/code", labels={},
                        memory_bytes=1, nano_cpus=1, pids=1, tmpfs_bytes=1)
    text = json.dumps(container_config(probe), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class DockerBackend:
    """A thin, blocking wrapper over one Docker engine."""

    def __init__(self, url: str, timeout_seconds: float = 60.0) -> None:
        try:
            self.client = docker.DockerClient(base_url=url, timeout=int(timeout_seconds))
            self.client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise BackendUnavailable(f"Docker engine at {url} does not answer: {exc}") from None
        self.api = self.client.api
        info = self.client.info()
        self.info: dict[str, Any] = info
        self.root_dir = Path(info.get("DockerRootDir", "/var/lib/docker"))
        self.experimental = bool(info.get("ExperimentalBuild"))

    def image_labels(self, name: str) -> dict[str, str] | None:
        """The image's labels; None when there is no such image."""
        try:
            return dict(self.api.inspect_image(name).get("Config", {}).get("Labels") or {})
        except docker.errors.ImageNotFound:
            return None

    def image_exists(self, name: str) -> bool:
        return self.image_labels(name) is not None

    def images_labelled(self, key: str, value: str) -> list[tuple[str, dict[str, str]]]:
        """(reference, labels) of every tagged image whose label ``key`` is ``value``, newest first."""
        found = sorted(self.api.images(filters={"label": f"{key}={value}"}), key=lambda image: image.get("Created", 0),
                       reverse=True)
        return [(ref, dict(image.get("Labels") or {})) for image in found for ref in image.get("RepoTags") or []
                if ref != "<none>:<none>"]

    def create(self, spec: SandboxSpec) -> str:
        config = container_config(spec)
        config.pop("detach")
        container = self.client.containers.create(**config)
        return container.id

    def start(self, container_id: str, checkpoint: str = "") -> None:
        try:
            if checkpoint:
                url = self.api._url("/containers/{0}/start", container_id)
                self.api._raise_for_status(self.api._post(url, params={"checkpoint": checkpoint}))
            else:
                self.api.start(container_id)
        except docker.errors.NotFound:
            raise SandboxLost(f"container {container_id[:12]} vanished") from None

    def checkpoint(self, container_id: str, name: str, directory: str, *, exit_after: bool) -> None:
        """`docker checkpoint create [--leave-running] --checkpoint-dir DIR`."""
        url = self.api._url("/containers/{0}/checkpoints", container_id)
        body = {"CheckpointID": name, "CheckpointDir": directory, "Exit": exit_after}
        self.api._raise_for_status(self.api._post_json(url, data=body))

    def install_checkpoint(self, container_id: str, source: Path, name: str) -> None:
        """Copy a checkpoint into a container's own checkpoint folder.

        The engine refuses a custom checkpoint dir on restore ("custom
        checkpointdir is not supported"), so each clone gets a copy where
        the engine looks by default.
        """
        target = self.root_dir / "containers" / container_id / "checkpoints" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target, dirs_exist_ok=True)
        # The engine uploads the folder to containerd's content store by digest
        # and commits without tolerating an existing blob: a copy left there
        # (a restore cut short, a daemon killed mid-restore) would fail every
        # later restore of the same snapshot with "content sha256:... already
        # exists". A file unique to the clone makes each upload's digest
        # its own; CRIU reads its images by name and ignores the file.
        (target / CLONE_NONCE_FILE).write_text(container_id)

    def remove(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # Someone else removes it already (an operator's `docker rm -f`): it goes either way.
            if exc.status_code != 409 or "already in progress" not in str(exc):
                raise

    def init_pid(self, container_id: str) -> int:
        """The host pid of the container's first process (0 once it has stopped).

        No other live container holds it, which makes it the sandbox's uid
        slot (see agent/protocol.py).
        """
        return int(self.api.inspect_container(container_id)["State"].get("Pid") or 0)

    def is_running(self, container_id: str) -> bool:
        try:
            state = self.api.inspect_container(container_id)["State"]
        except docker.errors.NotFound:
            return False
        return bool(state.get("Running"))

    def answers(self) -> bool:
        """Whether the engine answers a ping (a frozen one: after docker.timeout_seconds)."""
        try:
            return bool(self.client.ping())
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False

    def exit_report(self, container_id: str, wait_seconds: float = 0.0) -> str:
        """How a container that ran and stopped ended, for an operator; "" while it runs, or if it never ran.

        Its exit status, whether the out-of-memory killer ended it, and the
        last lines its processes wrote (an agent's traceback lands there).
        `wait_seconds`: how long to wait for a container the engine still
        counts as running to stop (its PID 1 just died).
        """
        try:
            state = self.api.inspect_container(container_id)["State"]
            if wait_seconds > 0 and state.get("Running"):
                with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException):
                    self.api.wait(container_id, timeout=wait_seconds)
                state = self.api.inspect_container(container_id)["State"]
            if state.get("Running") or state.get("Status") not in ("exited", "dead"):
                return ""
            output = self.api.logs(container_id, stdout=True, stderr=True, tail=EXIT_REPORT_LINES)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return ""
        report = f"exit status {state.get('ExitCode')}"
        if state.get("OOMKilled"):
            report += ", out of memory (the sandbox's memory limit)"
        text = output.decode("utf-8", errors="replace").strip()
        if text:
            report += f"; its last output: {text[-EXIT_REPORT_CHARS:]}"
        return report

    def list_ours(self, instance: str | None = None) -> list[dict[str, Any]]:
        filters = {"label": [f"{LABEL_MANAGED}=1"]}
        if instance:
            filters["label"].append(f"{LABEL_INSTANCE}={instance}")
        return self.api.containers(all=True, filters=filters)

    def memory_peak(self, container_id: str) -> tuple[int, int, bool] | None:
        """The most memory the container's cgroup has held, its memory limit, and whether the first is its peak.

        cgroup v1 keeps the peak (memory.max_usage_in_bytes, the stats' `max_usage`), page cache included.
        Docker's stats on cgroup v2 have no peak: there it is what the cgroup holds now (memory.current), less
        than the peak by what was freed. None: the engine says neither.
        """
        try:
            stats = self.api.stats(container_id, stream=False, one_shot=True)
        except docker.errors.InvalidVersion:  # one_shot needs API 1.41 (Docker 20.10); without, a 1 s sample
            stats = self.api.stats(container_id, stream=False)
        memory = stats.get("memory_stats") or {}
        limit = int(memory.get("limit") or 0)
        if memory.get("max_usage"):
            return int(memory["max_usage"]), limit, True
        if memory.get("usage"):
            return int(memory["usage"]), limit, False
        return None

    def memory_usage(self, container_id: str) -> int:
        stats = self.api.stats(container_id, stream=False)
        memory = stats.get("memory_stats", {})
        # cgroup v1 counts page cache in usage; subtract it as `docker stats` does.
        stats = memory.get("stats", {})
        # As `docker stats` counts it: cgroup v1 says total_inactive_file, v2 inactive_file.
        cache = stats.get("total_inactive_file", stats.get("inactive_file", stats.get("cache", 0)))
        return int(memory.get("usage", 0)) - int(cache)
