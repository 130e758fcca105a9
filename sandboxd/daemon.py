"""The daemon: wires config, Docker, pools, scheduler and the gRPC server together."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import socket
import stat
import time
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sandboxd_client import reward_model_health_service
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from sandboxd import api, auth, metrics, rewardpool
from sandboxd.backend import DockerBackend
from sandboxd.config import Config, ServerConfig, socket_gid, socket_mode, split_address, tcp_unguarded
from sandboxd.errors import ConfigError, NotReady
from sandboxd.images import LABEL_NAME, image_tag, missing_image_message
from sandboxd.pool import MATH_POOL, Pool, reap_orphans, stage_agent_code
from sandboxd.sandbox import Sandbox
from sandboxd.scheduler import Scheduler
from sandboxd.sessions import SessionManager

log = logging.getLogger("sandboxd")
ORPHAN_SWEEP_SECONDS = 60.0
# How often the engine is asked which of our containers run: a sandbox that died
# idle (an engine restart, `docker rm -f`, a pause) is replaced within this, and
# health says NOT_SERVING within it of the engine going away.
ENGINE_WATCH_SECONDS = 1.0
# The health service that says the process runs and answers: SERVING from before the listeners start until
# the drain. Kubernetes' liveness probe asks it; service "" (SERVING once the pools are warm, NOT_SERVING while
# the engine is away) is for readiness, and restarting the daemon while the engine is away gains nothing.
LIVENESS_SERVICE = "sandboxd.v1.Daemon"


def check_socket_path(path: str) -> None:
    """Refuse a path that is a regular file or a live socket; remove a stale socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"server.socket {path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # stale: nothing listens
        return
    finally:
        probe.close()
    raise ConfigError(f"server.socket {path} is in use by another process (is sandboxd already running?)")


def set_socket_access(path: str, mode: str, group: str) -> None:
    """Give the gRPC socket server.socket_mode and server.socket_group (config checked both)."""
    gid, bits = socket_gid(group), socket_mode(mode)
    if gid is None or bits is None:
        raise ConfigError(f"server.socket_group {group!r} or server.socket_mode {mode!r} is not valid")
    try:
        if gid != -1:
            os.chown(path, -1, gid)
        os.chmod(path, bits)
    except OSError as exc:
        raise ConfigError(f"server.socket {path}: cannot set group {group or '(own)'} and mode {mode}: "
                          f"{exc.strerror}") from None


