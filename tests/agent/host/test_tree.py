"""The agent's file-tree functions, on real folders: writing a job's files, collecting, walking, measuring."""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path

import pytest

from sandboxd.agent.host import cleanup, tree
from sandboxd.agent.protocol import BadRequest


def test_write_tree_makes_each_file_and_folder_the_jobs(tmp_path: Path) -> None:
    uid = os.getuid()
    files = [("a/b/c.txt", b"c"), ("a/x.txt", b"x"), ("a/b/d.txt", b"d" * 100_000), ("e.txt", b""),
             ("a/b/z/y.txt", b"y")]
    tree.write_tree(str(tmp_path), uid, files)
    for relpath, content in files:
        info = (tmp_path / relpath).lstat()
        assert (tmp_path / relpath).read_bytes() == content and info.st_mode & 0o777 == 0o600 and info.st_uid == uid
    for folder in ("a", "a/b", "a/b/z"):
        assert (tmp_path / folder).stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "e.txt"]


def test_write_tree_takes_a_path_as_long_as_linux_allows_below_the_work_dir(tmp_path: Path) -> None:
    """4,095 bytes relative to the work dir, 2,046 levels: past PATH_MAX from / (ENAMETOOLONG before)."""
    workdir = tmp_path / ("w" * 200)
    workdir.mkdir()
    folder = "/".join(["a"] * 2045)
    files = [(f"{folder}/{i}", str(i).encode()) for i in range(10)]
    assert len(files[0][0].encode()) == 4091 and len(str(workdir)) + 1 + 4091 > 4096
    try:
        tree.write_tree(str(workdir), os.getuid(), files)
        fd = os.open(workdir, os.O_RDONLY)
        try:
            file_fd = os.open(folder + "/7", os.O_RDONLY, dir_fd=fd)  # relative to the work dir, as a run sees it
            assert os.read(file_fd, 10) == b"7"
            os.close(file_fd)
        finally:
            os.close(fd)
    finally:
        cleanup.remove_tree(str(workdir))  # pytest's own removal of old temporary folders recurses per level


@pytest.mark.parametrize("relpath", ["", "/", "a/../b", "./a"])
def test_write_tree_refuses_a_path_the_daemon_would_have(tmp_path: Path, relpath: str) -> None:
    with pytest.raises(BadRequest, match="bad file path"):
        tree.write_tree(str(tmp_path), os.getuid(), [(relpath, b"x")])
    assert list(tmp_path.iterdir()) == []


def test_read_tree_file_collects_a_file_as_deep_as_write_tree_writes_it(tmp_path: Path) -> None:
    """By realpath, a file at a valid 4,091-byte path was past PATH_MAX with the work dir in front: left out."""
    workdir = tmp_path / ("w" * 200)
    workdir.mkdir()
    relpath = "/".join(["a"] * 2045) + "/7"
    try:
        tree.write_tree(str(workdir), os.getuid(), [(relpath, b"seven"), ("top.txt", b"t" * 100)])
        assert tree.read_tree_file(str(workdir), relpath, 1 << 20) == b"seven"
        assert tree.read_tree_file(str(workdir), "top.txt", 10) == b"t" * 10  # cut at the limit
    finally:
        cleanup.remove_tree(str(workdir))


def test_read_tree_file_takes_only_a_regular_file_reached_without_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    workdir = tmp_path / "work"
    (workdir / "sub").mkdir(parents=True)
    (workdir / "sub" / "f.txt").write_text("f")
    (workdir / "folder-link").symlink_to(outside)
    (workdir / "file-link").symlink_to(outside / "secret")
    (workdir / "inner-link").symlink_to("sub/f.txt")  # inside the work dir, and still a link
    os.mkfifo(workdir / "fifo")  # opened without blocking
    read = functools.partial(tree.read_tree_file, str(workdir), limit=100)
    assert read("sub/f.txt") == b"f" and read("sub//f.txt") == b"f"
    assert read("sub") is None and read("fifo") is None
    for relpath in ("folder-link/secret", "file-link", "inner-link", "missing", "sub/missing/x"):
        with pytest.raises(OSError):
            read(relpath)
    for relpath in ("../outside/secret", "sub/../../outside/secret", "", "./sub/f.txt"):
        with pytest.raises(BadRequest):
            read(relpath)


def test_usage_of_counts_entries_and_bytes_once_per_file_and_takes_trees_past_path_max(tmp_path: Path) -> None:
    """Looked up by whole path, a job's files 2,045 levels deep failed with ENAMETOOLONG when /tmp filled
    (the neighbours' check on ENOSPC), an internal error the client retried (red team)."""
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.bin").write_bytes(b"x" * 10_000)
    os.link(small / "a.bin", small / "b.bin")  # one more entry, no more bytes
    (small / "sub").mkdir()
    (small / "sub" / "c.txt").write_text("c")
    (small / "link").symlink_to("/etc")
    expected_bytes = sum(os.lstat(p).st_blocks * 512 for p in (small, small / "a.bin", small / "sub",
                                                             small / "sub" / "c.txt", small / "link"))
    assert tree.usage_of(str(small)) == (expected_bytes, 6)
    deep = tmp_path / ("w" * 200)
    deep.mkdir()
    try:
        files = [("/".join(["a"] * 2045) + f"/{i}", b"") for i in range(3)]
        tree.write_tree(str(deep), os.getuid(), files)
        assert tree.usage_of(str(deep))[1] == 1 + 2045 + 3
    finally:
        cleanup.remove_tree(str(deep))
    assert tree.usage_of(str(tmp_path / "missing")) == (0, 0)


def test_write_tree_follows_no_link_and_names_the_file_that_failed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "link").symlink_to(outside)
    with pytest.raises(OSError) as raised:
        tree.write_tree(str(workdir), os.getuid(), [("ok.txt", b"1"), ("link/f.txt", b"2")])
    assert raised.value.filename == "link/f.txt" and raised.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert list(outside.iterdir()) == [] and (workdir / "ok.txt").read_bytes() == b"1"


def test_walk_keeps_no_path_past_what_a_reply_can_name(tmp_path: Path) -> None:
    """A relative path kept per level made walking 2,000 levels of 255-byte names quadratic: 1.7 GiB more in the
    controller for one session's files_changed (red team). Below MAX_RELPATH_BYTES entries come without a path;
    they are still counted."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    name = "n" * 255
    levels = 40  # 40 x 256 bytes: past 4,095 from the 16th level
    relpath = "/".join([name] * levels) + "/f.txt"
    try:
        tree.write_tree(str(workdir), os.getuid(), [(relpath, b"x"), ("top.txt", b"t")])
        seen = [(folder, entry) for folder, entry, _ in tree.walk(str(workdir))]
        assert ("", "top.txt") in seen and (None, "f.txt") in seen
        named = [folder for folder, _ in seen if folder is not None]
        assert max(len(os.fsencode(folder)) for folder in named) <= tree.MAX_RELPATH_BYTES
        assert len(named) == 1 + 16 and tree.usage_of(str(workdir))[1] == 1 + 1 + levels + 1
    finally:
        cleanup.remove_tree(str(workdir))
