"""A non-Python client against a real daemon: ``examples/node/sandboxd.js`` (Node.js, @grpc/grpc-js).

The Node client loads ``protos/sandboxd/v1/sandboxd.proto`` at run time with
@grpc/proto-loader: no generated code and nothing from the Python client. It
calls ``Daemon.GetInfo``, ``Jobs.Run`` and the streaming ``Jobs.RunBatch`` over
the TCP door (mutual TLS and a bearer token, given by ``SANDBOXD_TOKEN`` /
``SANDBOXD_TLS_*`` or by arguments) and over the Unix socket of one daemon, and
its answers are checked against what the Python client gets for the same jobs.

Needs ``node`` and ``examples/node/node_modules``; scripts/setup.sh installs both
(apt ``nodejs npm``, then ``npm ci``). Without them the tests skip, except under
CI (``CI`` set), where a missing toolchain is a setup bug and fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from sandboxd_client import SandboxClient, Status, code_job, execute_job, math_job

from tests.conftest import DaemonProcess, docker_available, skip_or_fail
from tests.integration.helpers import write_leaf

pytestmark = [pytest.mark.docker]

NODE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"
SCRIPT = NODE_DIR / "sandboxd.js"

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
SUB = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
ADD_TESTS = {"stdio": [{"stdin": "1 2\n", "expected_stdout": "3\n"}, {"stdin": "40 2\n", "expected_stdout": "42\n"}]}


def _node() -> str:
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "no node on PATH"
    elif not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        missing = f"no {NODE_DIR / 'node_modules'}"
    if missing:
        skip_or_fail(f"{missing}: run scripts/setup.sh (or npm ci --ignore-scripts in examples/node)")
    assert node is not None
    return node


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


JOBS_TOKEN = "node-jobs-" + "4" * 32
# The daemon's certificate names its address and a DNS name, for --tls-server-name.
SERVER_NAME = "sandboxd.test"


@dataclass
class Door:
    """A daemon on its Unix socket and on `tcp` (127.0.0.1:<port>) behind mutual TLS and a `jobs` token."""

    daemon: DaemonProcess
    tcp: str
    folder: Path

    @property
    def env(self) -> dict[str, str]:
        """The door's settings as a trainer's environment gives them."""
        return {"SANDBOXD_TOKEN": JOBS_TOKEN, "SANDBOXD_TLS_CA": str(self.folder / "ca.pem"),
                "SANDBOXD_TLS_CERT": str(self.folder / "client.pem"),
                "SANDBOXD_TLS_KEY": str(self.folder / "client.key")}

    def python_client(self) -> SandboxClient:
        return SandboxClient(self.tcp, token=JOBS_TOKEN, tls_ca=str(self.folder / "ca.pem"),
                             tls_cert=str(self.folder / "client.pem"), tls_key=str(self.folder / "client.key"))


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    """One daemon listening on a Unix socket and on 127.0.0.1:<port> with mutual TLS and a tokens file."""
    _node()
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    folder = tmp_path_factory.mktemp("node")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(folder / "ca.pem")
    write_leaf(folder, "server", ca.issue_cert("127.0.0.1", SERVER_NAME))
    write_leaf(folder, "client", ca.issue_cert("trainer@sandboxd.test"))
    tokens = folder / "tokens"
    tokens.write_text(f"trainer jobs {JOBS_TOKEN}\n")
    os.chmod(tokens, 0o600)
    tcp = f"127.0.0.1:{_free_port()}"
    process = DaemonProcess(folder, "n", tcp=tcp, extra_env={
        "SANDBOXD_SERVER_TLS_CERT": str(folder / "server.pem"),
        "SANDBOXD_SERVER_TLS_KEY": str(folder / "server.key"),
        "SANDBOXD_SERVER_TLS_CLIENT_CA": str(folder / "ca.pem"),
        "SANDBOXD_SERVER_TOKENS_FILE": str(tokens),
    })
    try:
        process.wait_serving()
        yield Door(process, tcp, folder)
    finally:
        process.stop()


def node(address: str, command: str, payload: Any = None, *, deadline: float = 120,
         env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run the Node client; its environment holds no door settings but `env`'s."""
    clean = {k: v for k, v in os.environ.items() if k != "SANDBOXD_TOKEN" and not k.startswith("SANDBOXD_TLS_")}
    return subprocess.run(
        [_node(), str(SCRIPT), "--address", address, "--deadline", str(deadline), *args, command],
        input=None if payload is None else json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=deadline + 30,
        env={**clean, "SANDBOXD_ADDRESS": "", **(env or {})},
    )


