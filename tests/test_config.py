"""Configuration: defaults, TOML, environment, flags, and one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxd import config
from sandboxd.errors import ConfigError


def test_defaults_need_no_file() -> None:
    loaded = config.load(environ={})
    assert loaded.server.socket == "/run/sandboxd/sandboxd.sock"
    assert loaded.pool.snapshots is True
    assert loaded.pool.restore == "auto"
    assert loaded.limits.default_timeout_seconds <= loaded.limits.max_timeout_seconds


def test_priority_file_then_environment_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[pool]\nmin_size = 3\nmax_size = 8\n[server]\ntcp = '127.0.0.1:1'\n")
    loaded = config.load(file, environ={"SANDBOXD_POOL_MIN_SIZE": "5"}, overrides={"pool.max_size": 12})
    assert (loaded.pool.min_size, loaded.pool.max_size, loaded.server.tcp) == (5, 12, "127.0.0.1:1")


def test_config_file_from_environment(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[pool]\nscale_to_zero = true\n")
    assert config.load(environ={"SANDBOXD_CONFIG": str(file)}).pool.scale_to_zero is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("yes", True), ("off", False), ("0", False)],
)
def test_boolean_environment_values(value: str, expected: bool) -> None:
    assert config.load(environ={"SANDBOXD_POOL_SNAPSHOTS": value}).pool.snapshots is expected


def test_list_from_environment() -> None:
    assert config.load(environ={"SANDBOXD_POOL_IMAGES": "python"}).pool.images == ["python"]


def test_unrelated_prefixed_variables_are_ignored() -> None:
    config.load(environ={"SANDBOXD_ADDRESS": "unix:///x", "SANDBOXD_SKIP_IMAGES": "1", "SANDBOXD_SKIP_CRIU": "1",
                         "SANDBOXD_IMAGES": "langs", "SANDBOXD_BASE_IMAGE": "python:3.12-slim",
                         "SANDBOXD_CA_BUNDLE": "/x", "SANDBOXD_CACHE_DIR": "/x", "SANDBOXD_TORCH": "cpu",
                         "SANDBOXD_PIP_INDEX_URL": "http://x", "SANDBOXD_DEBIAN_MIRROR": "http://x",
                         "SANDBOXD_WHEELS_DIR": "/x", "SANDBOXD_IMAGES_DIR": "/x"})


@pytest.mark.parametrize("name", ["SANDBOXD_MODEL_RM_PATH", "SANDBOXD_SESSION_ENABLED", "SANDBOXD_POOLS_MIN_SIZE"])
def test_a_near_miss_of_a_section_in_the_environment_is_an_error(name: str) -> None:
    """It was ignored without a word: the daemon started with no reward model, or sessions still on."""
    with pytest.raises(ConfigError, match=f"environment {name}: no section"):
        config.load(environ={name: "x"})


@pytest.mark.parametrize(
    ("toml", "fragment"),
    [
        ("[pool]\nmin_sise = 1\n", "unknown key pool.min_sise"),
        ("[pools]\nmin_size = 1\n", "unknown section 'pools'"),
        ("[pool]\nmin_size = 'two'\n", "expected an integer"),
        ("[pool]\nmin_size = 1.5\n", "expected an integer"),
        ("[pool]\nsnapshots = 'maybe'\n", "expected true or false"),
        ("[pool]\nrestore = 'never'\n", "pool.restore must be auto or always"),
        ("[pool]\nmin_size = 10\nmax_size = 2\n", "pool.max_size"),
        ("[limits]\ndefault_timeout_seconds = 500.0\n", "default_timeout_seconds"),
        ("[server]\nlog_format = 'xml'\n", "log_format"),
        ("pool = 3\n", "must be a [section]"),
        ("[pool\n", "not valid TOML"),
        ("[pool]\nimages = ['python', 'cobol']\n", "pool.images"),
        # A sandbox has 500 job uids; more runs or sessions than they cover would retire it mid-job.
        ("[pool]\njobs_per_sandbox = 101\n", "pool.jobs_per_sandbox must be in [1, 100]"),
        ("[sessions]\nper_sandbox = 401\n", "sessions.per_sandbox must be in [1, 400]"),
        # 0 is tmpfs's "no limit"; a handful of entries would fail the agent's own folders.
        ("[sandbox]\ntmpfs_inodes = 0\n", "sandbox.tmpfs_inodes must be >= 1024"),
        ("[sandbox]\ntmpfs_inodes = 100\n", "sandbox.tmpfs_inodes must be >= 1024"),
        ("[limits]\ndefault_total_timeout_seconds = 4000\n",
         "0 < default_total_timeout_seconds <= max_total_timeout_seconds"),
        # Each of these was accepted and broke later (review): every sandbox's start, the health status, or
        # start-up with a traceback.
        ("[sandbox]\ncpus = 0.001\n", "sandbox.cpus must be between 0.01"),
        ("[sandbox]\ncpus = 500\n", "sandbox.cpus must be between 0.01"),
        ("[sandbox]\ncpus = inf\n", "expected a finite number"),
        ("[sessions]\nheadroom = nan\n", "expected a finite number"),
        ("[pool]\nmin_size = inf\n", "expected an integer"),
        ("[sandbox]\ntmpfs_bytes = 0\n", "sandbox.tmpfs_bytes must be >= 1 MiB"),
        ("[scheduler]\nmax_batch = 0\n", "scheduler.max_batch must be >= 1"),
        ("[scheduler]\nengine_outage_seconds = 0\n", "scheduler.engine_outage_seconds must be >= 1"),
        ("[limits]\ncompile_timeout_seconds = -1\n", "limits.compile_timeout_seconds must be > 0"),
        ("[docker]\ntimeout_seconds = 0.5\n", "docker.timeout_seconds must be >= 1"),
        ("[server]\nmetrics = '9464'\n", "server.metrics must be host:port"),
        ("[server]\nmetrics = 'localhost'\n", "server.metrics must be host:port"),
        ("[server]\ntcp = '127.0.0.1:99999'\n", "server.tcp must be host:port"),
        ("[server]\nhealth = '8081'\n", "server.health must be host:port"),
        ("[server]\ntcp = '127.0.0.1:8081'\nhealth = '127.0.0.1:8081'\n",
         "server.health and server.tcp must listen on different ports"),
        ("[server]\ntcp = '127.0.0.1:8081'\nhealth = ':8081'\n",
         "server.health and server.tcp must listen on different ports"),
        # An integer 0660 in TOML is decimal 660; setuid and sticky bits mean nothing on a socket.
        ("[server]\nsocket_mode = 660\n", "expected a string"),
        ("[server]\nsocket_mode = '0668'\n", "server.socket_mode must be an octal mode"),
        ("[server]\nsocket_mode = '4770'\n", "server.socket_mode must be an octal mode"),
        ("[server]\nsocket_group = 'no-such-group-here'\n", "server.socket_group: no group"),
        # Clients print it and match on it: no spaces, no control characters.
        ("[server]\nnode_name = 'node 7'\n", "server.node_name must be 1-253 of"),
        ("[server]\nnode_name = '-node7'\n", "server.node_name must be 1-253 of"),
        (f"[server]\nnode_name = '{'n' * 254}'\n", "server.node_name must be 1-253 of"),
    ],
)
def test_invalid_file(tmp_path: Path, toml: str, fragment: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        config.load(file, environ={})
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        config.load("/nonexistent/sandboxd.toml", environ={})


def test_bad_environment_value_names_variable() -> None:
    with pytest.raises(ConfigError, match="SANDBOXD_SANDBOX_CPUS"):
        config.load(environ={"SANDBOXD_SANDBOX_CPUS": "lots"})


def test_bad_flag_names_flag() -> None:
    with pytest.raises(ConfigError, match="--max-size"):
        config.load(environ={}, overrides={"pool.max_size": "x"})


def test_pool_size_limit_follows_the_host_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three CPUs in the daemon's affinity mask, whatever the machine has.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5})
    automatic = config.load(environ={})
    assert automatic.pool.max_size == 0
    assert automatic.pool.size_limit == 6
    assert config.load(environ={"SANDBOXD_POOL_MAX_SIZE": "7"}).pool.size_limit == 7
    # A floor above twice the CPUs wins: min_size sandboxes are always kept.
    assert config.load(environ={"SANDBOXD_POOL_MIN_SIZE": "500"}).pool.size_limit == 500


def test_tmpfs_entries_are_capped_on_every_tmpfs_a_job_can_write() -> None:
    """tmpfs caps bytes, not entries: hard links take none, and a job made 2.5 million of them."""
    from sandboxd.backend import SandboxSpec, container_config

    assert config.load(environ={}).sandbox.tmpfs_inodes == config.DEFAULT_TMPFS_INODES == 65_536
    assert config.load(environ={"SANDBOXD_SANDBOX_TMPFS_INODES": "4096"}).sandbox.tmpfs_inodes == 4096
    spec = SandboxSpec(name="s", image="i", command=[], control_dir="/c", code_dir="/o", labels={},
                       memory_bytes=1 << 30, nano_cpus=10**9, pids=64, tmpfs_bytes=1 << 20)
    assert spec.tmpfs_inodes == config.DEFAULT_TMPFS_INODES
    spec.tmpfs_inodes = 4096
    tmpfs = container_config(spec)["tmpfs"]
    assert set(tmpfs) == {"/tmp", "/dev/shm"}
    for options in tmpfs.values():
        assert "nr_inodes=4096" in options.split(",")


@pytest.mark.parametrize(("text", "bits"), [("0660", 0o660), ("660", 0o660), ("0o600", 0o600), (" 0666 ", 0o666)])
def test_socket_mode_is_read_as_octal(text: str, bits: int) -> None:
    assert config.socket_mode(text) == bits
    assert config.load(environ={"SANDBOXD_SERVER_SOCKET_MODE": text}).server.socket_mode == text


def test_socket_group_by_name_or_number() -> None:
    import grp
    import os

    assert config.socket_gid("") == -1
    assert config.socket_gid("1234") == 1234
    assert config.socket_gid(grp.getgrgid(os.getgid()).gr_name) == os.getgid()


def test_every_serve_flag_says_what_it_takes_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    """The README sends users to `sandboxd serve --help` for flags, which listed bare names."""
    from sandboxd import cli

    assert set(cli.SERVE_HELP) == set(cli.SERVE_FLAGS)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "true or false: CRIU snapshots of warm sandboxes (pool.snapshots, default true)" in text
    assert "(server.socket, default /run/sandboxd/sandboxd.sock)" in text
    assert '(server.tcp, default "")' in text


@pytest.mark.parametrize(
    ("server", "fragment"),
    [
        ({"tcp": "0.0.0.0:50051"}, "server.tcp 0.0.0.0:50051 is not a loopback address"),
        ({"tcp": ":50051"}, "is not a loopback address"),
        ({"tcp": "[::]:50051"}, "is not a loopback address"),
        ({"tcp": "10.1.2.3:50051"}, "is not a loopback address"),
        # A name is not resolved: it may name any interface.
        ({"tcp": "node7.cluster:50051"}, "is not a loopback address"),
        # TLS alone or tokens alone is not enough off loopback: tokens would cross in clear, or anyone could call.
        ({"tcp": "0.0.0.0:50051", "tls_cert": "/c.pem", "tls_key": "/k.pem"}, "is not a loopback address"),
        ({"tcp": "0.0.0.0:50051", "tokens_file": "/t"}, "is not a loopback address"),
        ({"tcp": "127.0.0.1:50051", "tls_cert": "/c.pem"}, "server.tls_cert and server.tls_key must be set together"),
        ({"tcp": "127.0.0.1:50051", "tls_client_ca": "/ca.pem"}, "server.tls_client_ca (mutual TLS) needs"),
        ({"tcp": "127.0.0.1:50051", "tokens_file": "tokens"}, "must be absolute paths"),
        ({"tokens_file": "/t"}, "guard server.tcp, which is empty"),
    ],
)
def test_tcp_door_refused(server: dict[str, str], fragment: str) -> None:
    overrides = {f"server.{key}": value for key, value in server.items()}
    with pytest.raises(ConfigError) as caught:
        config.load(environ={}, overrides=overrides)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "server",
    [
        {"tcp": "127.0.0.1:50051"},
        {"tcp": "127.3.4.5:50051"},
        {"tcp": "[::1]:50051"},
        {"tcp": "localhost:50051"},
        {"tcp": "0.0.0.0:50051", "tls_cert": "/c.pem", "tls_key": "/k.pem", "tokens_file": "/t"},
        {"tcp": "0.0.0.0:50051", "tls_cert": "/c.pem", "tls_key": "/k.pem", "tls_client_ca": "/ca.pem",
         "tokens_file": "/t"},
        {"tcp": "0.0.0.0:50051", "insecure_tcp": "true"},
    ],
)
def test_tcp_door_allowed(server: dict[str, str]) -> None:
    loaded = config.load(environ={}, overrides={f"server.{key}": value for key, value in server.items()})
    assert loaded.server.tcp == server["tcp"]


def test_insecure_tcp_from_environment() -> None:
    with pytest.raises(ConfigError, match="not a loopback address"):
        config.load(environ={"SANDBOXD_SERVER_TCP": "0.0.0.0:1"})
    loaded = config.load(environ={"SANDBOXD_SERVER_TCP": "0.0.0.0:1", "SANDBOXD_SERVER_INSECURE_TCP": "1"})
    assert loaded.server.insecure_tcp and config.tcp_unguarded(loaded.server)


def test_node_name_from_the_environment() -> None:
    assert config.load(environ={}).server.node_name == ""  # the daemon takes the host's name
    loaded = config.load(environ={"SANDBOXD_SERVER_NODE_NAME": "gpu-node-7.cluster"})
    assert loaded.server.node_name == "gpu-node-7.cluster"
