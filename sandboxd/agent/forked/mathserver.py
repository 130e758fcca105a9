"""A math server's process: verdict after verdict from one warm verifier (host/mathservers.py starts it)."""

from __future__ import annotations

import socket
from typing import Any, NoReturn, cast

from sandboxd.agent.forked.serving import serve_requests
from sandboxd.agent.messages import MathRequest
from sandboxd.agent.protocol import recv_frame
from sandboxd.verifiers import math as math_verifier

SERVER_NAME = b"sandboxd-math"


def serve(channel: socket.socket, results: socket.socket) -> NoReturn:
    """Worker side: one verdict per request frame until the channel closes."""
    def verify(job: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if job.get("op", "verify") == "warm":
            # Runs the samples here, so the pages they touch are this
            # server's own before its first job (a fresh fork pays a
            # copy-on-write fault per page of sympy's heap it writes).
            math_verifier.warm()
            return {"ok": True}
        # From the host's mathservers.MathServer.verify, in our own process.
        request = cast("MathRequest", job)
        return {"result": math_verifier.verify(request["completion"], request["ground_truth"],
                                               extraction=request.get("extraction", "auto"),
                                               float_tolerance=request.get("tolerance", 1e-6))}

    serve_requests(SERVER_NAME, lambda: (recv_frame(channel), []), verify, results)
