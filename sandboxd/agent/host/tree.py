"""Files under a run's work dir, reached one folder name at a time: write, read, walk, measure.

Every function here opens each folder by its name in the one above
(openat), with O_NOFOLLOW, and never by its whole path. Whole paths failed
twice: a valid 4,095-byte path relative to the work dir is past PATH_MAX
(4,096 with its NUL) once the work dir is in front (ENAMETOOLONG), and a
lookup walks the whole depth again for every entry (quadratic: 0.25 s per
file 2,000 levels deep). Not following links keeps a run's symlinks from
leading the agent (root) out of the work dir.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Generator, Iterator

from sandboxd.agent.protocol import BadRequest

OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(relpath: str) -> list[str]:
    """The names of `relpath`, one per level; BadRequest for one the daemon refuses (empty, '.', '..')."""
    parts = [p for p in relpath.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise BadRequest(f"bad file path {relpath!r}")
    return parts


def write_tree(workdir: str, uid: int, files: list[tuple[str, bytes]], mode: int = 0o600) -> None:
    """Create each of `files` (relative path, content) under `workdir` with its folders, all `uid`'s.

    The previous file's open folders are kept, so files that share a deep
    folder walk it once. A failed write's OSError carries the file's
    relative path as `filename`.
    """
    chain: list[tuple[str, int]] = []  # (name, fd) of the folders from `workdir` down
    top = os.open(workdir, OPEN_FOLDER)
    try:
        for relpath, content in files:
            *folders, name = _parts(relpath)
            try:
                kept = 0
                while kept < min(len(chain), len(folders)) and chain[kept][0] == folders[kept]:
                    kept += 1
                while len(chain) > kept:
                    os.close(chain.pop()[1])
                for folder in folders[kept:]:
                    above = chain[-1][1] if chain else top
                    try:
                        os.mkdir(folder, 0o700, dir_fd=above)
                        made = True
                    except FileExistsError:  # made for an earlier file
                        made = False
                    chain.append((folder, os.open(folder, OPEN_FOLDER, dir_fd=above)))
                    if made:
                        os.fchown(chain[-1][1], uid, uid)
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=chain[-1][1] if chain else top)
                try:
                    view = memoryview(content)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fchown(fd, uid, uid)
                finally:
                    os.close(fd)
            except OSError as exc:
                exc.filename = relpath
                raise
    finally:
        for _, fd in chain:
            os.close(fd)
        os.close(top)


def read_tree_file(workdir: str, relpath: str, limit: int) -> bytes | None:
    """Up to `limit` bytes of the regular file at `relpath` under `workdir`; None if it is not one.

    OSError where a folder on the way is missing or a link, or the file is:
    by realpath, links that stay in the work dir would be followed, and a file
    at a valid 4,091-byte path left out (past PATH_MAX).
    """
    parts = _parts(relpath)
    folder = os.open(workdir, OPEN_FOLDER)
    try:
        for name in parts[:-1]:
            below = os.open(name, OPEN_FOLDER, dir_fd=folder)
            os.close(folder)
            folder = below
        # O_NONBLOCK: a fifo the job left there must not hang the agent in open().
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    finally:
        os.close(fd)


# Entries whose relative path would be longer than this are walked without one: no reply can name them (the
# daemon's paths are at most 4,095 bytes), and a path kept per level makes a walk quadratic in time and memory
# (2,000 levels of 255-byte names: +1.7 GiB in the controller, for a session's files_changed).
MAX_RELPATH_BYTES = 4095


def walk(folder: str) -> Generator[tuple[str | None, str, os.stat_result], None, None]:
    """(its folder's relative path, name, lstat) of everything under `folder`, depth first; links not followed.

    The folder's relative path is "" at the top and ends in "/" below: `folder + name` is the entry's. It is
    None for a folder whose path would be longer than MAX_RELPATH_BYTES, and below it.

    A folder is entered only if, opened, it is still the folder (device and
    inode) that its parent listed: a run may swap it for a link to another
    run's folder in between (renameat2's RENAME_EXCHANGE, in a loop), and
    that folder's names would be listed as its own. Entries that vanish
    before they are looked at are skipped. One descriptor is held per level:
    past the descriptors the agent may hold (4,096 levels, which a run can
    nest with chdir), deeper folders are not entered. A caller that stops
    early closes the generator (or lets it be collected) to release them.
    """
    # (folder fd, its relative path or None, that path's bytes, names not yet looked at)
    levels: list[tuple[int, str | None, int, Iterator[str]]] = []

    def enter(name: str, above: int | None, relpath: str | None, size: int, identity: tuple[int, int] | None) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(name, OPEN_FOLDER, dir_fd=above)
            try:
                opened = os.fstat(fd)
                if identity is None or (opened.st_dev, opened.st_ino) == identity:
                    levels.append((fd, relpath, size, iter(os.listdir(fd))))
                    return
            except OSError:
                pass
            os.close(fd)

    enter(folder, None, "", 0, None)
    try:
        while levels:
            fd, relpath, size, names = levels[-1]
            name = next(names, None)
            if name is None:
                os.close(levels.pop()[0])
                continue
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            yield relpath, name, info
            if stat.S_ISDIR(info.st_mode):
                below = size + len(os.fsencode(name)) + 1
                path = f"{relpath}{name}/" if relpath is not None and below <= MAX_RELPATH_BYTES else None
                enter(name, fd, path, below, (info.st_dev, info.st_ino))
    finally:
        for fd, _, _, _ in levels:
            os.close(fd)


def usage_of(folder: str) -> tuple[int, int]:
    """(bytes, entries) that what is under `folder`, the folder included, takes of its file system.

    A file's bytes count once whatever its links; each link is an entry, as
    tmpfs counts them (a hard link takes one of nr_inodes).
    """
    try:
        top = os.lstat(folder)
    except OSError:
        return 0, 0
    total_bytes, entries = top.st_blocks * 512, 1
    seen = {top.st_ino}
    if stat.S_ISDIR(top.st_mode):
        for _, _, info in walk(folder):
            entries += 1
            if info.st_ino not in seen:
                seen.add(info.st_ino)
                total_bytes += info.st_blocks * 512
    return total_bytes, entries
