"""Memory a run pins in the kernel, where no process maps it: socket buffers, pipes, epoll and inotify watches.

A wrong program can queue GiB in Unix socketpair send buffers (SO_SNDBUF
up to twice net.core.wmem_max: 8 MiB a socket where wmem_max is 4 MiB)
while its processes hold 5 MiB each, so the sweep (RssAnon + RssShmem)
sees nothing, while the sandbox's memory cgroup is charged (kmem): 472 MiB
queued by one process in 60 pairs come to 481 MiB of
memory.kmem.usage_in_bytes. The OOM killer weighs processes by what they
map, so it takes the neighbours instead, sessions and judges included,
then the agent.

A cap does not work: wmem_max and rmem_max are host-wide (read-only in a
container: runc's write fails with EACCES), SO_SNDBUF binds one socket,
and a run may hold 512 descriptors in each of 256 processes. So what the
run pins is counted, by the run's uid, and added to what its processes map
(usage.UsageWatch):

- Unix sockets, from one sock_diag dump of the sandbox's network namespace
  per sweep (NETLINK_SOCK_DIAG, no privilege needed): each socket is charged
  to the uid that created it (UNIX_DIAG_UID) with its own object
  (SOCKET_BYTES) and what it sent that is still queued anywhere
  (SK_MEMINFO_WMEM_ALLOC, the skbs' true size). Data whose sender is gone
  (closed after sending) is charged to its receiver: the dump shows only
  its length (UNIX_DIAG_RQLEN), and one byte takes an skb of 768 bytes
  here, so it counts as min(length x SKB_BYTES_PER_BYTE, a full send
  buffer), at least its length. A connection not yet accepted has no inode
  and is not in the dump, though its sender may have filled it and closed:
  each counts as a full send buffer, charged to the listener's uid.
- Every other descriptor, from /proc/<pid>/fd (read as the run's uid, as
  smaps_rollup is): a pipe, named or not, its capacity (F_GETPIPE_SZ: 64 KiB unless
  resized, up to fs.pipe-max-size) plus PIPE_BYTES, once however many ends
  the run holds; an epoll instance EPOLL_WATCH_BYTES per watch and an
  inotify instance INOTIFY_WATCH_BYTES per watch (their fdinfo lists them);
  anything else FILE_BYTES. A process whose descriptors cannot be read
  (not dumpable) counts FDSize (its table's size) descriptors of a full pipe.

Measured on the CI host (memory.kmem.usage_in_bytes, 4,000 of each): an
empty socket 2,409 bytes, an empty pipe 2,031 bytes and a full one 65,454,
an epoll watch 222, an inotify watch 88, an eventfd 434.

Not counted: descriptors in flight (sent with SCM_RIGHTS, closed by the
sender), which the kernel caps at RLIMIT_NOFILE per uid (512 for a run);
pages spliced or vmspliced into a pipe beyond its capacity's worth; IP
sockets (refused unless sandbox.loopback); what a receiver with several
senders gone holds past one full send buffer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import struct
from dataclasses import dataclass

# Measured here (see the docstring), rounded up.
SOCKET_BYTES = 2560
PIPE_BYTES = 2048
FILE_BYTES = 512
EPOLL_WATCH_BYTES = 256
INOTIFY_WATCH_BYTES = 128
# The true size of a one-byte skb on a Unix stream socket, per byte of data: 278 one-byte sends filled a
# 212,992-byte send buffer here.
SKB_BYTES_PER_BYTE = 768
# Linux's defaults, where /proc/sys says nothing.
DEFAULT_WMEM_MAX = 212_992
DEFAULT_PIPE_BYTES = 65_536
F_GETPIPE_SZ = 1032

# sock_diag (linux/sock_diag.h, linux/unix_diag.h).
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSGHDR = struct.Struct("=IHHII")
UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")
UNIX_DIAG_MSG = struct.Struct("=BBBBIII")
RTATTR = struct.Struct("=HH")
UDIAG_SHOW_PEER = 0x04
UDIAG_SHOW_RQLEN = 0x10
UDIAG_SHOW_MEMINFO = 0x20
UDIAG_SHOW_UID = 0x40
UNIX_DIAG_PEER = 2
UNIX_DIAG_RQLEN = 4
UNIX_DIAG_MEMINFO = 5
UNIX_DIAG_UID = 7
SK_MEMINFO_WMEM_ALLOC = 2
TCP_LISTEN = 10
ALL_STATES = 0xFFFFFFFF


def _sysctl(path: str, default: int) -> int:
    try:
        with open(path, "rb") as value:
            return int(value.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def full_receive_buffer() -> int:
    """The most one socket can have queued to it: SO_RCVBUF is doubled by the kernel, up to twice rmem_max."""
    return 2 * _sysctl("/proc/sys/net/core/rmem_max", DEFAULT_WMEM_MAX)


def full_send_buffer() -> int:
    """The most one Unix socket can have queued: SO_SNDBUF is doubled by the kernel, up to twice wmem_max."""
    return 2 * _sysctl("/proc/sys/net/core/wmem_max", DEFAULT_WMEM_MAX)


@dataclass
class UnixSocket:
    inode: int
    uid: int
    listening: bool
    peer: int
    # Bytes queued to it (stream), the first datagram's (datagram), or connections waiting (listening).
    received: int
    # The true size of what it sent that is still queued.
    sent: int


def _parse(data: bytes, found: list[UnixSocket]) -> bool:
    """Append the sockets of one netlink read to `found`; whether the dump is done."""
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = NLMSGHDR.unpack_from(data, offset)
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            error = -struct.unpack_from("=i", data, offset + NLMSGHDR.size)[0]
            raise OSError(error, f"sock_diag: {os.strerror(error)}")
        _family, _type, state, _pad, inode, _c0, _c1 = UNIX_DIAG_MSG.unpack_from(data, offset + NLMSGHDR.size)
        record = UnixSocket(inode, -1, state == TCP_LISTEN, 0, 0, 0)
        at = offset + NLMSGHDR.size + UNIX_DIAG_MSG.size
        while at + RTATTR.size <= offset + length:
            size, attribute = RTATTR.unpack_from(data, at)
            if size < RTATTR.size:
                break
            payload = data[at + RTATTR.size:at + size]
            if attribute == UNIX_DIAG_PEER and len(payload) >= 4:
                record.peer = struct.unpack_from("=I", payload)[0]
            elif attribute == UNIX_DIAG_RQLEN and len(payload) >= 4:
                record.received = struct.unpack_from("=I", payload)[0]
            elif attribute == UNIX_DIAG_MEMINFO and len(payload) >= 4 * (SK_MEMINFO_WMEM_ALLOC + 1):
                record.sent = struct.unpack_from("=I", payload, 4 * SK_MEMINFO_WMEM_ALLOC)[0]
            elif attribute == UNIX_DIAG_UID and len(payload) >= 4:
                record.uid = struct.unpack_from("=I", payload)[0]
            at += (size + 3) & ~3
        found.append(record)
        offset += (length + 3) & ~3
    return False


def unix_sockets() -> list[UnixSocket]:
    """Every Unix socket of this network namespace that has an inode; [] where the kernel has no sock_diag."""
    found: list[UnixSocket] = []
    try:
        diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    except OSError:
        return found
    with diag:
        request = UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, ALL_STATES, 0,
                                     UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN | UDIAG_SHOW_MEMINFO | UDIAG_SHOW_UID,
                                     0xFFFFFFFF, 0xFFFFFFFF)
        diag.sendto(NLMSGHDR.pack(NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP,
                                  1, 0) + request, (0, 0))
        while not _parse(diag.recv(1 << 20), found):
            pass
    return found


def socket_memory() -> dict[int, int]:
    """Bytes each uid's Unix sockets pin in the kernel (see the module's docstring)."""
    return socket_use()[0]


def socket_use() -> tuple[dict[int, int], dict[int, int], set[int] | None]:
    """(bytes each uid's Unix sockets pin in the kernel, how many Unix sockets each uid has, their inodes), from
    one dump; the inodes None where the dump found none (the agent has its own: the kernel has no sock_diag)."""
    sockets = unix_sockets()
    if not sockets:
        return {}, {}, None
    alive = {record.inode for record in sockets}
    full = full_send_buffer()
    held: dict[int, int] = {}
    counts: dict[int, int] = {}
    for record in sockets:
        pinned = SOCKET_BYTES + record.sent
        if record.listening:
            pinned += record.received * (SOCKET_BYTES + full)
        elif record.received and record.peer not in alive:
            pinned += max(record.received, min(record.received * SKB_BYTES_PER_BYTE, full))
        held[record.uid] = held.get(record.uid, 0) + pinned
        counts[record.uid] = counts.get(record.uid, 0) + 1
    return held, counts, alive


def _inode(socket_link: str) -> int:
    """The inode a descriptor's link names ("socket:[<inode>]"); -1 if it names none."""
    digits = socket_link[len("socket:["):-1]
    return int(digits) if digits.isdigit() else -1


def _fdinfo_lines(pid: int, fd: str, prefix: bytes) -> int:
    """How many lines of /proc/<pid>/fdinfo/<fd> start with `prefix`; 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as info:
            return sum(1 for line in info if line.startswith(prefix))
    except OSError:
        return 0


def _pipe_capacity(pid: int, fd: str) -> int:
    """The pipe's capacity, from an end opened through /proc (read-only, without blocking: no writer waits on it)."""
    try:
        end = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return DEFAULT_PIPE_BYTES
    try:
        return fcntl.fcntl(end, F_GETPIPE_SZ)
    except OSError:
        return DEFAULT_PIPE_BYTES
    finally:
        os.close(end)


def _fifo_name(pid: int, fd: str) -> str:
    """"pipe:[<inode>]" on <device>, as a pipe's link reads, if the descriptor is a named pipe; "" if not."""
    try:
        info = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""
    return f"pipe:[{info.st_ino}] on {info.st_dev}" if stat.S_ISFIFO(info.st_mode) else ""


def _table_size(pid: int) -> int:
    """FDSize of /proc/<pid>/status: how many descriptors its table has room for."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"FDSize:"):
                return int(line.split()[1])
    return 0


def descriptor_memory(pids: list[int], pipes_seen: set[str] | None = None,
                      unix_inodes: set[int] | None = None) -> int:
    """Bytes the descriptors of `pids` pin beyond their Unix sockets (counted by socket_use, whose inodes are
    `unix_inodes`; None: every socket is left to it).

    Called with the file system ids of the processes' uid (usage._file_system_ids): /proc/<pid>/fd is the
    process's own to read. A pipe counts once in `pipes_seen`, however many ends the processes hold.
    """
    seen: set[str] = pipes_seen if pipes_seen is not None else set()
    held = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        except OSError:  # not dumpable: its table's size, each a full pipe
            held += _table_size(pid) * (DEFAULT_PIPE_BYTES + PIPE_BYTES)
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:"):
                # A Unix socket is socket_use's. Any other (the seccomp profile leaves netlink's sock_diag, which
                # the agent reads with) queues replies it never reads up to a full receive buffer: counted so.
                if unix_inodes is not None and target not in seen and _inode(target) not in unix_inodes:
                    seen.add(target)
                    held += SOCKET_BYTES + full_receive_buffer()
                continue
            if target.startswith("/"):
                # A named pipe (mkfifo in the run's folder) holds the same buffers as pipe(): 512 of them filled
                # after fs.pipe-user-pages-soft still pin 2 pages each, 1 GiB over a run's 256 processes.
                fifo = _fifo_name(pid, fd)
                if fifo:
                    target = fifo
            if target.startswith("pipe:"):
                if target not in seen:
                    seen.add(target)
                    held += PIPE_BYTES + _pipe_capacity(pid, fd)
                continue
            held += FILE_BYTES
            if target == "anon_inode:[eventpoll]":
                held += EPOLL_WATCH_BYTES * _fdinfo_lines(pid, fd, b"tfd:")
            elif target == "anon_inode:inotify":
                held += INOTIFY_WATCH_BYTES * _fdinfo_lines(pid, fd, b"inotify wd:")
    return held
