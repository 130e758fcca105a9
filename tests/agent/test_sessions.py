"""Pieces of the agent's sessions that need no sandbox: file change tracking and the bash state wrapper."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandboxd.agent.sessions import BASH_STATE_FILE, BASH_WRAPPER, changed_files, scan


def test_changed_files_lists_created_modified_and_deleted(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("same")
    (tmp_path / "edit.txt").write_text("old")
    (tmp_path / "gone.txt").write_text("x")
    before = scan(str(tmp_path))
    (tmp_path / "edit.txt").write_text("new content")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("n")
    (tmp_path / BASH_STATE_FILE).write_text("state is not the session's file")
    assert changed_files(before, scan(str(tmp_path))) == ["edit.txt", "gone.txt", "sub/new.txt"]


def test_scan_does_not_follow_links(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big.txt").write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(tmp_path / "outside", work / "link")
    assert list(scan(str(work))) == ["link"]


def _cell(folder: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", BASH_WRAPPER, "sandboxd-session",
                           str(folder / BASH_STATE_FILE)], input=code, capture_output=True, text=True,
                          cwd=folder, env={"PATH": os.environ["PATH"], "HOME": str(folder)}, timeout=30)


def test_bash_state_survives_between_processes(tmp_path: Path) -> None:
    assert _cell(tmp_path, "mkdir sub && cd sub && export A=1 B='two words' && C=3 && "
                           "arr=(x 'y z') && g() { echo \"g:$1\"; } && shopt -s nullglob").returncode == 0
    second = _cell(tmp_path, "pwd; echo \"$A|$B|$C|${arr[1]}\"; g hi; env | grep -c '^B=two words$'; "
                             "shopt -q nullglob && echo nullglob")
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"{tmp_path}/sub\n1|two words|3|y z\ng:hi\n1\nnullglob\n"
    assert second.stderr == ""


@pytest.mark.parametrize("ending", ["exit 3", "false"])
def test_bash_state_is_saved_whatever_the_exit_status(tmp_path: Path, ending: str) -> None:
    first = _cell(tmp_path, f"D=kept; {ending}")
    assert first.returncode != 0
    assert _cell(tmp_path, "echo $D").stdout == "kept\n"


def test_bash_cell_cannot_read_the_next_cell(tmp_path: Path) -> None:
    # The cell arrives on stdin, which the wrapper has consumed: a `read` gets end of file.
    result = _cell(tmp_path, "read -r line && echo \"got:$line\" || echo eof")
    assert result.stdout == "eof\n"


def test_scan_stops_at_its_entry_cap_even_for_empty_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Folders count: a tree of empty folders must not keep the controller's loop walking.
    from sandboxd.agent import sessions, tree

    for index in range(50):
        (tmp_path / f"d{index}").mkdir()
    listed: list[int] = []
    real_listdir = tree.os.listdir

    def listdir(fd: int) -> list[str]:
        listed.append(fd)
        return real_listdir(fd)

    monkeypatch.setattr(sessions, "MAX_SCANNED_ENTRIES", 10)
    monkeypatch.setattr(tree.os, "listdir", listdir)
    assert scan(str(tmp_path)) == {}
    assert len(listed) <= 11


def test_scan_finds_a_file_past_path_max(tmp_path: Path) -> None:
    """Walked by whole paths, a file 20 levels of 200-byte names down (4,020 bytes below the work dir) was past
    PATH_MAX with the work dir in front, and not listed."""
    from sandboxd.agent import runner, tree

    workdir = tmp_path / ("w" * 200)
    workdir.mkdir()
    relpath = "/".join(["n" * 200] * 20) + "/f.txt"
    try:
        tree.write_tree(str(workdir), os.getuid(), [(relpath, b"x"), ("top.txt", b"t")])
        assert sorted(scan(str(workdir))) == [relpath, "top.txt"]
    finally:
        runner.remove_tree(str(workdir))


def test_file_names_that_are_not_utf8_are_reported_as_valid_text(tmp_path: Path) -> None:
    """A cell that made b"bad\\xff" failed with UNKNOWN: the name reached the daemon's protobuf as a lone surrogate.
    Each bad byte is written out as \\xNN; distinct names stay distinct, and the order is the same every time."""
    before = scan(str(tmp_path))
    folder = os.fsencode(tmp_path)
    for name in (b"bad\xff", b"bad\xfe", b"caf\xc3\xa9", b"sub\x80"):
        os.close(os.open(folder + b"/" + name, os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(folder + b"/dir\xff")
    os.close(os.open(folder + b"/dir\xff/in\xff", os.O_CREAT | os.O_WRONLY, 0o644))
    changed = changed_files(before, scan(str(tmp_path)))
    assert changed == ["bad\\xfe", "bad\\xff", "café", "dir\\xff/in\\xff", "sub\\x80"]
    for changed_name in changed:
        changed_name.encode("utf-8")  # what the daemon's protobuf does; a lone surrogate raised here
