"""The daemon image run as deploy/kubernetes/ runs it: `docker run` made from the rendered DaemonSet (its
security context, mounts, variables, limits and ports), beside this host's engine, scored through from the host
over TLS with a token on 127.0.0.1, probed as kubelet probes it, and stopped as kubelet stops it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd import images, snapshots
from sandboxd.backend import LABEL_NODE
from sandboxd.daemon import LIVENESS_SERVICE, node_id
from tests.conftest import STATE_DIR, docker_available
from tests.test_auth import free_port
from tests.test_deploy import build, container, find

pytestmark = [pytest.mark.docker, pytest.mark.slow]

JOBS_TOKEN = "trainer-" + secrets.token_hex(16)
ADMIN_TOKEN = "ops-" + secrets.token_hex(16)
# The name a dns:/// client of the headless Service checks the certificate against.
SERVICE_NAME = "sandboxd.sandboxd.svc.cluster.local"
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
SUB = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
ADD_TESTS = [{"stdin": "1 2\n", "expected_stdout": "3\n"}, {"stdin": "40 2\n", "expected_stdout": "42\n"}]


@dataclass
class Pod:
    """The daemon's container, and where the host reaches its ports."""

    name: str
    ports: dict[str, str]
    folder: Path
    node: str
    snapshots: bool
    grace_seconds: int

    def logs(self) -> str:
        done = subprocess.run(["docker", "logs", self.name], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr


def write_secret(folder: Path) -> dict[str, Path]:
    """The Secret `sandboxd`'s keys as files: a server certificate for 127.0.0.1 and the Service's name, a tokens
    file of a jobs and an admin token; and the CA the host's client trusts."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", SERVICE_NAME)
    ca.cert_pem.write_to_path(folder / "ca.pem")
    leaf.private_key_pem.write_to_path(folder / "tls.key")
    for pem in leaf.cert_chain_pems:
        pem.write_to_path(folder / "tls.crt", append=True)
    (folder / "tokens").write_text(f"trainer jobs {JOBS_TOKEN}\nops admin {ADMIN_TOKEN}\n")
    for key in ("tls.key", "tls.crt", "tokens"):
        # A Secret volume's defaultMode (0400): the daemon refuses a tokens file others may read.
        os.chmod(folder / key, 0o400)
    return {"tls.crt": folder / "tls.crt", "tls.key": folder / "tls.key", "tokens": folder / "tokens"}


def docker_run_args(docs: list[dict[str, Any]], folder: Path, secret: dict[str, Path],
                    host_paths: dict[str, str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """`docker run` options that run the DaemonSet's container as kubelet would, and the host ports of its ports.

    `host_paths` moves host paths for the test (the state dir to the tests' own), kept the same inside and out, as
    the manifests keep them; `env` adds variables after the DaemonSet's.
    """
    spec = find(docs, "DaemonSet")["spec"]["template"]["spec"]
    daemon = container(docs)
    pod_security, security = spec["securityContext"], daemon["securityContext"]
    args = ["--user", f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"]
    assert security["capabilities"] == {"drop": ["ALL"]} and not security["privileged"]
    args += ["--cap-drop", "ALL"]
    if security["readOnlyRootFilesystem"]:
        args.append("--read-only")
    if not security["allowPrivilegeEscalation"]:
        args += ["--security-opt", "no-new-privileges"]
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}  # the engine's default profile
    limits = daemon["resources"]["limits"]
    memory = limits["memory"]
    assert memory.endswith("Gi")
    args += ["--memory", f"{memory.removesuffix('Gi')}g", "--cpus", str(min(float(limits["cpu"]), os.cpu_count() or 1))]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    configmap = find(docs, "ConfigMap")
    for mount in daemon["volumeMounts"]:
        volume, target = volumes[mount["name"]], mount["mountPath"]
        read_only = ":ro" if mount.get("readOnly") else ""
        if "hostPath" in volume:
            source = host_paths.get(volume["hostPath"]["path"], volume["hostPath"]["path"])
            assert target == volume["hostPath"]["path"] or target.startswith("/host/")
            target = source if target == volume["hostPath"]["path"] else target
            args += ["-v", f"{source}:{target}{read_only}"]
        elif "configMap" in volume:
            assert volume["configMap"]["name"] == configmap["metadata"]["name"]
            for key, text in configmap["data"].items():
                (folder / key).write_text(text)
                args += ["-v", f"{folder / key}:{target}/{key}:ro"]
        elif "secret" in volume:
            items = [item["key"] for item in volume["secret"]["items"]]
            if "subPath" in mount:
                args += ["-v", f"{secret[mount['subPath']]}:{target}:ro"]
            else:
                args += [arg for key in items for arg in ("-v", f"{secret[key]}:{target}/{key}:ro")]
        elif "emptyDir" in volume:
            size = volume["emptyDir"]["sizeLimit"].removesuffix("Mi")
            args += ["--tmpfs", f"{target}:size={size}m"]
        else:
            raise AssertionError(f"volume {mount['name']}: a kind this test cannot run")
    for variable in daemon["env"]:
        args += ["-e", f"{variable['name']}={host_paths.get(variable['value'], variable['value'])}"]
    for name, value in env.items():
        args += ["-e", f"{name}={value}"]
    ports = {}
    for port in daemon["ports"]:
        host_port = free_port()
        # Published on the host's loopback only.
        args += ["-p", f"127.0.0.1:{host_port}:{port['containerPort']}"]
        ports[port["name"]] = f"127.0.0.1:{host_port}"
    return [*args, daemon["image"], *daemon["args"]], ports


def health_status(address: str, service: str) -> int:
    """What kubelet's grpc probe would be told: plaintext, no token; -1 when the port does not answer."""
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                            timeout=2).status
        except grpc.RpcError:
            return -1


def engine_takes_snapshots() -> bool:
    done = subprocess.run(["docker", "version", "-f", "{{.Server.Experimental}}"], capture_output=True, text=True)
    return done.stdout.strip() == "true" and snapshots.criu_problem() == ""


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    if not docker_available():
        pytest.skip("no Docker engine: run scripts/setup.sh (make test does)")
    # The image the manifests name, tagged by the builder from this tree (a build takes about a minute, once).
    refs = images.ensure_images(["daemon"], progress=False)
    docs = build("base+snapshots")
    assert container(docs)["image"] == f"{refs['daemon'].rsplit(':', 1)[0]}:{images.DAEMON_RELEASE_TAG}"
    folder = tmp_path_factory.mktemp("pod")
    os.chmod(folder, 0o755)
    secret = write_secret(folder)
    name = f"sandboxd-test-k8s-{secrets.token_hex(4)}"
    # A run dir and socket of its own under the host's /run/sandboxd (the restore lock's folder, shared with the
    # daemons of this host as on a node), and the tests' state dir, each at the same path inside.
    run = f"/run/sandboxd/{name[-8:]}"
    socket_path = f"/run/sandboxd/{name[-8:]}.sock"
    os.makedirs(STATE_DIR, exist_ok=True)
    take_snapshots = engine_takes_snapshots()
    env = {
        "SANDBOXD_SANDBOX_STATE_DIR": STATE_DIR,
        "SANDBOXD_SANDBOX_RUN_DIR": run,
        "SANDBOXD_SERVER_SOCKET": socket_path,
        "SANDBOXD_SERVER_LOG_FORMAT": "text",
        # One warm python sandbox is all these calls need; restored from the snapshot when the engine can.
        "SANDBOXD_POOL_IMAGES": "python",
        "SANDBOXD_POOL_MATH": "false",
        "SANDBOXD_SESSIONS_ENABLED": "false",
        "SANDBOXD_POOL_MIN_SIZE": "1",
        "SANDBOXD_POOL_SNAPSHOTS": "true" if take_snapshots else "false",
        "SANDBOXD_POOL_RESTORE": "always",
    }
    args, ports = docker_run_args(docs, folder, secret, {"/var/lib/sandboxd": STATE_DIR}, env)
    subprocess.run(["docker", "run", "-d", "--name", name, *args], check=True, capture_output=True, timeout=120)
    pod = Pod(name, ports, folder, node_id(socket_path, "0.0.0.0:50051"), take_snapshots,
              find(docs, "DaemonSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
    try:
        deadline = time.monotonic() + 240
        while health_status(ports["health"], "") != health_pb2.HealthCheckResponse.SERVING:
            state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                                   text=True).stdout.strip()
            if state != "true" or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon's container is not ready ({state}):\n{pod.logs()[-3000:]}")
            time.sleep(0.5)
        yield pod
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
        leftovers = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL_NODE}={pod.node}"],
                                   capture_output=True, text=True).stdout.split()
        if leftovers:
            subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True, timeout=120)
        shutil.rmtree(run, ignore_errors=True)


