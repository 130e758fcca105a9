"""Bearer tokens: the tokens file, which role may call what, and the interceptor's decisions."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from sandboxd_client import AsyncSandboxClient, SandboxClient
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc
from sandboxd_client.errors import InvalidRequest, PermissionDenied

from sandboxd import auth
from sandboxd.config import Config
from sandboxd.daemon import Daemon, server_credentials
from sandboxd.errors import ConfigError
from sandboxd.scheduler import Scheduler

JOBS_SECRET = "j" * 32
ADMIN_SECRET = "a" * 32
TOKENS = [auth.Token("trainer", "jobs", JOBS_SECRET.encode()), auth.Token("ops", "admin", ADMIN_SECRET.encode())]


def write_tokens(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_load_tokens(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "tokens", f"# name role token\ntrainer jobs {JOBS_SECRET}\n\n"
                                             f"ops  admin\t{ADMIN_SECRET}  # on call\n")
    assert auth.load_tokens(path) == TOKENS


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o660, 0o644])
def test_tokens_file_open_to_others_refused(tmp_path: Path, mode: int) -> None:
    path = write_tokens(tmp_path / "tokens", f"trainer jobs {JOBS_SECRET}\n", mode)
    with pytest.raises(ConfigError, match=rf"server\.tokens_file .*: mode {mode:04o} lets group or others in"):
        auth.load_tokens(path)


def test_tokens_file_missing_or_a_link(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.tokens_file .*No such file"):
        auth.load_tokens(str(tmp_path / "none"))
    target = write_tokens(tmp_path / "tokens", f"trainer jobs {JOBS_SECRET}\n")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match=r"server\.tokens_file"):
        auth.load_tokens(str(tmp_path / "link"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "no tokens"),
        ("# only a comment\n", "no tokens"),
        (f"trainer {JOBS_SECRET}\n", "line 1: expected 'name role token', got 2 fields"),
        (f"trainer root {JOBS_SECRET}\n", "line 1: role must be jobs or admin, got 'root'"),
        ("trainer jobs short\n", "line 1: token 'trainer' must be at least 16"),
        (f"a jobs {JOBS_SECRET}\na admin {ADMIN_SECRET}\n", "line 2: token name 'a' is used twice"),
        (f"a jobs {JOBS_SECRET}\nb admin {JOBS_SECRET}\n", "line 2: token 'b' repeats another's token"),
    ],
)
def test_bad_tokens_file(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        auth.parse_tokens(text, "server.tokens_file /t")
    assert fragment in str(caught.value)
    # A token is never quoted back: error messages reach logs.
    assert JOBS_SECRET not in str(caught.value) and ADMIN_SECRET not in str(caught.value)


def test_token_repr_hides_the_secret() -> None:
    assert JOBS_SECRET not in repr(TOKENS[0]) and JOBS_SECRET not in str(TOKENS)


@pytest.mark.parametrize(
    ("method", "role"),
    [
        ("/grpc.health.v1.Health/Check", None),
        ("/grpc.health.v1.Health/Watch", None),
        ("/sandboxd.v1.Jobs/Run", "jobs"),
        ("/sandboxd.v1.Jobs/RunBatch", "jobs"),
        ("/sandboxd.v1.Sessions/Open", "jobs"),
        ("/sandboxd.v1.Pool/GetStatus", "jobs"),
        ("/sandboxd.v1.Daemon/GetInfo", "jobs"),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "jobs"),
        ("/sandboxd.v1.Pool/SetBatchHint", "admin"),
        # Pool controls added later are closed to jobs tokens until named.
        ("/sandboxd.v1.Pool/Drain", "admin"),
        ("/sandboxd.v1.Daemon/Shutdown", "admin"),
        ("/sandboxd.v1.Pool/GetStatusAndMore", "admin"),
    ],
)
def test_required_role(method: str, role: str | None) -> None:
    assert auth.required_role(method) == role


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), None),
        ((("authorization", f"Bearer {JOBS_SECRET}"),), JOBS_SECRET.encode()),
        ((("authorization", f"bearer  {JOBS_SECRET} "),), JOBS_SECRET.encode()),
        ((("x-other", "1"), ("authorization", f"Bearer {JOBS_SECRET}")), JOBS_SECRET.encode()),
        ((("authorization", JOBS_SECRET),), None),
        ((("authorization", f"Basic {JOBS_SECRET}"),), None),
        ((("authorization", "Bearer "),), None),
    ],
)
def test_bearer(metadata: tuple[tuple[str, str], ...], expected: bytes | None) -> None:
    assert auth.bearer(metadata) == expected


@pytest.mark.parametrize(
    ("method", "secret", "token", "refused"),
    [
        ("/grpc.health.v1.Health/Check", None, None, None),
        ("/sandboxd.v1.Jobs/RunBatch", None, None, grpc.StatusCode.UNAUTHENTICATED),
        ("/sandboxd.v1.Jobs/RunBatch", "x" * 32, None, grpc.StatusCode.UNAUTHENTICATED),
        # A prefix or an extension of a real token is not that token.
        ("/sandboxd.v1.Jobs/RunBatch", JOBS_SECRET[:-1], None, grpc.StatusCode.UNAUTHENTICATED),
        ("/sandboxd.v1.Jobs/RunBatch", JOBS_SECRET + "j", None, grpc.StatusCode.UNAUTHENTICATED),
        ("/sandboxd.v1.Jobs/RunBatch", JOBS_SECRET, "trainer", None),
        ("/sandboxd.v1.Jobs/RunBatch", ADMIN_SECRET, "ops", None),
        ("/sandboxd.v1.Pool/SetBatchHint", JOBS_SECRET, "trainer", grpc.StatusCode.PERMISSION_DENIED),
        ("/sandboxd.v1.Pool/SetBatchHint", ADMIN_SECRET, "ops", None),
        ("/sandboxd.v1.Pool/SetBatchHint", None, None, grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_authorize(method: str, secret: str | None, token: str | None, refused: grpc.StatusCode | None) -> None:
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    found, code = auth.authorize(TOKENS, method, metadata)
    assert (found.name if found else None, code) == (token, refused)


# ---------------------------------------------------------------------------
# The door itself: the daemon's TCP server (Daemon._server, _bind_tcp) with real TLS over 127.0.0.1.
# No Docker engine: the daemon has no pools, so calls that pass the door reach servicers that answer
# from its state (GetInfo, GetStatus, SetBatchHint) or say it is starting (Jobs: UNAVAILABLE).
# ---------------------------------------------------------------------------


@dataclass
class Pki:
    folder: Path
    ca: trustme.CA
    server: trustme.LeafCert
    client: trustme.LeafCert

    def path(self, name: str) -> str:
        return str(self.folder / name)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("trainer@sandboxd.test")
    stranger = trustme.CA().issue_cert("trainer@sandboxd.test")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    server.private_key_pem.write_to_path(tmp_path / "server.key")
    for pem in server.cert_chain_pems:
        pem.write_to_path(tmp_path / "server.pem", append=True)
    for name, leaf in (("client", client), ("stranger", stranger)):
        leaf.private_key_pem.write_to_path(tmp_path / f"{name}.key")
        for pem in leaf.cert_chain_pems:
            pem.write_to_path(tmp_path / f"{name}.pem", append=True)
    write_tokens(tmp_path / "tokens", f"trainer jobs {JOBS_SECRET}\nops admin {ADMIN_SECRET}\n")
    return Pki(tmp_path, ca, server, client)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Door:
    """The daemon's TCP listener (TLS, tokens) in a thread with its own event loop, stoppable and restartable."""

    def __init__(self, pki: Pki, *, mutual: bool = False, port: int = 0) -> None:
        config = Config()
        config.server.socket = ""
        config.server.tcp = f"127.0.0.1:{port or free_port()}"
        config.server.tls_cert, config.server.tls_key = pki.path("server.pem"), pki.path("server.key")
        config.server.tls_client_ca = pki.path("ca.pem") if mutual else ""
        config.server.tokens_file = pki.path("tokens")
        config.validate()
        self.config = config
        self.address = config.server.tcp
        self.calls_seen = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _start(self) -> None:
        daemon = object.__new__(Daemon)
        daemon.config = self.config
        daemon.pools = {}
        daemon.scheduler = Scheduler(daemon.pools, self.config)
        daemon.health = health.aio.HealthServicer()
        daemon.serving = False
        daemon.engine_problem = ""
        daemon.node_name = "door"
        daemon.tokens = auth.load_tokens(self.config.server.tokens_file)
        daemon.tls = server_credentials(self.config.server)
        server = daemon._server([auth.BearerTokens(daemon.tokens)])
        daemon._bind_tcp(server, self.config.server.tcp, daemon.tls)
        await server.start()
        await daemon.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server

    def start(self) -> Door:
        self._call(self._start())
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._server.stop(None))
            self._server = None

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def door(pki: Pki) -> Iterator[Door]:
    server = Door(pki).start()
    yield server
    server.close()


