"""Red-team attacks on the agent's session code that need no sandbox (the real ones: integration)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sandboxd.agent.host import tree
from sandboxd.agent.host.sessions import scan


class _SwapAfterLooking:
    """os.stat that, once the walk has looked at `target` in its folder, swaps `target` for a link to `elsewhere`.

    What a session's background process does with renameat2(RENAME_EXCHANGE) in a loop, at the worst moment:
    after the scan saw `target` as a folder, before it opened it.
    """

    def __init__(self, real: Any, target: Path, elsewhere: Path) -> None:
        self.real, self.target, self.elsewhere = real, target, elsewhere
        self.done = False

    def __call__(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        info = self.real(path, *args, **kwargs)
        dir_fd = kwargs.get("dir_fd")
        if not self.done and dir_fd is not None and path == self.target.name and os.path.samestat(
                self.real(dir_fd), self.real(self.target.parent)):
            self.done = True
            os.rename(self.target, self.target.with_name("moved"))
            os.symlink(self.elsewhere, self.target)
        return info


@pytest.mark.parametrize("swapped", ["d", "d/inner"])
def test_scan_does_not_follow_a_folder_swapped_for_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          swapped: str) -> None:
    """files_changed listed a neighbour's file names: a folder the scan had listed was swapped for a link to the
    neighbour's folder before the scan opened it (red-team). A folder is now opened by its name in the one above,
    without following a link, and walked only if it is, by device and inode, the one its parent listed."""
    neighbour = tmp_path / "neighbour"
    (neighbour / "inner").mkdir(parents=True)
    (neighbour / "TOPSECRET.txt").write_text("x")
    (neighbour / "inner" / "TOPSECRET2.txt").write_text("x")
    work = tmp_path / "work"
    (work / "d" / "inner").mkdir(parents=True)
    (work / "d" / "inner" / "mine.txt").write_text("m")
    swapper = _SwapAfterLooking(os.stat, work / swapped, neighbour)
    monkeypatch.setattr(tree.os, "stat", swapper)
    found = scan(str(work))
    assert swapper.done
    assert not [path for path in found if "TOPSECRET" in path], found


def test_scan_still_finds_what_a_session_made(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.txt").write_text("deep")
    (tmp_path / "top.txt").write_text("t")
    os.symlink("/etc", tmp_path / "a" / "link")
    assert sorted(scan(str(tmp_path))) == ["a/b/deep.txt", "a/link", "top.txt"]


def test_scan_of_a_workdir_that_is_a_link_finds_nothing(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f.txt").write_text("f")
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert scan(str(tmp_path / "link")) == {}
