"""The container config sent to Docker: the hardening every sandbox gets (no engine needed)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandboxd import backend, seccomp
from sandboxd.backend import SandboxSpec, container_config


def spec() -> SandboxSpec:
    return SandboxSpec(name="s", image="sandboxd/python:x", command=["python3"], control_dir="/run/x/s",
                       code_dir="/code", labels={}, memory_bytes=1 << 30, nano_cpus=10**9, pids=256,
                       tmpfs_bytes=64 << 20)


def test_sandboxes_get_our_seccomp_profile() -> None:
    options = container_config(spec())["security_opt"]
    assert "no-new-privileges" in options
    profiles = [option.removeprefix("seccomp=") for option in options if option.startswith("seccomp=")]
    assert len(profiles) == 1
    assert json.loads(profiles[0]) == json.loads(seccomp.profile_json())
    looped = container_config(dataclasses.replace(spec(), loopback=True))["security_opt"]
    assert f"seccomp={seccomp.profile_json(loopback=True)}" in looped
    assert seccomp.profile_json(loopback=True) != seccomp.profile_json()


def test_dev_pts_is_an_empty_read_only_tmpfs() -> None:
    """Docker replaces its devpts with a mount at the same path: /dev/ptmx (a link to pts/ptmx) leads nowhere."""
    config = container_config(spec())
    pts = [mount for mount in config["mounts"] if mount["Target"] == "/dev/pts"]
    assert len(pts) == 1
    assert pts[0]["Type"] == "tmpfs" and pts[0]["ReadOnly"] is True and not pts[0]["Source"]
    assert "/dev/pts" not in config["tmpfs"]


def test_profile_key_follows_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots are keyed by it: CRIU restores a template's filter and mounts into every clone."""
    key = backend.profile_key()
    assert key == backend.profile_key()
    monkeypatch.setattr(seccomp, "profile_json", lambda **_: "{}")
    assert backend.profile_key() != key


class _StatsApi:
    """docker-py's low-level client, as far as memory_peak asks it: one stats reply, or InvalidVersion for one_shot
    (an engine before API 1.41)."""

    def __init__(self, memory: dict, one_shot: bool = True) -> None:
        self.memory, self.one_shot = memory, one_shot
        self.calls: list[bool | None] = []

    def stats(self, container: str, stream: bool = True, one_shot: bool | None = None) -> dict:
        import docker.errors

        self.calls.append(one_shot)
        if one_shot is not None and not self.one_shot:
            raise docker.errors.InvalidVersion("one_shot is not supported for API version < 1.41")
        return {"memory_stats": self.memory}


@pytest.mark.parametrize(("memory", "reading"), [
    # cgroup v1: the peak, page cache included.
    ({"usage": 40 << 20, "max_usage": 64 << 20, "limit": 64 << 20, "stats": {"cache": 20 << 20}},
     (64 << 20, 64 << 20, True)),
    # cgroup v2: no peak in Docker's stats, what the cgroup holds now.
    ({"usage": 60 << 20, "limit": 64 << 20, "stats": {"inactive_file": 1 << 20}}, (60 << 20, 64 << 20, False)),
    ({}, None),  # a container that is not running
])
def test_memory_peak_reads_the_cgroups_peak_where_the_engine_has_one(memory: dict, reading: object) -> None:
    engine = object.__new__(backend.DockerBackend)
    engine.api = _StatsApi(memory)
    assert engine.memory_peak("c") == reading
    old = object.__new__(backend.DockerBackend)
    old.api = stats = _StatsApi(memory, one_shot=False)
    assert old.memory_peak("c") == reading and stats.calls == [True, None]
