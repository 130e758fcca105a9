"""deploy/kubernetes/: every build validates against the Kubernetes schemas offline, passes checkov, and agrees
with the daemon's own configuration (ports, probes, host paths, drain); the image it names is the builder's."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandboxd import config as config_module
from sandboxd import images
from sandboxd.daemon import LIVENESS_SERVICE
from sandboxd.snapshots import RESTORE_LOCK
from tests.conftest import skip_or_fail

try:
    import jsonpatch
    import kubernetes_validate
except ImportError as missing:
    skip_or_fail(f"{missing.name} is not installed: the test extra has it (scripts/setup.sh)", module=True)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
DOCS = REPO / "docs" / "deploy.md"
# What each build is made of: a kustomization folder and the components added to it.
BUILDS = {
    "base": ("base", ()),
    "fleet": ("overlays/fleet", ()),
    "base+snapshots": ("base", ("components/snapshots",)),
    "fleet+snapshots": ("overlays/fleet", ("components/snapshots",)),
}
# The oldest release whose grpc probes are GA (1.27), and the newest the schemas know.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
# The fields of a kustomization that render() understands; one it does not know is an error, not skipped.
KUSTOMIZE_FIELDS = {"apiVersion", "kind", "resources", "components", "patches"}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _patch(folder: Path, kustomization: dict[str, Any], docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for patch in kustomization.get("patches", []):
        target, operations = patch["target"], _load(folder / patch["path"])
        hits = 0
        for index, doc in enumerate(docs):
            group, _, version = doc["apiVersion"].rpartition("/")
            if (doc["kind"], doc["metadata"]["name"], group, version) == (
                    target["kind"], target["name"], target.get("group", ""), target.get("version", version)):
                docs[index] = jsonpatch.apply_patch(doc, operations)
                hits += 1
        assert hits == 1, f"{folder / patch['path']}: its target {target} matches {hits} resources"
    return docs


def render(folder: Path, components: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """What `kustomize build` makes of `folder` with `components` added, for the fields deploy/kubernetes uses:
    resources (files and folders), components and RFC 6902 patches by target."""
    kustomization = _load(folder / "kustomization.yaml")
    assert set(kustomization) <= KUSTOMIZE_FIELDS, f"{folder}: fields this test cannot render"
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        docs += render(path) if path.is_dir() else [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for component in (*(folder / entry for entry in kustomization.get("components", [])), *components):
        docs = _patch(component, _load(component / "kustomization.yaml"), docs)
    return _patch(folder, kustomization, docs)


def build(name: str) -> list[dict[str, Any]]:
    folder, components = BUILDS[name]
    return render(DEPLOY / folder, tuple(DEPLOY / component for component in components))


def find(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (daemon,) = find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return daemon


def daemon_config(docs: list[dict[str, Any]], folder: Path) -> config_module.Config:
    """The daemon's effective configuration in the pod: the ConfigMap's file and the container's variables."""
    toml = find(docs, "ConfigMap")["data"]["sandboxd.toml"]
    (folder / "sandboxd.toml").write_text(toml)
    environ = {env["name"]: env["value"] for env in container(docs).get("env", [])}
    assert environ.pop("SANDBOXD_CONFIG") == "/etc/sandboxd/config/sandboxd.toml"
    return config_module.load(folder / "sandboxd.toml", environ=environ)


