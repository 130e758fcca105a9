"""StartChooser: which way a pool starts its next sandbox (pure logic; restores themselves are integration tests)."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import pytest

from sandboxd.config import GIB, MIB
from sandboxd.snapshots import SnapshotStore, StartChooser, memory_too_tight


def measured(chooser: StartChooser, restore: float, cold: float) -> None:
    """Let the chooser try both methods once, as a pool's first two starts do, and record their times."""
    first, second = chooser.choose(True), chooser.choose(True)
    assert (first, second) == ("restore", "cold")
    chooser.record("restore", restore)
    chooser.record("cold", cold)


def test_without_a_usable_snapshot_every_start_is_cold() -> None:
    for policy in ("auto", "always"):
        chooser = StartChooser(policy)
        assert [chooser.choose(False) for _ in range(5)] == ["cold"] * 5
        assert chooser.method(False) == "cold"


def test_the_summary_says_which_method_is_not_measured_yet() -> None:
    """The log line that announced a pool's first cold start said "restore 0.00 s"."""
    chooser = StartChooser("auto")
    assert chooser.summary() == "restore not measured yet, cold not measured yet"
    chooser.record("cold", 0.614)
    assert chooser.summary() == "restore not measured yet, cold 0.61 s"
    chooser.record("restore", 0.9)
    chooser.record("restore", 1.1)
    assert chooser.summary() == "restore 1.00 s, cold 0.61 s"


def test_always_restores_whatever_the_times() -> None:
    chooser = StartChooser("always")
    chooser.record("restore", 5.0)
    chooser.record("cold", 0.1)
    assert [chooser.choose(True) for _ in range(40)] == ["restore"] * 40
    assert chooser.method(True) == "restore"


def test_auto_tries_both_then_keeps_the_quicker_and_probes_the_other() -> None:
    chooser = StartChooser("auto", probe_every=8)
    measured(chooser, restore=0.97, cold=0.31)
    assert chooser.method(True) == "cold"
    picks = [chooser.choose(True) for _ in range(30)]
    # Choices 8, 16, 24 and 32 (counting the two first tries) go to the slower method.
    assert [i for i, pick in enumerate(picks, start=3) if pick == "restore"] == [8, 16, 24, 32]
    assert picks.count("cold") == 26


def test_auto_restores_where_restores_are_quicker() -> None:
    chooser = StartChooser("auto", probe_every=8)
    measured(chooser, restore=0.4, cold=4.6)
    assert chooser.method(True) == "restore"
    assert [chooser.choose(True) for _ in range(5)] == ["restore"] * 5


def test_the_choice_follows_recent_starts() -> None:
    chooser = StartChooser("auto", recent=3)
    measured(chooser, restore=0.5, cold=1.0)
    assert chooser.preferred == "restore"
    # The node gets slower to restore (load, a bigger snapshot): three slow restores outvote the past.
    for seconds in (2.0, 2.1, 2.2):
        chooser.record("restore", seconds)
    assert chooser.median("restore") == pytest.approx(2.1)
    assert chooser.preferred == "cold"


def test_a_method_not_measured_yet() -> None:
    chooser = StartChooser("auto")
    assert chooser.preferred == "restore"
    assert chooser.median("restore") == chooser.median("cold") == 0.0
    assert chooser.choose(True) == "restore"
    # The first restore is still starting (or failed): the cold try comes next all the same,
    # and with only a cold start measured, that is the method known to work.
    assert chooser.choose(True) == "cold"
    chooser.record("cold", 0.3)
    assert chooser.preferred == "cold"


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown restore policy"):
        StartChooser("sometimes")


def test_the_snapshot_key_covers_the_sandbox_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restored process keeps the template's seccomp filter and mounts: another profile needs another snapshot."""
    from sandboxd import snapshots

    key = SnapshotStore.key({"image": "i"})
    assert SnapshotStore.key({"image": "i"}) == key
    monkeypatch.setattr(snapshots, "profile_key", lambda: "another profile")
    assert SnapshotStore.key({"image": "i"}) != key


