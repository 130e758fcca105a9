"""The controller's side of the zygote's channel: forks on request, spare workers, and the exits it reports."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
from typing import Any

from sandboxd.agent.host.errors import SandboxDamaged
from sandboxd.agent.messages import SandboxFull
from sandboxd.agent.protocol import (
    EXITED,
    FORK_FAILED,
    FORKED,
    MESSAGE_BYTES,
    OP_EXITED,
    OP_FORK,
    OP_FORK_FAILED,
    OP_FORKED,
    OP_RESEED,
    READY,
    REQUEST,
)

# Workers forked ahead of need, per sandbox; each is a copy-on-write view of
# the zygote that costs page tables, not pages, while it waits.
SPARE_WORKERS = 2


class Zygote:
    """The controller's handle on the zygote process."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.pid = pid
        self._sock = sock
        self._tags = itertools.count()
        self._forks: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self._exits: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.alive = True
        self._spares: list[tuple[int, socket.socket, asyncio.Future[dict[str, Any]]]] = []
        self._refilling = 0
        self._background: set[asyncio.Future[None]] = set()
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock, self._on_readable)

    def _on_readable(self) -> None:
        while True:
            try:
                # One byte more than the longest message: a longer one shows as such.
                data, fds, _flags, _addr = socket.recv_fds(self._sock, MESSAGE_BYTES + 1, 1)
            except BlockingIOError:
                return
            if not data:
                self._died()
                return
            if data[0] == OP_FORKED and len(data) == FORKED.size and fds:
                _op, tag, pid = FORKED.unpack(data)
                future = self._forks.pop(tag, None)
                if future is not None and not future.done():
                    # Replaces what an earlier process of this pid left: it was
                    # reaped and reported before this one could be forked.
                    self._exits[pid] = asyncio.get_running_loop().create_future()
                    future.set_result((pid, fds[0]))
                else:
                    # Its fork was given up (cancelled): closing its channel ends it.
                    os.close(fds[0])
            elif data[0] == OP_EXITED and len(data) == EXITED.size:
                _op, tag, pid, status, cpu_seconds, max_rss_bytes = EXITED.unpack(data)
                unannounced = self._forks.pop(tag, None)
                if unannounced is not None and not unannounced.done():
                    # Killed (the OOM killer) before it could announce itself.
                    unannounced.set_exception(SandboxDamaged(f"worker {pid} exited before it started"))
                # Only an announced worker has an exit to wait for; others are dropped.
                exited = self._exits.get(pid)
                if exited is not None and not exited.done():
                    exited.set_result(
                        {"pid": pid, "status": status, "cpu_seconds": cpu_seconds, "max_rss_bytes": max_rss_bytes})
            elif data[0] == OP_FORK_FAILED and len(data) == FORK_FAILED.size:
                _op, tag, error = FORK_FAILED.unpack(data)
                failed = self._forks.pop(tag, None)
                if failed is not None and not failed.done():
                    # The runs hold the sandbox's pids: not the job's fault, nor damage.
                    failed.set_exception(SandboxFull(f"no room for another process in the sandbox "
                                                     f"({os.strerror(error) if error else 'fork failed'})"))
            elif data == READY and not self.ready.done():
                self.ready.set_result(None)
            else:
                for fd in fds:
                    os.close(fd)

    def _died(self) -> None:
        self.alive = False
        asyncio.get_running_loop().remove_reader(self._sock)
        error = SandboxDamaged("zygote exited")
        pending: list[asyncio.Future[Any]] = [*self._forks.values(), *self._exits.values(), self.ready]
        for future in pending:
            if not future.done():
                future.set_exception(error)
        self._forks.clear()

    def reseed(self) -> None:
        self._sock.send(REQUEST.pack(OP_RESEED, 0))

    async def fork(self) -> tuple[int, socket.socket, asyncio.Future[dict[str, Any]]]:
        if not self.alive:
            raise SandboxDamaged("zygote exited")
        tag = next(self._tags) % (1 << 32)  # REQUEST's tag field
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._forks[tag] = future
        try:
            self._sock.send(REQUEST.pack(OP_FORK, tag))
        except OSError as exc:
            del self._forks[tag]
            raise SandboxDamaged(f"zygote unreachable: {exc}") from None
        try:
            pid, fd = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                # Announced just as we were cancelled: end the worker, forget it.
                pid, fd = future.result()
                os.close(fd)
                self.forget(pid)
            raise
        return pid, socket.socket(fileno=fd), self._exits[pid]

    async def take(self) -> tuple[int, socket.socket, asyncio.Future[dict[str, Any]]]:
        """A waiting worker: a spare if one is ready (the fork is then off the job's path)."""
        while self._spares:
            pid, channel, exited = self._spares.pop()
            if not exited.done():
                self._refill()
                return pid, channel, exited
            channel.close()
            self.forget(pid)
        self._refill()
        return await self.fork()

    def _refill(self) -> None:
        if self.alive and len(self._spares) + self._refilling < SPARE_WORKERS:
            self._refilling += 1
            task = asyncio.ensure_future(self._fork_spare())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _fork_spare(self) -> None:
        try:
            self._spares.append(await self.fork())
        except (SandboxDamaged, SandboxFull):
            pass
        finally:
            self._refilling -= 1

    def drop_spares(self) -> None:
        """Kill the waiting spares: after a restore, every clone holds the same ones (same random state)."""
        while self._spares:
            pid, channel, _exited = self._spares.pop()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            channel.close()
            self.forget(pid)

    def forget(self, pid: int) -> None:
        """Drop `pid`'s exit future, once its exit has arrived.

        Forgotten earlier (a worker just killed), the late exit report would
        leave a finished future behind for the next worker the kernel gives
        the same pid.
        """
        future = self._exits.get(pid)
        if future is None or future.done():
            self._exits.pop(pid, None)
            return

        def drop(done: asyncio.Future[dict[str, Any]]) -> None:
            if self._exits.get(pid) is done:
                del self._exits[pid]

        future.add_done_callback(drop)