def mounts(docs: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """The container's mounts by path: (its volumeMount, its volume)."""
    volumes = {volume["name"]: volume for volume in find(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    return {mount["mountPath"]: (mount, volumes[mount["name"]]) for mount in container(docs)["volumeMounts"]}


def host_path_at(docs: list[dict[str, Any]], path: str) -> tuple[str, str]:
    """(the host path, the mount path) of the host-path mount `path` lies under (the deepest)."""
    found = [(mount_path, volume["hostPath"]["path"]) for mount_path, (_, volume) in mounts(docs).items()
             if "hostPath" in volume and (path == mount_path or path.startswith(mount_path.rstrip("/") + "/"))]
    assert found, f"{path} is on no host path"
    mount_path, host = max(found, key=lambda pair: len(pair[0]))
    return host, mount_path


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", BUILDS)
def test_every_build_validates_against_the_kubernetes_schemas(name: str, version: str) -> None:
    docs = build(name)
    assert {doc["kind"] for doc in docs} >= {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service",
                                            "PodDisruptionBudget", "NetworkPolicy"}
    for doc in docs:
        # strict: a field the schema does not know (a typo, a field of a newer release) is an error too.
        kubernetes_validate.validate(doc, version, strict=True)


def test_an_invalid_manifest_is_caught() -> None:
    """The check above can fail: a misspelt field and a probe port given as a name (grpc probes take numbers)."""
    daemon_set = find(build("base"), "DaemonSet")
    spec = daemon_set["spec"]["template"]["spec"]
    spec["containers"][0]["readinessProbe"]["grpc"]["port"] = "health"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemon_set, KUBERNETES_VERSIONS[0], strict=True)
    spec["containers"][0]["readinessProbe"]["grpc"]["port"] = 8081
    spec["terminationGracePeriod"] = 180
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemon_set, KUBERNETES_VERSIONS[0], strict=True)


def test_every_manifest_file_is_part_of_a_build() -> None:
    """A file no kustomization names is checked by nothing here, and applied by no one."""
    named: set[Path] = set()
    for folder in {DEPLOY / part for build_folder, components in BUILDS.values()
                   for part in (build_folder, *components)} | {DEPLOY / "base"}:
        kustomization = _load(folder / "kustomization.yaml")
        named.add(folder / "kustomization.yaml")
        named |= {folder / entry for entry in kustomization.get("resources", []) if (folder / entry).is_file()}
        named |= {folder / patch["path"] for patch in kustomization.get("patches", [])}
    assert set(DEPLOY.rglob("*.yaml")) == named


@pytest.mark.parametrize("name", BUILDS)
def test_the_configuration_loads_and_the_probes_ports_and_drain_agree_with_it(name: str, tmp_path: Path) -> None:
    docs = build(name)
    config = daemon_config(docs, tmp_path)
    daemon = container(docs)
    ports = {port["name"]: port["containerPort"] for port in daemon["ports"]}
    assert ports == {"grpc": config_module.split_address(config.server.tcp)[1],
                     "health": config_module.split_address(config.server.health)[1],
                     "metrics": config_module.split_address(config.server.metrics)[1]}
    # A pod is reached on its own address: every listener on all interfaces.
    assert {config_module.split_address(address)[0] for address in
            (config.server.tcp, config.server.health, config.server.metrics)} == {"0.0.0.0"}
    # kubelet's grpc probes speak plaintext and carry no token: the health listener, never the TLS one.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert daemon[probe]["grpc"]["port"] == ports["health"], probe
    assert daemon["startupProbe"]["grpc"]["service"] == daemon["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    assert "service" not in daemon["readinessProbe"]["grpc"]  # "": SERVING once the pools are warm
    template = find(docs, "DaemonSet")["spec"]["template"]
    assert template["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                                                   "prometheus.io/port": str(ports["metrics"])}
    # SIGTERM: the batches in flight get grace_seconds, the engine calls in flight docker.timeout_seconds, and
    # the sandboxes' removal the rest; kubelet's SIGKILL must not cut the drain short.
    assert template["spec"]["terminationGracePeriodSeconds"] >= (
        config.server.grace_seconds + config.docker.timeout_seconds + 60)
    assert config.server.tls_cert and config.server.tokens_file and not config.server.insecure_tcp


@pytest.mark.parametrize("name", BUILDS)
def test_the_engine_sees_the_daemons_folders_at_the_same_paths(name: str, tmp_path: Path) -> None:
    """The engine bind-mounts folders of the state and run dirs into the sandboxes by the paths the daemon names:
    each must be a host path mounted at the same path in the pod."""
    docs = build(name)
    config = daemon_config(docs, tmp_path)
    socket_path = config.docker.url.removeprefix("unix://")
    shared = [config.sandbox.state_dir, config.sandbox.run_dir, config.server.socket, str(RESTORE_LOCK), socket_path]
    for path in shared:
        host, mount_path = host_path_at(docs, path)
        assert host == mount_path, f"{path}: host path {host} mounted at {mount_path}"
    assert mounts(docs)[socket_path][1]["hostPath"]["type"] == "Socket"
    if config.pool.snapshots:
        # Each restored clone gets a copy of the snapshot in the engine's folder of that container.
        host, mount_path = host_path_at(docs, "/var/lib/docker/containers/x/checkpoints")
        assert host == mount_path == "/var/lib/docker/containers"
        # containerd's copies of each restore, removed by the daemon: the engine's temporary folder (/tmp).
        assert host_path_at(docs, config.docker.temp_dir) == ("/tmp", config.docker.temp_dir)
        assert not config.pool.criu_check  # no criu in the daemon's container; the engine's host has it
    else:
        assert not any(path.startswith("/var/lib/docker") for path in mounts(docs))


@pytest.mark.parametrize("name", BUILDS)
def test_the_secret_is_mounted_as_the_files_the_daemon_reads(name: str, tmp_path: Path) -> None:
    docs = build(name)
    config = daemon_config(docs, tmp_path)
    found = mounts(docs)
    # A Secret's files are links into its ..data folder, and the daemon opens its tokens file without following
    # links: a subPath mount makes it a file. Its mode must let no group or other in (auth.load_tokens).
    mount, volume = found[config.server.tokens_file]
    assert mount["subPath"] == "tokens" and mount["readOnly"]
    assert volume["secret"]["defaultMode"] & 0o077 == 0
    for path in (config.server.tls_cert, config.server.tls_key):
        folder, file = path.rsplit("/", 1)
        mount, volume = found[folder]
        assert mount["readOnly"] and file in {item["path"] for item in volume["secret"]["items"]}
        assert volume["secret"]["secretName"] == found[config.server.tokens_file][1]["secret"]["secretName"]


@pytest.mark.parametrize("name", BUILDS)
def test_service_budget_and_policy_select_the_daemons_and_their_ports(name: str) -> None:
    docs = build(name)
    labels = find(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    ports = {port["name"]: port["containerPort"] for port in container(docs)["ports"]}
    service = find(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"  # headless: dns:/// clients see each daemon
    assert service["spec"]["selector"].items() <= labels.items()
    assert {port["name"]: port["port"] for port in service["spec"]["ports"]} == {
        "grpc": ports["grpc"], "metrics": ports["metrics"]}
    assert find(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    policy = find(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["egress"] == []
    admitted = {rule["ports"][0]["port"]: rule["from"] for rule in policy["ingress"]}
    assert admitted == {
        ports["grpc"]: [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"sandboxd.io/client": "true"}}}],
        ports["metrics"]: [{"namespaceSelector": {"matchLabels": {"sandboxd.io/metrics": "true"}}}]}
    namespaces = {doc["metadata"].get("namespace") for doc in docs if doc["kind"] != "Namespace"}
    assert namespaces == {find(docs, "Namespace")["metadata"]["name"]}


def test_the_manifests_run_the_daemon_image_the_builder_tags() -> None:
    for name in BUILDS:
        assert container(build(name))["image"] == f"sandboxd/daemon:{images.DAEMON_RELEASE_TAG}"
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == images.DAEMON_RELEASE_TAG


def checkov_skips(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The checks the manifests skip, with each reason: checkov.io/skip* annotations, `CHECK=reason`."""
    skips: dict[str, str] = {}
    for doc in docs:
        for key, value in (doc["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                skips[check] = reason
    return skips


def test_checkov_finds_nothing_that_is_not_justified(tmp_path: Path) -> None:
    if not CHECKOV.exists():
        skip_or_fail("no checkov (.venv-checkov): run scripts/setup.sh (make test does)")
    skips: dict[str, str] = {}
    for name in BUILDS:
        docs = build(name)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(docs))
        skips |= checkov_skips(docs)
    # One run for every build: checkov takes about 5 s to start.
    done = subprocess.run([str(CHECKOV), "--directory", str(tmp_path), "--framework", "kubernetes", "--output",
                           "json", "--compact", "--skip-download"], capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout)
    results = report["results"]
    failed = [(check["check_id"], check["check_name"], check["resource"], Path(check["file_path"]).name)
              for check in results["failed_checks"]]
    assert failed == [], failed
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["summary"]["passed"] > 100  # it did look
    # Every skip carries its reason, and docs/deploy.md's table lists it.
    assert {check["check_id"] for check in results["skipped_checks"]} == set(skips)
    table = DOCS.read_text()
    for check, reason in skips.items():
        assert len(reason) > 20, f"{check}: no reason given"
        assert re.search(rf"^\| `{check}` \|", table, re.M), f"{check} is not in docs/deploy.md's table"