def test_a_store_that_cannot_be_written_fails_the_snapshot_not_the_pool(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ENOSPC or EROFS on the store's own files raised out of prepare() and ended the pool's upkeep: the pool
    never started a sandbox. Now the snapshot fails, the log says why, and the pool starts cold."""
    from sandboxd import snapshots

    monkeypatch.setattr(snapshots, "criu_problem", lambda: "")
    (tmp_path / "state").write_text("a file where the state dir's snapshots folder should go")
    backend = types.SimpleNamespace(experimental=True)
    store = SnapshotStore(backend, str(tmp_path / "state"), True, str(tmp_path), pool="python")  # type: ignore[arg-type]
    assert store.state == "building" and not store.problem

    async def never() -> str:
        raise AssertionError("no template is started for a store that cannot be written")

    asyncio.run(store.prepare("key", never))
    assert store.state.startswith("failed: the snapshot store") and not store.usable
    assert "pool python: snapshot failed: the snapshot store" in caplog.text
    assert "its sandboxes start cold, and it is built again in 300 s" in caplog.text


def test_the_rebuild_pause_doubles_from_the_configured_one_up_to_six_hours() -> None:
    from sandboxd.snapshots import retry_pause

    assert [retry_pause(n, 300.0) for n in (1, 2, 3)] == [300.0, 600.0, 1200.0]
    assert retry_pause(8, 300.0) == retry_pause(10**6, 300.0) == 6 * 3600.0
    assert retry_pause(1, 86400.0) == 86400.0  # a pause configured above the cap is kept


class _CheckpointingBackend:
    """The two engine calls a build makes, recorded; the first `broken` checkpoints fail."""

    experimental = True

    def __init__(self, broken: int, memory: tuple[int, int, bool] | None = None) -> None:
        self.broken = broken
        # What memory_peak says of every template: (bytes held, limit, whether a peak); None: nothing.
        self.memory = memory
        self.checkpoints: list[str] = []
        self.removed: list[str] = []

    def memory_peak(self, container_id: str) -> tuple[int, int, bool] | None:
        return self.memory

    def checkpoint(self, container_id: str, name: str, folder: str, *, exit_after: bool) -> None:
        self.checkpoints.append(container_id)
        if len(self.checkpoints) <= self.broken:
            raise RuntimeError("criu dump failed (a moment the engine was busy)")
        (Path(folder) / name).mkdir()

    def remove(self, container_id: str) -> None:
        self.removed.append(container_id)


def test_a_failed_snapshot_is_built_again_after_its_pause(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint that failed once left the pool starting cold for the daemon's life."""
    from sandboxd import snapshots

    monkeypatch.setattr(snapshots, "criu_problem", lambda: "")
    backend = _CheckpointingBackend(broken=2)
    store = SnapshotStore(backend, str(tmp_path / "state"), True, str(tmp_path),  # type: ignore[arg-type]
                          pool="python", retry_seconds=60.0)
    templates = iter(f"template{i}" for i in range(10))

    async def template() -> str:
        return next(templates)

    asyncio.run(store.prepare("key", template))
    assert store.state == "failed: checkpoint failed: criu dump failed (a moment the engine was busy)"
    assert store.failures == 1 and not store.usable and not store.retry_due
    assert store.retry_at is not None and 59 < store.retry_at - snapshots.time.monotonic() <= 60
    assert "its sandboxes start cold, and it is built again in 60 s" in caplog.text
    asyncio.run(store.prepare("key", template))  # the pause is not over: no template started
    assert backend.checkpoints == ["template0"]

    store.retry_at = snapshots.time.monotonic()  # the pause is over
    assert store.retry_due
    asyncio.run(store.prepare("key", template))
    assert store.failures == 2 and 119 < store.retry_at - snapshots.time.monotonic() <= 120
    store.retry_at = snapshots.time.monotonic()
    asyncio.run(store.prepare("key", template))
    assert store.usable and store.state == "ready" and (store.failures, store.problem, store.retry_at) == (0, "", None)
    assert store.path == tmp_path / "state" / "snapshots" / "key" / "warm"
    assert backend.checkpoints == backend.removed == ["template0", "template1", "template2"]

    store.fail("restore failed 3 times: no such checkpoint")  # a restore failure starts the count again
    assert store.failures == 1 and not store.usable and not (tmp_path / "state" / "snapshots" / "key").exists()


def test_a_disabled_snapshot_is_never_built(tmp_path: Path) -> None:
    store = SnapshotStore(_CheckpointingBackend(broken=0), str(tmp_path), False, str(tmp_path))  # type: ignore[arg-type]

    async def never() -> str:
        raise AssertionError("no template for a disabled snapshot")

    store.retry_at = 0.0
    asyncio.run(store.prepare("key", never))
    assert store.state == "disabled: disabled in configuration" and store.failures == 0


def test_a_daemon_in_a_container_can_leave_criu_to_the_engines_host(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """pool.criu_check = false (deploy/kubernetes/): no criu in the daemon's container disables nothing; the
    first checkpoint tells whether the engine's host can take it."""
    from sandboxd import snapshots

    monkeypatch.setattr(snapshots, "criu_problem", lambda: "criu is not installed")
    backend = _CheckpointingBackend(broken=0)
    checked = SnapshotStore(backend, str(tmp_path), True, str(tmp_path))  # type: ignore[arg-type]
    assert checked.state == "disabled: criu is not installed"
    trusted = SnapshotStore(backend, str(tmp_path), True, str(tmp_path), check_criu=False)  # type: ignore[arg-type]
    assert trusted.state == "building" and not trusted.disabled

    async def template() -> str:
        return "template"

    asyncio.run(trusted.prepare("key", template))
    assert trusted.usable and backend.checkpoints == ["template"]


@pytest.mark.parametrize(("held", "limit", "tight"), [
    (64 * MIB, 64 * MIB, True),  # the math template under 64 MiB: at the limit, its restores OOM-killed in CRIU
    (49 * MIB, 64 * MIB, True),  # over 3/4 of the limit
    (48 * MIB, 64 * MIB, False),  # 3/4 exactly: a quarter left for the restore
    (66 * MIB, 2 * GIB, False),  # the math template under the default 2 GiB
    (66 * MIB, 0, False),  # no limit
])
def test_a_template_close_to_its_memory_limit_is_too_tight_to_snapshot(held: int, limit: int, tight: bool) -> None:
    assert bool(memory_too_tight(held, limit)) is tight


def test_the_reason_says_what_the_template_held_and_whether_that_was_its_peak() -> None:
    assert memory_too_tight(64 * MIB, 64 * MIB).startswith("the template peaked at 64.0 MiB of its 64.0 MiB memory "
                                                            "limit, over 75% of it: a CRIU restore needs room")
    assert memory_too_tight(60 * MIB, 64 * MIB, peak=False).startswith("the template held 60.0 MiB of its 64.0 MiB")


def test_a_template_too_close_to_its_memory_limit_is_not_snapshotted_and_that_is_logged_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A math template that fitted a 64 MiB sandbox only at its limit was snapshotted; every restore then was
    OOM-killed inside CRIU or hung `criu restore` and the engine for minutes. Its pool starts cold for good."""
    from sandboxd import snapshots

    monkeypatch.setattr(snapshots, "criu_problem", lambda: "")
    backend = _CheckpointingBackend(broken=0, memory=(64 * MIB, 64 * MIB, True))
    store = SnapshotStore(backend, str(tmp_path / "state"), True, str(tmp_path), pool="math")  # type: ignore[arg-type]
    templates = iter(f"template{i}" for i in range(10))

    async def template() -> str:
        return next(templates)

    asyncio.run(store.prepare("key", template))
    assert store.disabled and not store.usable and store.retry_at is None
    assert store.state == f"disabled: {memory_too_tight(64 * MIB, 64 * MIB)}"
    assert backend.checkpoints == [] and backend.removed == ["template0"]
    assert not (tmp_path / "state" / "snapshots" / "key").exists()
    store.retry_at = 0.0
    asyncio.run(store.prepare("key", template))  # never built again: no second template, no second line
    assert backend.removed == ["template0"]
    assert caplog.text.count("pool math: no snapshot: the template peaked at 64.0 MiB") == 1
    assert "its sandboxes start cold" in caplog.text

    roomy = _CheckpointingBackend(broken=0, memory=(66 * MIB, 2 * GIB, True))
    store = SnapshotStore(roomy, str(tmp_path / "state"), True, str(tmp_path), pool="math")  # type: ignore[arg-type]
    asyncio.run(store.prepare("key", template))
    assert store.usable and roomy.checkpoints == ["template1"]
