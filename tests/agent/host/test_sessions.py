"""Pieces of the agent's sessions that need no sandbox: file change tracking and the bash state wrapper."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sandboxd.agent.host import cleanup, usage
from sandboxd.agent.host.cleanup import sigkill_uid
from sandboxd.agent.host.sessions import (
    BASH_STATE_FILE,
    BASH_WRAPPER,
    changed_files,
    files_held,
    pause_uid,
    resume_uid,
    scan,
)


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
    from sandboxd.agent.host import sessions, tree

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
    from sandboxd.agent.host import tree

    workdir = tmp_path / ("w" * 200)
    workdir.mkdir()
    relpath = "/".join(["n" * 200] * 20) + "/f.txt"
    try:
        tree.write_tree(str(workdir), os.getuid(), [(relpath, b"x"), ("top.txt", b"t")])
        assert sorted(scan(str(workdir))) == [relpath, "top.txt"]
    finally:
        cleanup.remove_tree(str(workdir))


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


TEST_UID = 64_999  # a uid no process of this machine runs under


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat_file:
        return stat_file.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(os.getuid() != 0, reason="signals another uid's processes, as the agent (root) does")
def test_pause_uid_stops_a_forking_uid_and_resume_uid_lets_it_go_on(tmp_path: Path) -> None:
    """Every process of the uid is stopped, those forked while it was being stopped included; then continued."""
    spinner = ("import os, time\nfor _ in range(20):\n    if os.fork() == 0:\n        break\n"
               "while True:\n    pass\n")
    child = subprocess.Popen(["python3", "-c", spinner], user=TEST_UID, group=TEST_UID, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(usage.processes_of({TEST_UID}).get(TEST_UID, [])) < 21 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pause_uid(TEST_UID)
        time.sleep(0.2)  # a stop lands when the process next runs
        pids = usage.processes_of({TEST_UID})[TEST_UID]
        assert len(pids) == 21 and {_state(pid) for pid in pids} == {"T"}
        ran = [usage.schedstat(pid) for pid in pids]
        time.sleep(0.2)
        assert [usage.schedstat(pid) for pid in pids] == ran  # no CPU while stopped
        resume_uid(TEST_UID)
        time.sleep(0.2)
        assert "T" not in {_state(pid) for pid in pids}
    finally:
        sigkill_uid(TEST_UID)
        child.wait()


def test_files_held_counts_the_folder_links_shared_files_and_open_deleted_files(tmp_path: Path) -> None:
    work, shared = tmp_path / "work", tmp_path / "shm"
    work.mkdir()
    shared.mkdir()
    (work / "sub").mkdir()
    (work / "sub" / "data").write_bytes(b"x" * 10_000)
    for n in range(3):
        os.link(work / "sub" / "data", work / f"link{n}")  # entries, but the same bytes
    (shared / "mine").write_bytes(b"y" * 8192)
    (shared / "theirs").write_bytes(b"z" * 8192)
    os.chown(shared / "theirs", TEST_UID, TEST_UID)
    holder = subprocess.Popen(  # holds a deleted file of 20,000 bytes open
        ["python3", "-c", "import os, sys\nf = open('deleted', 'wb')\nf.write(b'd' * 20_000)\nf.flush()\n"
         "os.unlink('deleted')\nprint(os.fstat(f.fileno()).st_blocks, flush=True)\nsys.stdin.read()"],
        cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout is not None
        deleted_blocks = int(holder.stdout.readline())
        held_bytes, entries = files_held(os.getuid(), str(work), [str(shared)], [holder.pid], 1000)
        data, mine = (work / "sub" / "data").stat(), (shared / "mine").stat()
        blocks = (work.stat().st_blocks + (work / "sub").stat().st_blocks + data.st_blocks + mine.st_blocks
                  + deleted_blocks) * 512
        # work, sub, data, 3 links, mine, the deleted file
        assert (held_bytes, entries) == (blocks, 8)
        assert files_held(os.getuid(), str(work), [str(shared)], [holder.pid], 3)[1] == 4  # stops past the cap
    finally:
        holder.kill()
        holder.wait()
