"""Configuration: defaults, then a TOML file, then SANDBOXD_* variables, then flags.

No file is needed; every value has a default that works on a single rollout
node. Unknown keys and bad values are errors at start-up, each reported in
one line naming the key and where it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import grp
import ipaddress
import math
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.agent.protocol import UIDS_PER_SANDBOX
from sandboxd.errors import ConfigError
from sandboxd.verifiers.rewardmodel import DTYPES, NORMALIZATIONS

MIB = 1 << 20
GIB = 1 << 30
# run_dir + "/<8-char instance>-<counter>/agent.sock" must fit in sun_path
# (107 characters and a NUL): 72 leaves 14 digits for the counter.
MAX_RUN_DIR_CHARS = 72
# server.node_name: a host or Kubernetes node name (a DNS name's characters, 253 at most) or a pod's.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
# A sandbox has UIDS_PER_SANDBOX (500) job uids. A run takes one, its judge
# or math server another, and a finished run's uid waits for its sweep; a
# session holds one for its life, beside a few resident servers.
MAX_JOBS_PER_SANDBOX = UIDS_PER_SANDBOX // 5
MAX_SESSIONS_PER_SANDBOX = UIDS_PER_SANDBOX - 100
# Entries each of a sandbox's tmpfs mounts (/tmp, which holds the work dirs,
# and /dev/shm) may hold: files, folders, symlinks and hard links, which
# tmpfs counts one by one although they take no space. The size caps bytes
# only, and without this a job can make 2.5 million hard links of one file,
# whose removal takes seconds. 65,536 take about 0.5 s to remove (off the
# agent's event loop) and 60 MiB of kernel memory as files (8 MiB as links),
# charged to the sandbox; a Go build with a cold cache of a dozen standard
# packages makes about 270 entries, rustc, javac and g++ a few.
DEFAULT_TMPFS_INODES = 65_536
MIN_TMPFS_INODES = 1024


def host_cpus() -> int:
    """CPUs this process may run on: its affinity mask, which a cpuset narrows and os.cpu_count() ignores."""
    return len(os.sched_getaffinity(0)) or 1


def _one_of(values: tuple[str, ...]) -> str:
    return f"{', '.join(values[:-1])} or {values[-1]}"


@dataclass
class ServerConfig:
    socket: str = "/run/sandboxd/sandboxd.sock"
    # Connecting to a Unix socket needs write permission on it. Created under
    # the process umask, it is 0755 under systemd's UMask=0022 and root's
    # alone: a trainer running as another user gets EACCES. Octal, as chmod
    # takes it; the group is a name or a gid ("": the daemon's own group).
    socket_mode: str = "0660"
    socket_group: str = ""
    # "" disables TCP; "127.0.0.1:50051" or "[::]:50051" enables it.
    tcp: str = ""
    # The daemon's name in its answers (JobResult.node, Info.node), by which a client that balances
    # over several daemons tells which one answered; "" takes the host's name. Daemons sharing a
    # host (or a Kubernetes node, whose name the downward API gives) need names of their own.
    node_name: str = ""
    # TLS on the TCP listener: PEM files of the server's certificate chain and key. With
    # tls_client_ca, clients must present a certificate that CA signed (mutual TLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # Bearer tokens the TCP listener requires: one `name role token` a line, mode 0600
    # (sandboxd.auth). The Unix socket takes none; its file mode is its door.
    tokens_file: str = ""
    # A TCP address other than loopback without TLS and tokens lets anyone who reaches the
    # port run code and change the pools: refused unless this says it is meant.
    insecure_tcp: bool = False
    # "" disables the Prometheus endpoint.
    metrics: str = "127.0.0.1:9464"
    # host:port of a plaintext listener that serves grpc.health.v1 and nothing else, for probes that cannot
    # speak TLS or send tokens (Kubernetes' grpc probes); "" for none. Service "" (and sandboxd.v1.Jobs) is
    # SERVING once the pools are warm, sandboxd.v1.Daemon while the process runs (daemon.LIVENESS_SERVICE).
    health: str = ""
    # How long in-flight RPCs may run on after SIGTERM before they are cancelled.
    # A RunBatch of a training step takes seconds to a minute; 10 s would cut
    # them off and the client would send them again to another daemon. systemd's
    # TimeoutStopSec (180 s) leaves 120 s more for the Docker calls in flight
    # (docker.timeout_seconds, 60 s) and the removal of the sandboxes.
    grace_seconds: float = 60.0
    log_format: str = "json"  # json | text
    log_level: str = "info"


@dataclass
class DockerConfig:
    url: str = "unix:///var/run/docker.sock"
    timeout_seconds: float = 60.0
    # The engine's TMPDIR: containerd leaves a copy of every restored
    # checkpoint there, which sandboxd removes (see snapshots.restoring).
    temp_dir: str = "/tmp"


@dataclass
class PoolConfig:
    # Sandboxes kept warm per pool (python, langs, math) even with no batch hint.
    min_size: int = 2
    # 0: twice the host's CPUs. More sandboxes than that only interleave on
    # the same cores (docs/performance.md, "Pool size": a sweep on this 2-CPU host).
    max_size: int = 0
    # Jobs one sandbox runs at once; each runs under its own uid.
    jobs_per_sandbox: int = 2
    # Recycle a sandbox after this many jobs, however healthy it looks.
    recycle_after_jobs: int = 1000
    # Shrink back towards min_size after this long without work.
    idle_seconds: float = 300.0
    scale_to_zero: bool = False
    snapshots: bool = True
    # Run `criu check` here before taking snapshots. A daemon in a container (deploy/kubernetes/) sees
    # neither the host's criu nor the rights it needs, while the engine runs CRIU on the host: false lets
    # the first checkpoint tell, and one that fails falls back to cold starts (snapshot_retry_seconds).
    criu_check: bool = True
    # A failed snapshot (a checkpoint that failed, restores that kept failing)
    # is built again after this long, doubled with each failure in a row up
    # to 6 hours; its pool starts cold meanwhile.
    snapshot_retry_seconds: float = 300.0
    # "auto": restore from the snapshot while restores get sandboxes ready
    # sooner than cold starts do, measured per pool (on Docker 20.10 they often
    # do not); "always": restore whenever the snapshot is ready.
    restore: str = "auto"
    # Sandboxes started at once while filling the pool (Docker serialises
    # much of the work; more only adds contention on 2 cores).
    start_concurrency: int = 2
    images: list[str] = field(default_factory=lambda: ["python", "langs"])
    # Math jobs run in a pool of their own (python image, warm math servers):
    # an idle math sandbox holds about 80 MB, an idle code sandbox 25 MB.
    # false: math jobs are refused as unsupported.
    math: bool = True

    @property
    def size_limit(self) -> int:
        """max_size, with 0 resolved for this host (never below min_size); each job pool has its own."""
        return max(self.max_size or 2 * host_cpus(), self.min_size, 1)


@dataclass
class SandboxConfig:
    memory_bytes: int = 2 * GIB
    cpus: float = 1.0
    pids: int = 1024
    tmpfs_bytes: int = 512 * MIB
    # Entries (files, folders, links) /tmp and /dev/shm may each hold; shared by
    # a sandbox's concurrent runs and sessions, as tmpfs_bytes is.
    tmpfs_inodes: int = DEFAULT_TMPFS_INODES
    state_dir: str = "/var/lib/sandboxd"
    run_dir: str = "/run/sandboxd/sandboxes"
    # IP sockets (AF_INET, AF_INET6) on the sandbox's loopback, its only
    # network. Off: socket() refuses them, because every run of a sandbox
    # shares that loopback, and a run serving on 127.0.0.1 can be reached by
    # the runs and sessions beside it. On, for tasks that run a server and
    # test it: then use pool.jobs_per_sandbox = 1 and no sessions.
    loopback: bool = False


@dataclass
class LimitsConfig:
    default_timeout_seconds: float = 10.0
    max_timeout_seconds: float = 120.0
    default_memory_bytes: int = 512 * MIB
    max_memory_bytes: int = 2 * GIB
    default_output_bytes: int = 1 * MIB
    max_output_bytes: int = 16 * MIB
    compile_timeout_seconds: float = 30.0
    # All of a code job's test runs together: without it a completion that
    # runs each of 100 stdin/stdout cases just under the 10 s timeout holds
    # its sandbox slot, and the trainer's step, for 1,000 s.
    default_total_timeout_seconds: float = 300.0
    max_total_timeout_seconds: float = 3600.0


@dataclass
class SchedulerConfig:
    # Jobs admitted but not yet on a sandbox; past it: RESOURCE_EXHAUSTED.
    max_queued: int = 8192
    # Bytes of requests admitted and not yet answered in full (jobs' code and tests, held until their results
    # are sent); past it: RESOURCE_EXHAUSTED. A request larger than this alone: INVALID_ARGUMENT.
    max_held_bytes: int = 1 << 30
    # Attempts on distinct sandboxes when a sandbox dies under a job.
    attempts: int = 3
    max_batch: int = 16384
    # Jobs waiting for a sandbox while the Docker engine does not answer (no sandbox can
    # start) get STATUS_SANDBOX_LOST after this long, rather than waiting for it without end.
    engine_outage_seconds: float = 30.0


@dataclass
class SessionsConfig:
    """Multi-turn sessions: a uid and a live interpreter each, many per sandbox."""

    enabled: bool = True
    # Sessions share the python image's sandboxes of a pool of their own, so
    # that held sessions never take capacity from scoring jobs.
    per_sandbox: int = 64
    min_sandboxes: int = 1
    max_sandboxes: int = 16
    # Warm slots kept beyond the trainer's session hint, as a fraction of it.
    headroom: float = 0.1
    idle_timeout_seconds: float = 600.0
    max_idle_timeout_seconds: float = 3600.0
    max_lifetime_seconds: float = 3600.0
    max_cells: int = 1000
    # How long Open waits for a slot while the pool grows before RESOURCE_EXHAUSTED.
    open_wait_seconds: float = 30.0


@dataclass
class ModelConfig:
    """One reward model (`[models.NAME]`): a local folder, scored in sandboxes of its own."""

    # Host folder with config.json, tokenizer files and model.safetensors (mounted read-only).
    path: str = ""
    # Tokens per (prompt, completion); the end of the completion is cut first.
    max_length: int = 2048
    # reward = raw (none), scale * raw + shift (affine), or sigmoid(scale * raw + shift).
    normalize: str = "none"
    scale: float = 1.0
    shift: float = 0.0
    # Which logit is the score, for models with more than one label.
    label: int = 0
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16
    # auto: a GPU when the engine has a GPU runtime, else the CPU; gpu: refuse to start without one.
    device: str = "auto"
    # GPUs, one way of three: `gpu_ids` (indexes or UUIDs; each sandbox gets one of them),
    # `cdi_devices` (CDI names such as "nvidia.com/gpu=0", likewise), or else `gpu_count`
    # GPUs per sandbox, which Docker takes from the first ones (-1: all).
    gpu_ids: list[str] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    gpu_count: int = 1
    sandboxes_per_gpu: int = 1
    # GPU memory each sandbox may take, as a fraction; 0 = 1 / sandboxes_per_gpu.
    memory_fraction: float = 0.0
    # Sandboxes when the model runs on the CPU.
    sandboxes: int = 1
    # 0 = the [sandbox] value. Threads: torch's CPU threads, 0 = one per CPU.
    cpus: float = 0.0
    memory_bytes: int = 0
    threads: int = 0
    # Dynamic batching: a batch leaves with max_batch pairs, or batch_wait_ms after its first.
    max_batch: int = 32
    batch_wait_ms: float = 5.0
    # Padded tokens per forward pass: a batch is sorted by length and cut into passes of at
    # most this many (pairs x the longest); 0 = 1,024 on the CPU, 8,192 on a GPU.
    max_batch_tokens: int = 0
    load_timeout_seconds: float = 600.0
    # Restore CPU sandboxes from a snapshot taken with the model loaded. Off by default:
    # a restore is slower than a cold start (the dump holds torch's whole heap; docs/reward-models.md).
    snapshot: bool = False

    def checks(self, name: str) -> list[tuple[bool, str]]:
        where = f"models.{name}"
        return [
            (os.path.isabs(self.path), f"{where}.path must be an absolute host path (got {self.path!r})"),
            (self.max_length >= 1, f"{where}.max_length must be >= 1"),
            (self.normalize in NORMALIZATIONS, f"{where}.normalize must be {_one_of(NORMALIZATIONS)}"),
            (self.dtype in DTYPES, f"{where}.dtype must be {_one_of(DTYPES)}"),
            (self.device in ("auto", "cpu", "gpu"), f"{where}.device must be auto, cpu or gpu"),
            (self.label >= 0, f"{where}.label must be >= 0"),
            (not (self.gpu_ids and self.cdi_devices), f"{where}: set gpu_ids or cdi_devices, not both"),
            (self.gpu_count >= 1 or self.gpu_count == -1, f"{where}.gpu_count must be >= 1, or -1 for all"),
            (self.sandboxes_per_gpu >= 1, f"{where}.sandboxes_per_gpu must be >= 1"),
            (0 <= self.memory_fraction <= 1, f"{where}.memory_fraction must be between 0 and 1"),
            (self.sandboxes >= 1, f"{where}.sandboxes must be >= 1"),
            (self.cpus >= 0 and self.memory_bytes >= 0 and self.threads >= 0,
             f"{where}: cpus, memory_bytes and threads must be >= 0"),
            (self.max_batch >= 1, f"{where}.max_batch must be >= 1"),
            (self.batch_wait_ms >= 0, f"{where}.batch_wait_ms must be >= 0"),
            (self.max_batch_tokens >= 0, f"{where}.max_batch_tokens must be >= 0"),
            (self.load_timeout_seconds > 0, f"{where}.load_timeout_seconds must be > 0"),
        ]


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    docker: DockerConfig = field(default_factory=DockerConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    # Reward models by name (`[models.NAME]` tables; SANDBOXD_MODELS_<NAME>_<KEY>).
    models: dict[str, ModelConfig] = field(default_factory=dict)

    def validate(self) -> None:
        checks = [
            (self.server.log_format in ("json", "text"), "server.log_format must be json or text"),
            (self.server.log_level in ("debug", "info", "warning", "error"),
             "server.log_level must be debug, info, warning or error"),
            (bool(self.server.socket) or bool(self.server.tcp), "server.socket and server.tcp are both empty"),
            (not self.server.node_name or NODE_NAME.fullmatch(self.server.node_name) is not None,
             "server.node_name must be 1-253 of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit"),
            (self.server.grace_seconds >= 0, "server.grace_seconds must be >= 0"),
            (socket_mode(self.server.socket_mode) is not None,
             "server.socket_mode must be an octal mode of owner, group and others' bits, e.g. 0660"),
            (socket_gid(self.server.socket_group) is not None,
             f"server.socket_group: no group {self.server.socket_group!r} on this host"),
            (bool(self.server.tls_cert) == bool(self.server.tls_key),
             "server.tls_cert and server.tls_key must be set together"),
            (not self.server.tls_client_ca or bool(self.server.tls_cert),
             "server.tls_client_ca (mutual TLS) needs server.tls_cert and server.tls_key"),
            (all(os.path.isabs(path) for path in (self.server.tls_cert, self.server.tls_key,
                                                  self.server.tls_client_ca, self.server.tokens_file) if path),
             "server.tls_cert, server.tls_key, server.tls_client_ca and server.tokens_file must be absolute paths"),
            (not (self.server.tls_cert or self.server.tokens_file) or bool(self.server.tcp),
             "server.tls_cert and server.tokens_file guard server.tcp, which is empty"),
            (self.server.insecure_tcp or not self.server.tcp or not _is_address(self.server.tcp, allow_empty=False)
             or is_loopback(self.server.tcp) or (bool(self.server.tls_cert) and bool(self.server.tokens_file)),
             f"server.tcp {self.server.tcp} is not a loopback address: set server.tls_cert, server.tls_key and "
             "server.tokens_file, or server.insecure_tcp = true to serve anyone who can reach it"),
            (self.pool.min_size >= 0, "pool.min_size must be >= 0"),
            (self.pool.max_size == 0 or self.pool.max_size >= max(1, self.pool.min_size),
             "pool.max_size must be 0 (twice the host's CPUs) or >= max(1, pool.min_size)"),
            (1 <= self.pool.jobs_per_sandbox <= MAX_JOBS_PER_SANDBOX,
             f"pool.jobs_per_sandbox must be in [1, {MAX_JOBS_PER_SANDBOX}] (each run takes uids of the sandbox's "
             f"{UIDS_PER_SANDBOX})"),
            (self.pool.recycle_after_jobs >= 1, "pool.recycle_after_jobs must be >= 1"),
            (self.pool.start_concurrency >= 1, "pool.start_concurrency must be >= 1"),
            (self.pool.restore in ("auto", "always"), "pool.restore must be auto or always"),
            (self.pool.snapshot_retry_seconds > 0, "pool.snapshot_retry_seconds must be > 0"),
            (set(self.pool.images) <= {"python", "langs"}, "pool.images may hold python and langs"),
            (self.sandbox.memory_bytes >= 64 * MIB, "sandbox.memory_bytes must be >= 64 MiB"),
            # Docker refuses a CPU quota outside [0.01, the host's CPUs]: every sandbox's start failed.
            (0.01 <= self.sandbox.cpus <= (os.cpu_count() or 1),
             f"sandbox.cpus must be between 0.01 and this host's {os.cpu_count() or 1} CPUs"),
            (self.sandbox.tmpfs_bytes >= MIB, "sandbox.tmpfs_bytes must be >= 1 MiB (0 would mean no limit)"),
            (self.docker.timeout_seconds >= 1, "docker.timeout_seconds must be >= 1 (docker-py takes whole seconds)"),
            (_is_address(self.server.metrics, allow_empty=True),
             "server.metrics must be host:port, [::]:port or :port (all interfaces), or empty"),
            (_is_address(self.server.tcp, allow_empty=True),
             "server.tcp must be host:port, [::]:port or :port (all interfaces), or empty"),
            (_is_address(self.server.health, allow_empty=True),
             "server.health must be host:port, [::]:port or :port (all interfaces), or empty"),
            # gRPC binds with SO_REUSEPORT: both listeners on one port would each get some of its connections.
            (not (self.server.health and self.server.tcp) or _port(self.server.health) != _port(self.server.tcp),
             "server.health and server.tcp must listen on different ports"),
            (self.sandbox.pids >= 16, "sandbox.pids must be >= 16"),
            (self.sandbox.tmpfs_inodes >= MIN_TMPFS_INODES,
             f"sandbox.tmpfs_inodes must be >= {MIN_TMPFS_INODES} (0 would mean no limit to tmpfs)"),
            (0 < self.limits.default_timeout_seconds <= self.limits.max_timeout_seconds,
             "limits: 0 < default_timeout_seconds <= max_timeout_seconds"),
            (0 < self.limits.default_memory_bytes <= self.limits.max_memory_bytes,
             "limits: 0 < default_memory_bytes <= max_memory_bytes"),
            (self.limits.max_memory_bytes <= self.sandbox.memory_bytes,
             "limits.max_memory_bytes must be <= sandbox.memory_bytes"),
            (0 < self.limits.default_output_bytes <= self.limits.max_output_bytes,
             "limits: 0 < default_output_bytes <= max_output_bytes"),
            (0 < self.limits.default_total_timeout_seconds <= self.limits.max_total_timeout_seconds,
             "limits: 0 < default_total_timeout_seconds <= max_total_timeout_seconds"),
            (self.limits.compile_timeout_seconds > 0, "limits.compile_timeout_seconds must be > 0"),
            (len(self.sandbox.run_dir) <= MAX_RUN_DIR_CHARS,
             f"sandbox.run_dir must be at most {MAX_RUN_DIR_CHARS} characters (agent sockets live under it, "
             "and Unix socket paths are limited to 108 bytes)"),
            (self.scheduler.attempts >= 1, "scheduler.attempts must be >= 1"),
            (self.scheduler.max_queued >= 1, "scheduler.max_queued must be >= 1"),
            (self.scheduler.max_held_bytes >= MIB, "scheduler.max_held_bytes must be >= 1 MiB"),
            # Below the engine's own answer time, every look counted as an outage: health flapped each second.
            (self.scheduler.engine_outage_seconds >= 1, "scheduler.engine_outage_seconds must be >= 1"),
            (self.scheduler.max_batch >= 1, "scheduler.max_batch must be >= 1"),
            (1 <= self.sessions.per_sandbox <= MAX_SESSIONS_PER_SANDBOX,
             f"sessions.per_sandbox must be in [1, {MAX_SESSIONS_PER_SANDBOX}] (each session holds one of the "
             f"sandbox's {UIDS_PER_SANDBOX} uids)"),
            (0 <= self.sessions.min_sandboxes <= self.sessions.max_sandboxes,
             "sessions: 0 <= min_sandboxes <= max_sandboxes"),
            (self.sessions.max_sandboxes >= 1, "sessions.max_sandboxes must be >= 1"),
            (self.sessions.headroom >= 0, "sessions.headroom must be >= 0"),
            (0 < self.sessions.idle_timeout_seconds <= self.sessions.max_idle_timeout_seconds,
             "sessions: 0 < idle_timeout_seconds <= max_idle_timeout_seconds"),
            (self.sessions.max_lifetime_seconds > 0, "sessions.max_lifetime_seconds must be > 0"),
            (self.sessions.max_cells >= 1, "sessions.max_cells must be >= 1"),
            (self.sessions.open_wait_seconds >= 0, "sessions.open_wait_seconds must be >= 0"),
            *(check for name, model in self.models.items() for check in model.checks(name)),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


def socket_mode(text: str) -> int | None:
    """The permission bits of an octal mode ("0660", "660", "0o660"); None when it is not one.

    Setuid, setgid and sticky bits mean nothing on a socket and are refused.
    """
    digits = text.strip().lower().removeprefix("0o")
    if not re.fullmatch(r"0?[0-7]{3}", digits):
        return None
    return int(digits, 8)


def socket_gid(group: str) -> int | None:
    """The gid of a group name or number (-1: "" keeps the daemon's own); None when the host has no such group."""
    if not group:
        return -1
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port", "[::]:port" or ":port" (all interfaces); ValueError when malformed.

    A bare port is malformed: it read as all interfaces, where a port alone usually means this host.
    """
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port, [::]:port or :port, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(address: str) -> bool:
    """Whether host:port `address` listens on loopback only (127.0.0.0/8, ::1, localhost); names are not resolved."""
    host, _ = split_address(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tcp_unguarded(server: ServerConfig) -> bool:
    """Whether server.tcp serves without TLS or without tokens (what server.insecure_tcp allows off loopback)."""
    return bool(server.tcp) and not (server.tls_cert and server.tokens_file)


def _port(address: str) -> int | None:
    """The port of host:port `address`; None when it is malformed (another check says so)."""
    try:
        return split_address(address)[1]
    except ValueError:
        return None


def _is_address(address: str, *, allow_empty: bool) -> bool:
    if not address:
        return allow_empty
    try:
        split_address(address)
    except ValueError:
        return False
    return True


SECTIONS = [f.name for f in dataclasses.fields(Config)]
# Model names become pool and container names: keep them short and plain.
MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


def _coerce(value: Any, target: Any, where: str) -> Any:
    """Convert a TOML or environment value to the field's declared type."""
    kind = target
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = kind(value)
        except (TypeError, ValueError, OverflowError):  # int(inf) overflows
            raise ConfigError(f"{where}: expected {'an integer' if kind is int else 'a number'}, "
                              f"got {value!r}") from None
        # No setting means anything by inf or nan: each let a value through that broke later
        # (int(inf) in a container's CPU quota, ceil(nan) in the session pool's target).
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        if kind is int and isinstance(value, float) and value != int(value):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return number
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if getattr(kind, "__origin__", None) is list:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type")


def _apply_model(config: Config, key: str, value: Any, where: str) -> None:
    """`[models.NAME]` from a file (`key` is NAME, `value` its table) or SANDBOXD_MODELS_<NAME>_<FIELD>."""
    fields = typing.get_type_hints(ModelConfig)
    if isinstance(value, dict):
        items = list(value.items())
        name = key
    else:
        field_name = max((f for f in fields if key.endswith("_" + f)), key=len, default="")
        if not field_name:
            raise ConfigError(f"{where}: expected models.<name>.<key>, one of: {', '.join(fields)}")
        name, items = key[: -len(field_name) - 1], [(field_name, value)]
    if not MODEL_NAME.fullmatch(name):
        raise ConfigError(f"{where}: model name {name!r} must be 1-40 of a-z, 0-9, '_' and '-', starting "
                          "with a letter or digit")
    model = config.models.setdefault(name, ModelConfig())
    for field_name, field_value in items:
        if field_name not in fields:
            raise ConfigError(f"{where}: unknown key models.{name}.{field_name} (known: {', '.join(fields)})")
        setattr(model, field_name, _coerce(field_value, fields[field_name], where))


def _apply(config: Config, section: str, key: str, value: Any, where: str) -> None:
    if section == "models":
        _apply_model(config, key, value, where)
        return
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
    part = getattr(config, section)
    fields = typing.get_type_hints(type(part))
    if key not in fields:
        raise ConfigError(f"{where}: unknown key {section}.{key} (known: {', '.join(fields)})")
    setattr(part, key, _coerce(value, fields[key], where))


def load(path: str | os.PathLike[str] | None = None, *, environ: dict[str, str] | None = None,
         overrides: dict[str, Any] | None = None) -> Config:
    """Build the effective configuration; raises ConfigError on anything invalid.

    `overrides` maps "section.key" to a value (from command-line flags).
    Environment variables are SANDBOXD_<SECTION>_<KEY>, e.g.
    SANDBOXD_POOL_MIN_SIZE=4; SANDBOXD_CONFIG names the file.
    """
    environ = dict(os.environ if environ is None else environ)
    config = Config()
    path = path or environ.get("SANDBOXD_CONFIG") or None
    if path:
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        for section, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{file}: {section!r} must be a [section]")
            for key, value in values.items():
                _apply(config, section, key, value, f"{file}: {section}.{key}")
    for name, value in sorted(environ.items()):
        if not name.startswith("SANDBOXD_") or name in ("SANDBOXD_CONFIG", "SANDBOXD_ADDRESS"):
            continue
        rest = name[len("SANDBOXD_"):].lower()
        env_section = next((s for s in SECTIONS if rest.startswith(s + "_")), None)
        if env_section is None:
            # Other tools share the prefix (setup and image settings); only section names are ours. A near miss
            # of one (SANDBOXD_MODEL_RM_PATH, SANDBOXD_SESSION_ENABLED) must not be ignored without a word.
            near = difflib.get_close_matches(rest.split("_", 1)[0], SECTIONS, n=1, cutoff=0.8)
            if near:
                raise ConfigError(f"environment {name}: no section {rest.split('_', 1)[0]!r}; did you mean "
                                  f"SANDBOXD_{near[0].upper()}_...?")
            continue
        _apply(config, env_section, rest[len(env_section) + 1:], value, f"environment {name}")
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        _apply(config, section, key, value, f"flag --{key.replace('_', '-')}")
    config.validate()
    return config