def _read_pem(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ConfigError(f"server.{key} {path}: {exc.strerror}") from None


def server_credentials(server: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of the TCP listener (None: plaintext); with tls_client_ca, clients need its certificate."""
    if not server.tls_cert:
        return None
    cert, key = _read_pem("tls_cert", server.tls_cert), _read_pem("tls_key", server.tls_key)
    client_ca = _read_pem("tls_client_ca", server.tls_client_ca) if server.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def insecure_tcp_warning(server: ServerConfig) -> str:
    """What server.insecure_tcp lets through, said at every start ("" when it lets nothing through)."""
    if not (server.insecure_tcp and tcp_unguarded(server)):
        return ""
    missing = [what for what, present in (("TLS", server.tls_cert), ("tokens", server.tokens_file)) if not present]
    return (f"server.insecure_tcp: {server.tcp} serves without {' and '.join(missing)}: anyone who reaches it "
            f"{'may run code and control the pools' if not server.tokens_file else 'may read the tokens'}")


def node_id(socket_path: str, tcp: str = "") -> str:
    """The io.sandboxd.node label of the sandboxes a daemon listening there starts."""
    return hashlib.sha256(f"{socket_path}|{tcp}".encode()).hexdigest()[:12]


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.instance = uuid.uuid4().hex[:8]
        self.node = node_id(config.server.socket, config.server.tcp)
        self.node_name = config.server.node_name or socket.gethostname()
        # Before the engine is asked anything: a tokens file open to others, or a certificate that
        # cannot be read, stops the start with one line.
        self.tokens = auth.load_tokens(config.server.tokens_file) if config.server.tokens_file else []
        self.tls = server_credentials(config.server) if config.server.tcp else None
        self.backend = DockerBackend(config.docker.url, config.docker.timeout_seconds)
        self.pools: dict[str, Pool] = {}
        self.scheduler = Scheduler(self.pools, config)
        self.sessions = SessionManager(None, config)
        self.health = health.aio.HealthServicer()
        self.serving = False
        self.stopping = False
        # Why the Docker engine cannot be used now ("" while it answers): no sandbox can start or be removed.
        self.engine_problem = ""
        self._background: set[asyncio.Future[None]] = set()
        # What each reward model's health service last said (_set_models_serving).
        self._models_serving: dict[str, bool] = {}

    def check_ready(self) -> None:
        if self.engine_problem:
            raise NotReady(f"the Docker engine does not answer ({self.engine_problem}); retry once it is back")
        if not self.serving:
            # At start-up, or while the pools refill after the engine came back, or when none can start sandboxes.
            failing = "".join(f"; {pool.failing_reason}" for pool in self.pools.values() if pool.failing)
            if self.pools and all(pool.failing for pool in self.pools.values()):
                raise NotReady(f"no pool can start sandboxes{failing}")
            raise NotReady(f"sandboxd is starting: no warm sandbox yet{failing}")

    def _set_serving(self, serving: bool) -> None:
        if serving == self.serving:
            return
        self.serving = serving
        for service in ("", "sandboxd.v1.Jobs"):
            self._publish_health(service, serving)
        self._set_models_serving()

    def _publish_health(self, service: str, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        task = asyncio.ensure_future(self.health.set(service, status))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _set_models_serving(self) -> None:
        """Each reward model's own health (reward_model_health_service): SERVING while the daemon serves and the
        model is loaded in a warm sandbox. The daemon serves before a model has loaded; a client that balances
        reward-model jobs over daemons checks this one, so that none waits for a model still loading on one of
        them, or is answered by one whose model failed to load."""
        for pool in self.pools.values():
            if isinstance(pool, rewardpool.RewardModelPool):
                loaded = pool.model_state.get("state") != "failed"
                up = self.serving and loaded and not pool.failing and len(pool.ready) >= pool.min_ready
                if self._models_serving.get(pool.model_name) != up:
                    self._models_serving[pool.model_name] = up
                    self._publish_health(reward_model_health_service(pool.model_name), up)

    def pool_status(self) -> pb.PoolStatus:
        status = pb.PoolStatus(queue_depth=self.scheduler.queued, in_flight=self.scheduler.in_flight,
                               jobs_total=self.scheduler.jobs_total,
                               jobs_per_second=self.scheduler.jobs_per_second())
        for pool in self.pools.values():
            status.pools.add(name=pool.name, image=pool.image, target=pool.target, ready=len(pool.ready),
                             busy=pool.busy_count(), starting=pool.starting, snapshot=pool.snapshots.state,
                             jobs_total=pool.jobs_total, recycled_total=pool.recycled_total,
                             start_method=pool.start_method,
                             restore_seconds=pool.start_chooser.median("restore"),
                             cold_seconds=pool.start_chooser.median("cold"),
                             start_failures=pool.start_failures, start_error=pool.start_error,
                             failing=pool.failing)
        return status

    def _on_pool_change(self) -> None:
        for pool in self.pools.values():
            metrics.SANDBOXES.labels(pool.name, "ready").set(len(pool.ready))
            metrics.SANDBOXES.labels(pool.name, "busy").set(pool.busy_count())
            metrics.SANDBOXES.labels(pool.name, "starting").set(pool.starting)
            metrics.SNAPSHOT_READY.labels(pool.name).set(1 if pool.snapshots.usable else 0)
            metrics.POOL_RESTORING.labels(pool.name).set(1 if pool.start_method == "restore" else 0)
            metrics.POOL_FAILING.labels(pool.name).set(1 if pool.failing else 0)
        # SERVING once every pool has a warm sandbox, until shutdown or until the
        # engine goes away (_watch_engine): a pool that is refilling after losses
        # still queues jobs, and clients that health check would otherwise fail
        # fast on a daemon that is merely busy. A pool that cannot start
        # sandboxes (Pool.failing) answers its own jobs and holds back no other
        # pool's; with every pool failing the daemon serves nothing. A reward
        # model still loading holds back no job pool (Pool.gates_health).
        working = [pool for pool in self.pools.values() if not pool.failing]
        gating = [pool for pool in working if pool.gates_health] or working
        warm = bool(gating) and all(len(pool.ready) >= pool.min_ready for pool in gating)
        if not self.serving and not self.stopping and not self.engine_problem and warm:
            self._set_serving(True)
        elif self.serving and self.pools and not working:
            # Every pool stopped being able to start sandboxes and none has one left (Pool.failing): SERVING would
            # send round-robin clients batches whose every job is answered SANDBOX_LOST.
            self._set_serving(False)
        self._set_models_serving()

    def _server(self, interceptors: list[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
        """A gRPC server with every service; one per listener, so that only TCP asks for tokens."""
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 256 << 20),
                                          ("grpc.max_send_message_length", 256 << 20)],
                                 interceptors=[*interceptors, api.DecodeErrors()])
        pb_grpc.add_JobsServicer_to_server(api.JobsServicer(self), server)
        pb_grpc.add_PoolServicer_to_server(api.PoolServicer(self), server)
        pb_grpc.add_DaemonServicer_to_server(api.DaemonServicer(self), server)
        pb_grpc.add_SessionsServicer_to_server(api.SessionsServicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        services = [pb.DESCRIPTOR.services_by_name[name].full_name for name in ("Jobs", "Sessions", "Pool", "Daemon")]
        reflection.enable_server_reflection([*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        return server

    def _bind_unix(self, server: grpc.aio.Server) -> str:
        check_socket_path(self.config.server.socket)
        address = f"unix:{self.config.server.socket}"
        # gRPC creates the socket here, under the umask: created owner-only, it is never
        # open to more users than server.socket_mode lets in, even for the moment until chmod.
        umask = os.umask(0o177)
        try:
            server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {address}: {exc}") from None
        finally:
            os.umask(umask)
        set_socket_access(self.config.server.socket, self.config.server.socket_mode, self.config.server.socket_group)
        return address

    def _health_server(self) -> grpc.aio.Server:
        """The server.health listener: grpc.health.v1 alone, plaintext, no token (kubelet's probes have neither)."""
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        return server

    def _bind_tcp(self, server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> str:
        # Probe the port ourselves: gRPC's own failure is a C-core log line
        # before ours, and the error must be one line.
        try:
            host, port = split_address(address)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                # As gRPC binds: a restart must not trip over its predecessor's TIME_WAIT sockets.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot listen on {address}: {exc}") from None
        # ":port" means all interfaces (config.split_address), which gRPC refuses as "host must not be empty".
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            port = server.add_insecure_port(bind) if credentials is None else server.add_secure_port(bind, credentials)
        except RuntimeError:
            port = 0
        if not port:
            raise ConfigError(f"cannot listen on {address}: address in use or invalid")
        return address + (" (TLS)" if credentials is not None else "")

    async def run(self) -> None:
        config = self.config
        servers: list[grpc.aio.Server] = []
        addresses = []
        if config.server.socket:
            servers.append(self._server([]))
            addresses.append(self._bind_unix(servers[-1]))
        if config.server.tcp:
            interceptors: list[grpc.aio.ServerInterceptor] = []
            if self.tokens:
                interceptors.append(auth.BearerTokens(self.tokens))
                log.info("TCP calls need a bearer token: %s",
                         ", ".join(f"{token.name} ({token.role})" for token in self.tokens))
            if warning := insecure_tcp_warning(config.server):
                log.warning("%s", warning)
            servers.append(self._server(interceptors))
            addresses.append(self._bind_tcp(servers[-1], config.server.tcp, self.tls))
        if config.server.health:
            servers.append(self._health_server())
            addresses.append(self._bind_tcp(servers[-1], config.server.health, None) + " (health only)")
        for service in ("", "sandboxd.v1.Jobs"):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if config.server.metrics:
            try:
                metrics.serve(config.server.metrics)
            except OSError as exc:
                raise ConfigError(f"cannot serve metrics on {config.server.metrics}: {exc}") from None
        removed = await asyncio.to_thread(reap_orphans, self.backend, self.node, self.instance)
        if removed:
            log.info("removed %d sandboxes left by a previous daemon", removed)
        code_dir, code_key = await asyncio.to_thread(stage_agent_code, config.sandbox.state_dir)
        os.makedirs(config.sandbox.run_dir, mode=0o700, exist_ok=True)
        # Reward models first: a model the engine cannot serve (a GPU pool without a GPU
        # runtime) stops the start-up here, with one line.
        reward_image = image_tag(rewardpool.IMAGE)
        devices = await asyncio.to_thread(rewardpool.check_models, config, self.backend, reward_image)
        for name, device in devices.items():
            self.pools[rewardpool.pool_name(name)] = rewardpool.RewardModelPool(
                name, config.models[name], device, reward_image, self.backend, config, instance=self.instance,
                node=self.node, code_dir=code_dir, code_key=code_key, on_change=self._on_pool_change)
            await self.health.set(reward_model_health_service(name), health_pb2.HealthCheckResponse.NOT_SERVING)
            self._models_serving[name] = False
        def pool(name: str, image: str, kind: str = "jobs") -> Pool:
            return Pool(name, image, self.backend, config, instance=self.instance, node=self.node,
                        code_dir=code_dir, code_key=code_key, on_change=self._on_pool_change, kind=kind)

        for name in config.pool.images:
            image = image_tag(name)
            if not await asyncio.to_thread(self.backend.image_exists, image):
                if name == "python":
                    others = await asyncio.to_thread(self.backend.images_labelled, LABEL_NAME, name)
                    raise ConfigError(missing_image_message(name, image, others))
                log.warning("image %s is missing: languages other than python and bash are unavailable", image)
                continue
            self.pools[name] = pool(name, image)
        if config.pool.math and "python" in self.pools:
            self.pools[MATH_POOL] = pool(MATH_POOL, self.pools["python"].image)
        if config.sessions.enabled and "python" in self.pools:
            # Held sessions get sandboxes of their own, so they never take job capacity.
            self.pools["sessions"] = self.sessions.pool = pool("sessions", self.pools["python"].image, "sessions")
        for server in servers:
            await server.start()
        for started in self.pools.values():
            started.start()
        self.sessions.start()
        watcher = asyncio.ensure_future(self._watch_engine())
        log.info("sandboxd %s listening on %s", self.instance, ", ".join(addresses))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down: draining for up to %.0f s", config.server.grace_seconds)
        self.stopping = True
        self.serving = False
        await self.health.enter_graceful_shutdown()
        await asyncio.gather(*(server.stop(config.server.grace_seconds) for server in servers))
        await self.scheduler.close()
        watcher.cancel()
        await self.sessions.close_all()
        await asyncio.gather(*(pool.close() for pool in self.pools.values()))
        # A start cut short by the shutdown (its create still in the engine when its task was
        # cancelled) or a removal that failed while the engine was away leaves containers no
        # pool knows: they would outlive the daemon until the next one on this node reaps them.
        # The engine calls of cancelled tasks run on in their threads: wait for them first.
        await asyncio.get_running_loop().shutdown_default_executor()
        try:
            for container in self.backend.list_ours(self.instance):
                self.backend.remove(container["Id"])
        except Exception as exc:
            log.warning("could not remove every sandbox at shutdown (the next start reaps them): %s", exc)
        with contextlib.suppress(FileNotFoundError):
            if config.server.socket:
                os.unlink(config.server.socket)
        log.info("stopped")

    async def _watch_engine(self) -> None:
        """Follow the engine: NOT_SERVING while it does not answer, dead or frozen sandboxes lost at once,
        and every ORPHAN_SWEEP_SECONDS our containers that no pool knows removed (from the same list)."""
        next_sweep = time.monotonic() + ORPHAN_SWEEP_SECONDS
        down_since = 0.0
        # One list in flight at a time: one the engine holds is waited on again, not asked anew.
        listing: asyncio.Future[list[dict[str, Any]]] | None = None
        asked_at = 0.0
        watched: dict[str, list[Sandbox]] = {}
        try:
            while True:
                await asyncio.sleep(ENGINE_WATCH_SECONDS)
                if listing is None:
                    # Before the list: a sandbox that becomes ready meanwhile is not in it, and is not dead.
                    watched = {name: list(pool.sandboxes) for name, pool in self.pools.items()}
                    listing = asyncio.ensure_future(asyncio.to_thread(self.backend.list_ours, self.instance))
                    asked_at = time.monotonic()
                # A frozen dockerd (SIGSTOP, a wedged containerd) held the list for docker.timeout_seconds
                # (60 s) with health SERVING, and the outage clock started only then. A list unanswered for
                # the outage limit is the outage; a slow one before that (a badly loaded node lists in tens
                # of seconds) turns no job away.
                outage = self.config.scheduler.engine_outage_seconds
                await asyncio.wait([listing], timeout=max(0.0, asked_at + outage - time.monotonic()))
                try:
                    if not listing.done():
                        raise TimeoutError(f"no answer in {outage:g} s")
                    containers = listing.result()
                except Exception as exc:
                    if listing.done():
                        listing = None
                    if not self.engine_problem:
                        log.warning("the Docker engine does not answer: %s; not serving until it does", exc)
                    self.engine_problem = f"{type(exc).__name__}: {exc}"[:300]
                    self._set_serving(False)
                    # The outage began when the engine was asked, not when it failed to answer.
                    down_since = down_since or asked_at
                    if time.monotonic() - down_since >= outage:
                        await self._fail_waiters()
                    continue
                listing = None
                if self.engine_problem:
                    log.info("the Docker engine answers again")
                    self.engine_problem = ""
                down_since = 0.0
                running = {container["Id"] for container in containers if container.get("State") == "running"}
                for name, pool in self.pools.items():
                    pool.check_alive(running, watched[name])
                self._on_pool_change()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + ORPHAN_SWEEP_SECONDS
                    await self._sweep_orphans(containers)
        finally:
            if listing is not None:
                listing.cancel()  # its thread ends with docker.timeout_seconds

    async def _fail_waiters(self) -> None:
        """Answer the jobs waiting for a sandbox that no engine can start (scheduler.engine_outage_seconds)."""
        reason = (f"the Docker engine has not answered for {self.config.scheduler.engine_outage_seconds:g} s "
                  f"({self.engine_problem})")
        for pool in self.pools.values():
            if failed := await pool.fail_waiters(reason):
                log.warning("pool %s: %d jobs waiting for a sandbox answered SANDBOX_LOST: %s", pool.name, failed,
                            reason)

    async def _sweep_orphans(self, containers: list[dict[str, Any]]) -> None:
        """Remove those of `containers` (ours) that no pool knows (a crash between create and ready), and the
        sandboxes of another daemon of this host that died and was not started again."""
        known = {s.container_id for pool in self.pools.values() for s in pool.sandboxes}
        try:
            for container in containers:
                too_young = time.time() - container.get("Created", 0) < 300
                if container["Id"] not in known and not too_young and "template" not in container["Names"][0]:
                    await asyncio.to_thread(self.backend.remove, container["Id"])
            if removed := await asyncio.to_thread(reap_orphans, self.backend, self.node, self.instance,
                                                  by_node=False):
                log.info("removed %d sandboxes of a daemon of this host that is gone", removed)
        except Exception:
            log.exception("orphan sweep failed")