def tls_channel(pki: Pki, address: str, *, cert: str = "") -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        (pki.folder / "ca.pem").read_bytes(),
        (pki.folder / f"{cert}.key").read_bytes() if cert else None,
        (pki.folder / f"{cert}.pem").read_bytes() if cert else None,
    )
    return grpc.secure_channel(address, credentials)


def code_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def bearer_metadata(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


def test_door_refuses_by_token_and_role(door: Door, pki: Pki) -> None:
    with tls_channel(pki, door.address) as channel:
        daemon, pool = pb_grpc.DaemonStub(channel), pb_grpc.PoolStub(channel)
        jobs = pb_grpc.JobsStub(channel)
        hint = pb.BatchHint(batch_size=8)
        cases = {
            "no token": lambda: daemon.GetInfo(pb.GetInfoRequest(), timeout=10),
            "unknown token": lambda: daemon.GetInfo(pb.GetInfoRequest(), timeout=10,
                                                    metadata=bearer_metadata("x" * 32)),
            "jobs token, admin call": lambda: pool.SetBatchHint(hint, timeout=10,
                                                                metadata=bearer_metadata(JOBS_SECRET)),
            "no token, admin call": lambda: pool.SetBatchHint(hint, timeout=10),
            "no token, stream": lambda: list(jobs.RunBatch(pb.RunBatchRequest(), timeout=10)),
            "jobs token, info": lambda: daemon.GetInfo(pb.GetInfoRequest(), timeout=10,
                                                       metadata=bearer_metadata(JOBS_SECRET)),
            "jobs token, status": lambda: pool.GetStatus(pb.GetPoolStatusRequest(), timeout=10,
                                                         metadata=bearer_metadata(JOBS_SECRET)),
            "admin token, admin call": lambda: pool.SetBatchHint(hint, timeout=10,
                                                                 metadata=bearer_metadata(ADMIN_SECRET)),
            # Past the door: the daemon (no pools here) says it is starting.
            "jobs token, job": lambda: jobs.Run(pb.Job(), timeout=10, metadata=bearer_metadata(JOBS_SECRET)),
            "health, no token": lambda: health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10),
        }
        answers = {name: code_of(call) for name, call in cases.items()}
    unauthenticated = (grpc.StatusCode.UNAUTHENTICATED, auth.UNAUTHENTICATED_MESSAGE)
    assert answers == {
        "no token": unauthenticated,
        "unknown token": unauthenticated,
        "jobs token, admin call": (grpc.StatusCode.PERMISSION_DENIED, auth.PERMISSION_DENIED_MESSAGE),
        "no token, admin call": unauthenticated,
        "no token, stream": unauthenticated,
        "jobs token, info": (grpc.StatusCode.OK, ""),
        "jobs token, status": (grpc.StatusCode.OK, ""),
        "admin token, admin call": (grpc.StatusCode.OK, ""),
        "jobs token, job": (grpc.StatusCode.UNAVAILABLE, answers["jobs token, job"][1]),
        "health, no token": (grpc.StatusCode.OK, ""),
    }
    assert "starting" in answers["jobs token, job"][1]