def client(pod: Pod, token: str | None) -> Any:
    from sandboxd_client import SandboxClient

    return SandboxClient(pod.ports["grpc"], token=token, tls_ca=str(pod.folder / "ca.pem"), max_retries=0)


def test_the_image_scores_through_tls_and_a_token_from_the_host(pod: Pod) -> None:
    from sandboxd_client import SandboxdError, code_job, execute_job

    assert health_status(pod.ports["health"], LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
    with client(pod, JOBS_TOKEN) as trainer:
        results = trainer.score_batch([code_job(ADD, ADD_TESTS, timeout=5), code_job(SUB, ADD_TESTS, timeout=5),
                                       execute_job("print(6 * 7)", timeout=10)])
        assert [result.reward for result in results[:2]] == [1.0, -1.0], results
        assert results[2].ok and results[2].details.stdout == b"42\n", results[2]
        status = {pool.name: pool for pool in trainer.pool_status().pools}
    if pod.snapshots:
        # Checkpointed and restored by the host's engine at the daemon's paths, from inside the container.
        assert status["python"].snapshot == "ready" and status["python"].start_method == "restore", status
    with client(pod, None) as anonymous, pytest.raises(SandboxdError) as refused:
        anonymous.info()
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    with client(pod, JOBS_TOKEN) as trainer, pytest.raises(SandboxdError) as refused:
        trainer.set_batch_hint(4)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    with urllib.request.urlopen(f"http://{pod.ports['metrics']}/metrics", timeout=10) as scrape:
        text = scrape.read().decode()
    assert 'sandboxd_auth_calls_total{result="ok",token="trainer"}' in text
    # The health port serves nothing else: a job sent there is not answered.
    with grpc.insecure_channel(pod.ports["health"]) as channel:
        from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
        from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

        with pytest.raises(grpc.RpcError) as unanswered:
            pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5)
    assert unanswered.value.code() == grpc.StatusCode.UNIMPLEMENTED
    stats = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{json .}}", pod.name],
                           capture_output=True, text=True, timeout=60).stdout
    print(f"daemon container: {json.loads(stats)['MemUsage']}")


