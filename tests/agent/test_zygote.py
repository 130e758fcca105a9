"""The zygote's channel: a real zygote forking real workers, and the controller's side of its protocol."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import pytest

from sandboxd.agent import zygote as zygote_module
from sandboxd.agent.runner import SandboxDamaged, Zygote

# A fresh interpreter runs the zygote (forking this pytest process would
# make a zygote of pytest); it is the test's child, as the agent's is the controller's.
ZYGOTE_MAIN = ("import socket, sys; from sandboxd.agent import zygote; "
               "zygote.main(socket.socket(fileno=int(sys.argv[1])), [])")


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        return int(stat_file.read().rsplit(b")", 1)[1].split()[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker drops its groups, which needs root")
def test_a_forked_worker_announces_itself_and_its_exit_is_reported() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen([sys.executable, "-c", ZYGOTE_MAIN, str(theirs.fileno())],
                               pass_fds=[theirs.fileno()])
    theirs.close()

    async def scenario() -> None:
        zygote = Zygote(ours, process.pid)
        await asyncio.wait_for(zygote.ready, 60)
        zygote.reseed()
        workers = [await asyncio.wait_for(zygote.fork(), 10) for _ in range(3)]
        assert len({pid for pid, _channel, _exited in workers}) == 3
        for pid, channel, exited in workers:
            assert _parent_of(pid) == process.pid
            # The worker waits for its job on the channel it sent us.
            channel.settimeout(0.2)
            with pytest.raises(TimeoutError):
                channel.recv(1)
            os.kill(pid, signal.SIGKILL)
            report = await asyncio.wait_for(exited, 10)
            assert report["pid"] == pid
            assert os.WIFSIGNALED(report["status"]) and os.WTERMSIG(report["status"]) == signal.SIGKILL
            channel.close()
        ours.close()

    try:
        asyncio.run(scenario())
        # Hung up on, the zygote ends.
        assert process.wait(timeout=10) in (0, 1)
    finally:
        process.kill()
        process.wait()


def test_a_worker_that_dies_before_announcing_itself_fails_its_fork() -> None:
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    async def scenario() -> None:
        zygote = Zygote(ours, pid=0)
        peer.send(zygote_module.READY)
        await asyncio.wait_for(zygote.ready, 5)
        fork = asyncio.ensure_future(zygote.fork())
        await asyncio.sleep(0)
        op, tag = zygote_module.REQUEST.unpack(peer.recv(64))
        assert op == zygote_module.OP_FORK
        # The OOM killer took the new worker before it sent its channel.
        peer.send(zygote_module.EXITED.pack(zygote_module.OP_EXITED, tag, 4242, signal.SIGKILL, 0.0, 0))
        with pytest.raises(SandboxDamaged, match="before it started"):
            await asyncio.wait_for(fork, 5)
        # Another fork is answered as usual.
        fork = asyncio.ensure_future(zygote.fork())
        await asyncio.sleep(0)
        _op, tag = zygote_module.REQUEST.unpack(peer.recv(64))
        channel, kept = socket.socketpair()
        socket.send_fds(peer, [zygote_module.FORKED.pack(zygote_module.OP_FORKED, tag, 4343)], [kept.fileno()])
        kept.close()
        pid, received, _exited = await asyncio.wait_for(fork, 5)
        assert pid == 4343
        channel.sendall(b"x")
        assert received.recv(1) == b"x"
        received.close()
        channel.close()

    asyncio.run(scenario())
    ours.close()
    peer.close()


def test_the_zygote_hanging_up_fails_waiting_forks() -> None:
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    async def scenario() -> None:
        zygote = Zygote(ours, pid=0)
        peer.send(zygote_module.READY)
        await asyncio.wait_for(zygote.ready, 5)
        fork = asyncio.ensure_future(zygote.fork())
        await asyncio.sleep(0)
        peer.close()
        with pytest.raises(SandboxDamaged, match="zygote exited"):
            await asyncio.wait_for(fork, 5)
        assert not zygote.alive

    asyncio.run(scenario())
    ours.close()
