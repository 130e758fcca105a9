"""A non-Python client against a real daemon: ``examples/node/sandboxd.js`` (Node.js, @grpc/grpc-js).

The Node client loads ``protos/sandboxd/v1/sandboxd.proto`` at run time with
@grpc/proto-loader: no generated code and nothing from the Python client. It
calls ``Daemon.GetInfo``, ``Jobs.Run`` and the streaming ``Jobs.RunBatch`` over
TCP and over the Unix socket of one daemon, and its answers are checked against
what the Python client gets for the same jobs.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandboxd_client import SandboxClient, Status, code_job, execute_job, math_job

from tests.conftest import DaemonProcess, docker_available, skip_or_fail

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


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    """One daemon listening on a Unix socket and on 127.0.0.1:<port>; yields it and "127.0.0.1:<port>"."""
    _node()
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    tcp = f"127.0.0.1:{_free_port()}"
    process = DaemonProcess(tmp_path_factory.mktemp("node"), "n", tcp=tcp)
    try:
        process.wait_serving()
        yield process, tcp
    finally:
        process.stop()


def node(address: str, command: str, payload: Any = None, *, deadline: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_node(), str(SCRIPT), "--address", address, "--deadline", str(deadline), command],
        input=None if payload is None else json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=deadline + 30,
        env={**os.environ, "SANDBOXD_ADDRESS": ""},
    )


def node_ok(address: str, command: str, payload: Any = None) -> list[dict[str, Any]]:
    done = node(address, command, payload)
    assert done.returncode == 0, (done.returncode, done.stderr)
    return [json.loads(line) for line in done.stdout.splitlines()]


def math_msg(completion: str, ground_truth: str, **job: Any) -> dict[str, Any]:
    return {"limits": {"timeout_seconds": 10}, "math": {"completion": completion, "ground_truth": ground_truth}, **job}


def code_msg(completion: str, **job: Any) -> dict[str, Any]:
    return {"limits": {"timeout_seconds": 5}, "code": {"completion": completion, "tests": ADD_TESTS}, **job}


def test_get_info_over_tcp_and_unix_socket(tcp_daemon: tuple[DaemonProcess, str]) -> None:
    daemon, tcp = tcp_daemon
    (over_tcp,) = node_ok(tcp, "info")
    (over_unix,) = node_ok(daemon.address, "info")
    assert over_tcp == over_unix
    assert over_tcp["version"]
    assert {"code", "math", "execute"} <= set(over_tcp["job_kinds"])
    assert "python" in over_tcp["languages"]
    assert over_tcp["max_timeout_seconds"] > 0
    with SandboxClient(tcp) as client:
        info = client.info()
    assert over_tcp["version"] == info.version and over_tcp["languages"] == list(info.languages)


def test_run_math_and_code_jobs(tcp_daemon: tuple[DaemonProcess, str]) -> None:
    _, tcp = tcp_daemon
    (right,) = node_ok(tcp, "run", math_msg("so the answer is \\boxed{\\frac{1}{2}}", "0.5"))
    assert (right["status"], right["reward"]) == ("STATUS_OK", 1)
    assert right["detail"] == "math" and right["math"]["extracted_answer"] == "\\frac{1}{2}"
    assert right["attempts"] >= 1 and right["timings"]["total_seconds"] > 0

    (wrong,) = node_ok(tcp, "run", math_msg("\\boxed{3}", "4", failure_value=0.0))
    assert (wrong["status"], wrong["reward"]) == ("STATUS_WRONG_ANSWER", 0)

    (passed,) = node_ok(tcp, "run", code_msg(ADD))
    assert (passed["status"], passed["reward"]) == ("STATUS_OK", 1)
    assert (passed["code"]["tests_passed"], passed["code"]["tests_total"]) == (2, 2)
    assert [t["status"] for t in passed["tests"]] == ["STATUS_OK", "STATUS_OK"]

    (failed,) = node_ok(tcp, "run", code_msg(SUB))
    assert (failed["status"], failed["reward"]) == ("STATUS_WRONG_ANSWER", -1)
    assert failed["code"]["tests_passed"] < 2


def test_batch_streams_and_matches_the_python_client(tcp_daemon: tuple[DaemonProcess, str]) -> None:
    daemon, _ = tcp_daemon
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


def test_bad_job_is_invalid_argument(tcp_daemon: tuple[DaemonProcess, str]) -> None:
    _, tcp = tcp_daemon
    no_kind = node(tcp, "run", {"limits": {"timeout_seconds": 1}})
    assert no_kind.returncode == 1 and "INVALID_ARGUMENT" in no_kind.stderr, no_kind.stderr
    too_long = node(tcp, "run", math_msg("\\boxed{1}", "1", limits={"timeout_seconds": 1e6}))
    assert too_long.returncode == 1 and "INVALID_ARGUMENT" in too_long.stderr, too_long.stderr
    usage = node(tcp, "run", [])
    assert usage.returncode == 2 and "run takes one Job object" in usage.stderr