def test_sigterm_drains_and_leaves_no_sandbox_behind(pod: Pod) -> None:
    """kubelet's stop: SIGTERM, then SIGKILL after terminationGracePeriodSeconds. A batch in flight is answered,
    health turns NOT_SERVING (the pod leaves the Service), and the daemon removes its sandboxes and exits 0."""
    import threading

    from sandboxd_client import execute_job

    assert subprocess.run(["docker", "ps", "-q", "--filter", f"label={LABEL_NODE}={pod.node}"],
                          capture_output=True, text=True).stdout.split()
    results: list[Any] = []
    with client(pod, JOBS_TOKEN) as trainer:
        batch = threading.Thread(target=lambda: results.extend(trainer.score_batch(
            [execute_job("import time; time.sleep(2); print(1)", timeout=20) for _ in range(2)])))
        batch.start()
        time.sleep(1)
        stop = subprocess.Popen(["docker", "stop", "-t", str(pod.grace_seconds), pod.name])
        batch.join(timeout=120)
        assert stop.wait(timeout=pod.grace_seconds + 30) == 0
    assert [result.ok for result in results] == [True, True], results
    exit_code = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", pod.name], capture_output=True,
                               text=True).stdout.strip()
    logs = pod.logs()
    assert exit_code == "0", logs[-3000:]
    assert "shutting down: draining for up to 60 s" in logs and logs.rstrip().endswith("stopped"), logs[-3000:]
    assert subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL_NODE}={pod.node}"],
                          capture_output=True, text=True).stdout.split() == []