def node_ok(address: str, command: str, payload: Any = None, *, env: Mapping[str, str] | None = None,
            args: Sequence[str] = ()) -> list[dict[str, Any]]:
    done = node(address, command, payload, env=env, args=args)
    assert done.returncode == 0, (done.returncode, done.stderr)
    return [json.loads(line) for line in done.stdout.splitlines()]


def math_msg(completion: str, ground_truth: str, **job: Any) -> dict[str, Any]:
    return {"limits": {"timeout_seconds": 10}, "math": {"completion": completion, "ground_truth": ground_truth}, **job}


def code_msg(completion: str, **job: Any) -> dict[str, Any]:
    return {"limits": {"timeout_seconds": 5}, "code": {"completion": completion, "tests": ADD_TESTS}, **job}


def test_get_info_over_tcp_and_unix_socket(tcp_daemon: Door) -> None:
    door = tcp_daemon
    (over_tcp,) = node_ok(door.tcp, "info", env=door.env)
    # The door's settings in the environment leave the Unix socket plaintext (as the Python client does).
    (over_unix,) = node_ok(door.daemon.address, "info", env=door.env)
    assert over_tcp == over_unix
    assert over_tcp["version"]
    assert {"code", "math", "execute"} <= set(over_tcp["job_kinds"])
    assert "python" in over_tcp["languages"]
    assert over_tcp["max_timeout_seconds"] > 0
    with door.python_client() as client:
        info = client.info()
    assert over_tcp["version"] == info.version and over_tcp["languages"] == list(info.languages)


def test_run_math_and_code_jobs(tcp_daemon: Door) -> None:
    tcp, env = tcp_daemon.tcp, tcp_daemon.env
    (right,) = node_ok(tcp, "run", math_msg("so the answer is \\boxed{\\frac{1}{2}}", "0.5"), env=env)
    assert (right["status"], right["reward"]) == ("STATUS_OK", 1)
    assert right["detail"] == "math" and right["math"]["extracted_answer"] == "\\frac{1}{2}"
    assert right["attempts"] >= 1 and right["timings"]["total_seconds"] > 0

    (wrong,) = node_ok(tcp, "run", math_msg("\\boxed{3}", "4", failure_value=0.0), env=env)
    assert (wrong["status"], wrong["reward"]) == ("STATUS_WRONG_ANSWER", 0)

    (passed,) = node_ok(tcp, "run", code_msg(ADD), env=env)
    assert (passed["status"], passed["reward"]) == ("STATUS_OK", 1)
    assert (passed["code"]["tests_passed"], passed["code"]["tests_total"]) == (2, 2)
    assert [t["status"] for t in passed["tests"]] == ["STATUS_OK", "STATUS_OK"]

    (failed,) = node_ok(tcp, "run", code_msg(SUB), env=env)
    assert (failed["status"], failed["reward"]) == ("STATUS_WRONG_ANSWER", -1)
    assert failed["code"]["tests_passed"] < 2


def test_batch_streams_and_matches_the_python_client(tcp_daemon: Door) -> None:
    daemon = tcp_daemon.daemon
    slow = "import time\ntime.sleep(2)\nprint('slow')"
    messages = [
        {"limits": {"timeout_seconds": 10}, "execute": {"language": "python", "code": slow}},
        math_msg("\\boxed{4}", "4"),
        math_msg("\\boxed{5}", "4"),
        math_msg("no answer here", "4"),
        code_msg(ADD),
        code_msg(SUB),
        code_msg("no code at all"),
    ]
    results = node_ok(daemon.address, "batch", messages)
    indices = [int(r["index"]) for r in results]  # uint64 travels as a string
    assert sorted(indices) == list(range(len(messages)))
    # A stream in input order would open with the slow job. Asserting that it comes last would
    # also ask every other job to finish within its 2 s, which a loaded CI machine does not
    # promise (a cold code sandbox took longer once).
    assert indices[0] != 0, f"results did not stream as they finished: {indices}"

    with SandboxClient(daemon.address) as client:
        expected = client.score_batch([
            execute_job(slow, timeout=10),
            math_job("\\boxed{4}", "4", timeout=10),
            math_job("\\boxed{5}", "4", timeout=10),
            math_job("no answer here", "4", timeout=10),
            code_job(ADD, ADD_TESTS["stdio"], timeout=5),
            code_job(SUB, ADD_TESTS["stdio"], timeout=5),
            code_job("no code at all", ADD_TESTS["stdio"], timeout=5),
        ])  # fmt: skip
    by_index = {int(r["index"]): r for r in results}
    got = [(by_index[i]["status"], by_index[i]["reward"]) for i in range(len(messages))]
    assert got == [(f"STATUS_{r.status.name}", r.reward) for r in expected]
    assert [s for s, _ in got] == [
        "STATUS_OK", "STATUS_OK", "STATUS_WRONG_ANSWER", "STATUS_NO_ANSWER",
        "STATUS_OK", "STATUS_WRONG_ANSWER", "STATUS_NO_ANSWER",
    ]  # fmt: skip
    assert expected[0].status is Status.OK
    # bytes travel base64-encoded in proto JSON
    assert by_index[0]["execute"]["stdout"] == "c2xvdwo="  # "slow\n"