def test_reflection_needs_a_token(door: Door, pki: Pki) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with tls_channel(pki, door.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        assert code_of(lambda: list(stub.ServerReflectionInfo(iter([request]), timeout=10)))[0] == (
            grpc.StatusCode.UNAUTHENTICATED)
        answers = list(stub.ServerReflectionInfo(iter([request]), timeout=10, metadata=bearer_metadata(JOBS_SECRET)))
    assert "sandboxd.v1.Jobs" in {service.name for service in answers[0].list_services_response.service}


def test_plaintext_client_on_the_tls_port_refused(door: Door) -> None:
    with grpc.insecure_channel(door.address) as channel:
        code, _ = code_of(lambda: pb_grpc.DaemonStub(channel).GetInfo(
            pb.GetInfoRequest(), timeout=5, metadata=bearer_metadata(JOBS_SECRET)))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls(pki: Pki) -> None:
    server = Door(pki, mutual=True).start()
    try:
        info = pb.GetInfoRequest()
        metadata = bearer_metadata(JOBS_SECRET)
        with tls_channel(pki, server.address, cert="client") as channel:
            assert code_of(lambda: pb_grpc.DaemonStub(channel).GetInfo(info, timeout=10, metadata=metadata))[0] == (
                grpc.StatusCode.OK)
        for cert in ("", "stranger"):  # no client certificate; one from another CA
            with tls_channel(pki, server.address, cert=cert) as channel:
                code, _ = code_of(lambda: pb_grpc.DaemonStub(channel).GetInfo(info, timeout=5, metadata=metadata))
            assert code == grpc.StatusCode.UNAVAILABLE, cert
    finally:
        server.close()


def test_client_tls_and_token_from_arguments_and_environment(door: Door, pki: Pki,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with SandboxClient(door.address, tls_ca=pki.path("ca.pem"), token=JOBS_SECRET, max_retries=0) as client:
        assert client.info().version
        with pytest.raises(PermissionDenied, match=auth.PERMISSION_DENIED_MESSAGE):
            client.set_batch_hint(8)
    monkeypatch.setenv("SANDBOXD_TLS_CA", pki.path("ca.pem"))
    monkeypatch.setenv("SANDBOXD_TOKEN", ADMIN_SECRET)
    with SandboxClient(door.address, max_retries=0) as client:
        assert client.set_batch_hint(8) is not None

    async def go() -> None:
        async with AsyncSandboxClient(door.address, max_retries=0) as client:
            assert (await client.info()).version
        async with AsyncSandboxClient(door.address, token="y" * 32, max_retries=0) as client:
            with pytest.raises(PermissionDenied, match=auth.UNAUTHENTICATED_MESSAGE):
                await client.info()

    asyncio.run(go())


def test_a_list_of_daemons_over_tls_needs_the_name_their_certificates_share(door: Door, pki: Pki) -> None:
    """gRPC checks a list's certificates against the list's own text: without tls_server_name every call failed
    UNAVAILABLE "Hostname Verification Check failed", even with each daemon's address in its certificate."""
    other = Door(pki).start()
    try:
        pair = [door.address, other.address]
        for where in ({"address": pair}, {"address": door.address, "fleet": pair}):
            with pytest.raises(InvalidRequest, match="needs tls_server_name"):
                SandboxClient(**where, tls_ca=pki.path("ca.pem"), token=JOBS_SECRET)
        # The certificates carry "localhost" beside 127.0.0.1.
        with SandboxClient(pair, tls_ca=pki.path("ca.pem"), tls_server_name="localhost", token=JOBS_SECRET,
                           max_retries=0) as client:
            assert len(client.pool_status().pools) == 0 and client.info().version
    finally:
        other.close()


def test_client_reconnects_within_two_seconds_of_the_daemon_coming_back(pki: Pki) -> None:
    """A daemon down for 10 s: gRPC's default backoff (1 s, x1.6, up to 120 s) next tried 1.6-8 s after it was
    back; the client's reconnect options (at most 1 s apart) find it within about 1.2 s."""
    server = Door(pki).start()
    try:
        with SandboxClient(server.address, tls_ca=pki.path("ca.pem"), token=JOBS_SECRET) as client:
            stub = pb_grpc.DaemonStub(client._channel)

            def answers() -> bool:
                return code_of(lambda: stub.GetInfo(pb.GetInfoRequest(), timeout=0.5,
                                                    metadata=bearer_metadata(JOBS_SECRET)))[0] == grpc.StatusCode.OK

            assert answers()
            server.stop()
            down_until = time.monotonic() + 10
            while time.monotonic() < down_until:  # a trainer retrying while the daemon is away
                assert not answers()
                time.sleep(0.1)
            server.start()
            back = time.monotonic()
            while not answers():
                assert time.monotonic() - back < 30
                time.sleep(0.02)
            reconnect = time.monotonic() - back
    finally:
        server.close()
    print(f"reconnected {reconnect:.2f} s after the daemon came back")
    # 2 s is the promise; 3 leaves room for a loaded CI machine (measured: see CHANGELOG).
    assert reconnect < 3.0, reconnect


def test_refusals_logged_once_per_interval(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    interceptor = auth.BearerTokens(TOKENS)
    caplog.set_level("INFO", logger="sandboxd.auth")
    for _ in range(5):
        interceptor._log_refusal("/sandboxd.v1.Jobs/Run", None, "unauthenticated")
        interceptor._log_refusal("/sandboxd.v1.Pool/SetBatchHint", TOKENS[0], "permission_denied")
    now[0] += auth.REFUSAL_LOG_SECONDS
    interceptor._log_refusal("/sandboxd.v1.Jobs/Run", None, "unauthenticated")
    assert [record.getMessage() for record in caplog.records] == [
        "refused /sandboxd.v1.Jobs/Run: missing or unknown bearer token",
        "refused /sandboxd.v1.Pool/SetBatchHint to token 'trainer' (role jobs)",
        "refused /sandboxd.v1.Jobs/Run: missing or unknown bearer token (and 4 more in the last 10 s)",
    ]
