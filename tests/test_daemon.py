"""The daemon's own logic, without an engine: the periodic orphan sweep."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from sandboxd.daemon import Daemon
from sandboxd.pool import Pool
from sandboxd.sandbox import Sandbox
from tests.test_pool import one_slot_pool


def test_the_orphan_sweep_removes_only_old_containers_no_pool_knows() -> None:
    """Ours (the engine watch lists only the instance's containers), but in no pool: a crash between create and
    ready left it. Young ones may still be starting, and a snapshot template is the snapshot store's."""
    pool, sandbox = one_slot_pool()
    removed: list[str] = []
    daemon = object.__new__(Daemon)  # no engine: only what the sweep reads
    daemon.pools = {"python": pool}
    daemon.node, daemon.instance = "n", "i"
    daemon.backend = types.SimpleNamespace(remove=removed.append, list_ours=list)  # type: ignore[assignment]
    hour_ago, now = time.time() - 3600, time.time()
    containers = [
        {"Id": sandbox.container_id, "Created": hour_ago, "Names": ["/sandboxd-i-python-1"]},
        {"Id": "orphan", "Created": hour_ago, "Names": ["/sandboxd-i-python-2"]},
        {"Id": "starting", "Created": now - 10, "Names": ["/sandboxd-i-python-3"]},
        {"Id": "snapshot", "Created": hour_ago, "Names": ["/sandboxd-i-python-template"]},
    ]
    asyncio.run(daemon._sweep_orphans(containers))
    assert removed == ["orphan"]


def test_the_orphan_sweep_removes_the_sandboxes_of_a_dead_daemon_of_this_host(caplog: pytest.LogCaptureFixture) -> None:
    """Another daemon of this host that died and was not started again: its sandboxes held their memory until the
    next start of a daemon. A live one's, and a previous daemon's on this node (only start-up reaps those), stay."""
    from sandboxd import pool as pool_module

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = pool_module.owner_token(child.pid)
    child.kill()
    child.wait()
    others = [
        {"Id": "dead", "Labels": {"io.sandboxd.instance": "x", "io.sandboxd.node": "m",
                                  "io.sandboxd.owner": dead}},
        {"Id": "alive", "Labels": {"io.sandboxd.instance": "y", "io.sandboxd.node": "m",
                                   "io.sandboxd.owner": pool_module.owner_token()}},
        {"Id": "same-node", "Labels": {"io.sandboxd.instance": "z", "io.sandboxd.node": "n"}},
    ]
    removed: list[str] = []
    daemon = object.__new__(Daemon)
    daemon.pools = {}
    daemon.node, daemon.instance = "n", "i"
    daemon.backend = types.SimpleNamespace(remove=removed.append, list_ours=lambda: others)  # type: ignore[assignment]
    with caplog.at_level("INFO"):
        asyncio.run(daemon._sweep_orphans([]))
    assert removed == ["dead"]
    assert "removed 1 sandboxes of a daemon of this host that is gone" in caplog.text


def test_an_orphan_sweep_that_fails_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    daemon = object.__new__(Daemon)
    daemon.pools = {}

    def refuse(container_id: str) -> None:
        raise RuntimeError("engine gone")

    daemon.backend = types.SimpleNamespace(remove=refuse)  # type: ignore[assignment]
    asyncio.run(daemon._sweep_orphans([{"Id": "x", "Created": 0, "Names": ["/sandboxd-i-python-1"]}]))
    assert "orphan sweep failed" in caplog.text


def watching_daemon(list_ours: Callable[[str], list[dict[str, object]]], outage_seconds: float,
                    serving: list[bool]) -> Daemon:
    """A Daemon with only what _watch_engine reads: one pool, `list_ours` as the engine, its health calls
    appended to `serving`."""
    from sandboxd.config import Config

    pool, _sandbox = one_slot_pool()
    daemon = object.__new__(Daemon)
    daemon.pools = {"python": pool}
    daemon.instance = "i"
    daemon.config = Config()
    daemon.config.scheduler.engine_outage_seconds = outage_seconds
    daemon.engine_problem = ""
    daemon.backend = types.SimpleNamespace(list_ours=list_ours)  # type: ignore[assignment]
    daemon._set_serving = serving.append  # type: ignore[method-assign, assignment]
    daemon._on_pool_change = lambda: None  # type: ignore[method-assign]
    return daemon


def test_a_frozen_engine_is_an_outage_from_when_it_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGSTOPped dockerd holds the watch's list until docker.timeout_seconds (60 s): health said SERVING and
    the outage clock had not started all that while. Now a list unanswered for scheduler.engine_outage_seconds,
    counted from the question, is the outage, and it is waited on again rather than asked anew."""
    from sandboxd import daemon as daemon_module

    monkeypatch.setattr(daemon_module, "ENGINE_WATCH_SECONDS", 0.01)
    thawed = threading.Event()
    asked: list[float] = []

    def list_ours(instance: str) -> list[dict[str, object]]:
        asked.append(time.monotonic())
        if len(asked) == 1:
            thawed.wait(30)  # the frozen engine
        return []

    async def scenario() -> tuple[list[bool], list[str], int]:
        serving: list[bool] = []
        daemon = watching_daemon(list_ours, 0.2, serving)
        problems: list[str] = []
        fails = 0

        async def fail_waiters() -> None:
            nonlocal fails
            fails += 1
            problems.append(daemon.engine_problem)

        daemon._fail_waiters = fail_waiters  # type: ignore[method-assign]
        watcher = asyncio.ensure_future(daemon._watch_engine())
        try:
            # Hang detectors, not timings: the frozen list itself gives up after 30 s.
            await asyncio.wait_for(until(lambda: fails > 0), timeout=20)
            assert len(asked) == 1, "a second list was asked while the first was still held"
            thawed.set()
            await asyncio.wait_for(until(lambda: len(asked) >= 2 and not daemon.engine_problem), timeout=20)
        finally:
            thawed.set()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        return serving, problems, len(asked)

    serving, problems, lists = asyncio.run(scenario())
    # NOT_SERVING (said again each second of the outage: the real _set_serving ignores repeats); back to
    # SERVING is _on_pool_change's, once the pools have sandboxes again.
    assert serving and not any(serving)
    assert problems[0] == "TimeoutError: no answer in 0.2 s"
    assert lists >= 2


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_a_slow_list_within_the_outage_limit_turns_no_job_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded node's engine may take seconds to list: warm sandboxes need no engine, so that is no outage."""
    from sandboxd import daemon as daemon_module

    monkeypatch.setattr(daemon_module, "ENGINE_WATCH_SECONDS", 0.01)
    lists = 0

    def slow_list(instance: str) -> list[dict[str, object]]:
        nonlocal lists
        time.sleep(0.3)
        lists += 1
        return []

    async def scenario() -> list[bool]:
        serving: list[bool] = []
        # 10 s: far over the 0.3 s lists, on a loaded machine too.
        daemon = watching_daemon(slow_list, 10.0, serving)
        watcher = asyncio.ensure_future(daemon._watch_engine())
        try:
            await asyncio.wait_for(until(lambda: lists >= 3), timeout=20)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        assert daemon.engine_problem == ""
        return serving

    assert asyncio.run(scenario()) == []


def test_a_failing_pool_holds_back_no_other_pools_health() -> None:
    """A math pool that could not start a sandbox (64 MiB limit) kept the daemon NOT_SERVING: every client
    that health checks was turned away, code jobs included. Now the daemon serves once every pool that
    can start sandboxes is warm, and not while none can; its starting error names the failing pools."""
    from sandboxd import pool as pool_module
    from sandboxd.errors import NotReady

    working, _sandbox = one_slot_pool()
    failing, _other = one_slot_pool()
    failing.name, failing.sandboxes = "math", []
    failing.start_failures, failing.start_error = pool_module.FAILING_AFTER_STARTS - 1, "exit status 70"
    serving: list[bool] = []
    daemon = object.__new__(Daemon)
    daemon.pools = {"python": working, "math": failing}
    daemon.serving = daemon.stopping = False
    daemon.engine_problem = ""
    daemon._set_serving = serving.append  # type: ignore[method-assign, assignment]
    daemon._on_pool_change()
    assert serving == []  # still starting: the math pool may come up
    failing.start_failures += 1
    with pytest.raises(NotReady, match=r"no warm sandbox yet; pool math cannot start sandboxes \(3 starts"):
        daemon.check_ready()
    working.sandboxes = []
    daemon._on_pool_change()
    assert serving == []  # the python pool is not warm either
    working.sandboxes = [_sandbox]
    daemon._on_pool_change()
    assert serving == [True]


def test_a_daemon_none_of_whose_pools_can_start_sandboxes_stops_serving() -> None:
    """It stayed SERVING once warm (review): round-robin clients kept sending it batches, each of whose jobs was
    answered SANDBOX_LOST. A pool that is refilling, or one failing beside a working one, keeps it serving."""
    from sandboxd import pool as pool_module
    from sandboxd.errors import NotReady

    python, python_sandbox = one_slot_pool()
    math, math_sandbox = one_slot_pool()
    math.name = "math"
    serving: list[bool] = []
    daemon = object.__new__(Daemon)
    daemon.pools = {"python": python, "math": math}
    daemon.serving, daemon.stopping = True, False
    daemon.engine_problem = ""

    def set_serving(value: bool) -> None:
        serving.append(value)
        daemon.serving = value

    daemon._set_serving = set_serving  # type: ignore[method-assign, assignment]
    python.sandboxes = []
    daemon._on_pool_change()
    assert serving == []  # refilling
    math.start_failures, math.start_error = pool_module.FAILING_AFTER_STARTS, "exit status 70"
    daemon._on_pool_change()
    assert serving == []  # one pool failing, the other refilling
    python.start_failures, python.start_error = pool_module.FAILING_AFTER_STARTS, "no space left on device"
    daemon._on_pool_change()
    assert serving == []  # the math pool still has its sandbox
    math.sandboxes = []
    daemon._on_pool_change()
    assert serving == [False]
    with pytest.raises(NotReady, match="no pool can start sandboxes; pool python cannot start"):
        daemon.check_ready()
    python.start_failures, python.sandboxes = 0, [python_sandbox]
    daemon._on_pool_change()
    assert serving == [False, True]
    del math_sandbox


def with_bound_socket(folder: str, mode: str, group: str, check: Callable[[str], None]) -> None:
    """Bind a gRPC server with Daemon._bind_unix (no engine needed) on a socket in `folder` with the given access,
    and call `check` with the socket's path while it is bound."""
    from sandboxd.config import Config

    async def scenario() -> None:
        daemon = object.__new__(Daemon)
        daemon.config = Config()
        daemon.config.server.socket = f"{folder}/sandboxd.sock"
        daemon.config.server.socket_mode = mode
        daemon.config.server.socket_group = group
        server = grpc.aio.server()
        daemon._bind_unix(server)
        try:
            await asyncio.to_thread(check, daemon.config.server.socket)
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def connects_as(path: str, uid: int, gid: int, groups: list[int]) -> str:
    """Connect to the socket `path` from a process running as uid/gid with `groups`: "ok" or the errno's name.

    A probe that answers nothing is run again (at most 3 tries): once in a full bare CI run (2,793 tests), the
    outsider's probe printed nothing, and passed on every rerun. The last empty try's exit status and stderr are
    returned, so that a failure says what happened to the probe rather than only that it was silent.
    """
    probe = ("import errno, socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('ok')\n"
             "except OSError as e:\n    print(errno.errorcode[e.errno])\n")
    # The system's interpreter: the checkout's venv may lie in a folder another user cannot enter.
    interpreter = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    silent = ""
    for _ in range(3):
        done = subprocess.run([interpreter, "-I", "-c", probe, path], user=uid, group=gid, extra_groups=groups,
                              capture_output=True, text=True, timeout=30, cwd="/")
        if done.stdout.strip():
            return done.stdout.strip()
        silent = f"no answer: exit status {done.returncode}, stderr {done.stderr.strip()!r}"
    return silent


@pytest.mark.skipif(os.geteuid() != 0, reason="running probes as other users needs root")
def test_the_grpc_socket_lets_in_its_group_and_no_one_else() -> None:
    """Created under the umask, the socket was 0755 under systemd's UMask=0022: only root could connect, and a
    trainer running as another user got EACCES (review). Now server.socket_mode and server.socket_group."""
    trainers, outsider = 4242, 4343
    folder = tempfile.mkdtemp(prefix="sbd-sock-")
    os.chmod(folder, 0o755)  # a socket is reached through its folder

    def check(path: str) -> None:
        status = os.stat(path)
        assert (stat.S_IMODE(status.st_mode), status.st_gid) == (0o660, trainers)
        assert connects_as(path, 1000, 1000, [trainers]) == "ok"
        assert connects_as(path, 1000, 1000, [outsider]) == "EACCES"

    try:
        with_bound_socket(folder, "0660", str(trainers), check)
    finally:
        shutil.rmtree(folder)


def test_the_grpc_socket_is_never_open_to_others_under_a_loose_umask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket is created owner-only and then opened up to server.socket_mode: even with umask 0 it is never
    world-writable, not even before the chmod."""
    from sandboxd import daemon as daemon_module

    folder = tempfile.mkdtemp(prefix="sbd-sock-")
    modes: list[int] = []
    set_access = daemon_module.set_socket_access

    def recording(path: str, mode: str, group: str) -> None:
        modes.append(stat.S_IMODE(os.stat(path).st_mode))
        set_access(path, mode, group)

    monkeypatch.setattr(daemon_module, "set_socket_access", recording)
    umask = os.umask(0)
    try:
        with_bound_socket(folder, "0640", "", lambda path: modes.append(stat.S_IMODE(os.stat(path).st_mode)))
        assert modes == [0o600, 0o640]
        assert os.umask(0) == 0  # the daemon's umask is given back
    finally:
        os.umask(umask)
        shutil.rmtree(folder)


def health_watching_daemon(pools: dict[str, Pool], serving: list[bool]) -> Daemon:
    """A Daemon with only what _on_pool_change reads: `pools`, not serving yet, its SERVING changes appended to
    `serving`."""
    daemon = object.__new__(Daemon)
    daemon.pools = pools
    daemon.serving = daemon.stopping = False
    daemon.engine_problem = ""
    daemon._set_serving = serving.append  # type: ignore[method-assign, assignment]
    return daemon


def loading_model_pool() -> tuple[Pool, Sandbox]:
    """A reward-model pool, as health sees one, that has no sandbox yet; and the sandbox it will have."""
    model, model_sandbox = one_slot_pool()
    model.name, model.sandboxes = "rm-judge", []
    model.gates_health = False
    return model, model_sandbox


def test_a_reward_model_still_loading_holds_back_no_job_pool() -> None:
    """A model loads for up to load_timeout_seconds (600 s) per try; meanwhile the daemon was NOT_SERVING and every
    code and math job on the node was refused UNAVAILABLE (review). Its own jobs wait for it, as for any pool."""
    from sandboxd.rewardpool import RewardModelPool

    assert RewardModelPool.gates_health is False
    python, python_sandbox = one_slot_pool()
    model, _model_sandbox = loading_model_pool()
    serving: list[bool] = []
    daemon = health_watching_daemon({"python": python, "rm-judge": model}, serving)
    python.sandboxes = []
    daemon._on_pool_change()
    assert serving == []  # no job pool is warm yet
    python.sandboxes = [python_sandbox]
    daemon._on_pool_change()
    assert serving == [True]  # the model is still loading


def test_a_daemon_whose_job_pools_all_fail_serves_its_reward_model_once_loaded() -> None:
    from sandboxd import pool as pool_module

    python, _python_sandbox = one_slot_pool()
    python.sandboxes, python.start_failures = [], pool_module.FAILING_AFTER_STARTS
    model, model_sandbox = loading_model_pool()
    serving: list[bool] = []
    daemon = health_watching_daemon({"python": python, "rm-judge": model}, serving)
    daemon._on_pool_change()
    assert serving == []
    model.sandboxes = [model_sandbox]
    daemon._on_pool_change()
    assert serving == [True]


def test_each_reward_model_has_a_health_service_of_its_own(tmp_path: Path) -> None:
    """The daemon serves while a model loads (its job pools are warm); a client balancing reward-model jobs over
    daemons checks the model's own service, so that no job waits for a model still loading on one of them."""
    from grpc_health.v1 import health_pb2
    from sandboxd_client import reward_model_health_service

    from sandboxd.config import ModelConfig
    from sandboxd.sandbox import Sandbox
    from tests.test_rewardpool import make_pool

    async def scenario() -> list[tuple[str, int]]:
        said: list[tuple[str, int]] = []

        class Health:
            async def set(self, service: str, status: int) -> None:
                said.append((service, status))

        python, _python_sandbox = one_slot_pool()
        model_pool = make_pool(ModelConfig(path=str(tmp_path)), "cpu", tmp_path)
        model_sandbox = Sandbox(name="m", pool=model_pool.name, container_id="m", control_dir="/x",
                                started_by="cold")
        daemon = object.__new__(Daemon)
        daemon.pools = {"python": python, "rm-rm": model_pool}
        daemon.serving = daemon.stopping = False
        daemon.engine_problem = ""
        daemon.health = Health()
        daemon._background = set()
        daemon._models_serving = {"rm": False}
        daemon._on_pool_change()  # the daemon serves; the model is loading
        await asyncio.sleep(0)
        assert daemon.serving
        model_pool.sandboxes = [model_sandbox]
        daemon._on_pool_change()  # loaded
        await asyncio.sleep(0)
        model_pool.sandboxes = []
        daemon._on_pool_change()  # its sandbox lost: reloading
        await asyncio.sleep(0)
        model_pool.sandboxes = [model_sandbox]
        model_pool.model_state = {"state": "failed", "error": "no such architecture"}
        daemon._on_pool_change()  # a sandbox whose model failed to load answers each job with the error
        await asyncio.sleep(0)
        return said

    said = asyncio.run(scenario())
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    model = reward_model_health_service("rm")
    assert said == [("", serving), ("sandboxd.v1.Jobs", serving), (model, serving), (model, not_serving)]


def test_insecure_tcp_warning() -> None:
    from sandboxd.config import ServerConfig
    from sandboxd.daemon import insecure_tcp_warning

    assert insecure_tcp_warning(ServerConfig(tcp="0.0.0.0:1")) == ""  # refused by the config checks instead
    assert insecure_tcp_warning(ServerConfig(tcp="0.0.0.0:1", insecure_tcp=True)) == (
        "server.insecure_tcp: 0.0.0.0:1 serves without TLS and tokens: anyone who reaches it may run code and "
        "control the pools")
    assert insecure_tcp_warning(ServerConfig(tcp="0.0.0.0:1", insecure_tcp=True, tokens_file="/t")) == (
        "server.insecure_tcp: 0.0.0.0:1 serves without TLS: anyone who reaches it may read the tokens")
    assert insecure_tcp_warning(ServerConfig(tcp="0.0.0.0:1", insecure_tcp=True, tokens_file="/t",
                                             tls_cert="/c", tls_key="/k")) == ""


def test_the_health_listener_serves_health_alone_in_plaintext() -> None:
    """server.health: what Kubernetes' grpc probes ask (no TLS, no token), and nothing a job could use."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

    from sandboxd.config import Config
    from sandboxd.daemon import LIVENESS_SERVICE
    from tests.test_auth import free_port

    async def scenario() -> dict[str, object]:
        daemon = object.__new__(Daemon)
        daemon.config = Config()
        daemon.health = health.aio.HealthServicer()
        port = free_port()
        address = f"127.0.0.1:{port}"
        server = daemon._health_server()
        # ":port", all interfaces, as a pod listens (deploy/kubernetes/); gRPC refused it ("host must not be
        # empty") although the configuration takes it. Called on loopback only.
        daemon._bind_tcp(server, f":{port}", None)
        await server.start()
        await daemon.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await daemon.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check
                said: dict[str, object] = {
                    service or "(all)": (await check(health_pb2.HealthCheckRequest(service=service), timeout=10)).status
                    for service in ("", LIVENESS_SERVICE)}
                try:
                    await pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
                except grpc.aio.AioRpcError as error:
                    said["GetInfo"] = error.code()
            return said
        finally:
            await server.stop(None)

    assert asyncio.run(scenario()) == {"(all)": health_pb2.HealthCheckResponse.NOT_SERVING,
                                       LIVENESS_SERVICE: health_pb2.HealthCheckResponse.SERVING,
                                       "GetInfo": grpc.StatusCode.UNIMPLEMENTED}