def test_bad_job_is_invalid_argument(tcp_daemon: Door) -> None:
    tcp, env = tcp_daemon.tcp, tcp_daemon.env
    no_kind = node(tcp, "run", {"limits": {"timeout_seconds": 1}}, env=env)
    assert no_kind.returncode == 1 and "INVALID_ARGUMENT" in no_kind.stderr, no_kind.stderr
    too_long = node(tcp, "run", math_msg("\\boxed{1}", "1", limits={"timeout_seconds": 1e6}), env=env)
    assert too_long.returncode == 1 and "INVALID_ARGUMENT" in too_long.stderr, too_long.stderr
    usage = node(tcp, "run", [], env=env)
    assert usage.returncode == 2 and "run takes one Job object" in usage.stderr


def test_the_door_settings_as_arguments(tcp_daemon: Door) -> None:
    door = tcp_daemon
    args = ["--token", JOBS_TOKEN, "--tls-ca", str(door.folder / "ca.pem"), "--tls-cert",
            str(door.folder / "client.pem"), "--tls-key", str(door.folder / "client.key")]
    (right,) = node_ok(door.tcp, "run", math_msg("\\boxed{4}", "4"), args=args)
    assert (right["status"], right["reward"]) == ("STATUS_OK", 1)
    results = node_ok(door.tcp, "batch", [math_msg("\\boxed{4}", "4"), code_msg(ADD)], args=args)
    assert sorted((int(r["index"]), r["status"]) for r in results) == [(0, "STATUS_OK"), (1, "STATUS_OK")]
    # The certificate checked for another name than the address: the one it carries, and one it does not.
    (info,) = node_ok(door.tcp, "info", args=[*args, "--tls-server-name", SERVER_NAME])
    assert info["version"]
    elsewhere = node(door.tcp, "info", args=[*args, "--tls-server-name", "other.test", "--retries", "0"])
    assert elsewhere.returncode == 1 and "UNAVAILABLE" in elsewhere.stderr, elsewhere.stderr


def test_the_door_refuses_a_missing_or_wrong_token_and_plaintext(tcp_daemon: Door) -> None:
    door = tcp_daemon
    tls_only = {k: v for k, v in door.env.items() if k != "SANDBOXD_TOKEN"}
    job = math_msg("\\boxed{4}", "4")
    no_token = node(door.tcp, "run", job, env=tls_only)
    assert no_token.returncode == 1 and "UNAUTHENTICATED" in no_token.stderr, no_token.stderr
    wrong = node(door.tcp, "run", job, env={**door.env, "SANDBOXD_TOKEN": "wrong-" + "5" * 32})
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr, wrong.stderr
    # No TLS settings: a plaintext client's handshake fails on the TLS port (retried, then given up).
    plaintext = node(door.tcp, "run", job, env={"SANDBOXD_TOKEN": JOBS_TOKEN}, args=["--retries", "0"])
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr, plaintext.stderr
    half = node(door.tcp, "info", env={**door.env, "SANDBOXD_TLS_KEY": ""})
    assert half.returncode == 2 and "--tls-cert and --tls-key" in half.stderr, half.stderr
    unreadable = node(door.tcp, "info", args=["--tls-ca", str(door.folder / "missing.pem")])
    assert unreadable.returncode == 2 and "cannot read --tls-ca" in unreadable.stderr, unreadable.stderr
