"""verl tools backed by sandboxd sessions: a Python interpreter and a bash shell for verl's agent loop.

Declare them in a tool-config YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``; see
``examples/verl_tools.yaml``)::

    tools:
      - class_name: sandboxd_client.verl_tool.SandboxTool
        config: {type: native, kind: python, timeout: 10}
      - class_name: sandboxd_client.verl_tool.SandboxTool
        config: {type: native, kind: bash}

This module imports verl (``verl.tools.base_tool``); the rest of the client does not.

One session per trajectory. verl 0.9.1's ``ToolAgentLoop`` calls ``create``,
``execute`` and ``release`` around every single tool call, passing the
trajectory's ``agent_data``: the session belongs to the trajectory (its
``request_id``), so variables and files persist from call to call and the
``python`` and ``bash`` tools share one sandbox; it closes when the
trajectory's ``agent_data`` is gone. Called the older way, without
``agent_data`` (``create`` at the start of a trajectory, ``release`` at its
end), the session belongs to the instance and ``release`` closes it.
``calc_reward`` is 0.0: the trajectory is scored by the reward function
(``sandboxd_client.verl.compute_score``), not by the tool.

Config keys: ``kind`` (``python``, the default, or ``bash``), ``address``
(else ``$SANDBOXD_ADDRESS``), ``timeout``, ``memory_bytes``,
``idle_timeout`` (the session's limits, docs/sessions.md),
``max_output_chars`` (default 4000), ``client_options``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from ._tools import bash_cell, cell_text
from .client import AsyncSandboxClient, AsyncSession
from .errors import SandboxdError, SessionNotFound

__all__ = ["SandboxTool"]

log = logging.getLogger(__name__)

_SCHEMAS: dict[str, dict[str, Any]] = {
    "python": {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code in a persistent interpreter and return what it printed and the value "
            "of its last line. Variables, functions and imports persist between calls, as in a notebook.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code to run."}},
                "required": ["code"],
            },
        },
    },
    "bash": {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the same sandbox and folder as the Python tool; return its "
            "output. Files persist between calls; each command starts a fresh shell.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The bash command line to run."}},
                "required": ["command"],
            },
        },
    },
}
_ARGUMENT = {"python": "code", "bash": "command"}

# Sessions by owner (a trajectory's request_id, or a tool instance's id), shared by every SandboxTool of the process:
# the python and bash tools of one trajectory run in one sandbox.
_sessions: dict[str, AsyncSession] = {}
_opening: dict[str, asyncio.Lock] = {}
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, AsyncSandboxClient]] = (
    weakref.WeakKeyDictionary()
)


def _close_later(key: str, loop: asyncio.AbstractEventLoop) -> None:
    """The trajectory is gone: close its session on the loop that opened it (a finalizer runs anywhere)."""
    session = _sessions.pop(key, None)
    _opening.pop(key, None)
    if session is None or loop.is_closed():
        return  # the daemon expires it after its idle timeout

    async def close() -> None:
        try:
            await session.close()
        except SandboxdError as e:
            log.debug("sandboxd: closing the session of %s: %s", key, e)

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(lambda: loop.create_task(close()))


class SandboxTool(BaseTool):
    """A ``python`` or ``bash`` tool (config ``kind``) running in the trajectory's sandboxd session."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.kind = str(config.get("kind", "python"))
        if self.kind not in _SCHEMAS:
            raise ValueError(f"SandboxTool kind must be 'python' or 'bash', got {self.kind!r}")
        max_output_chars = int(config.get("max_output_chars", 4000))
        if max_output_chars < 1:
            raise ValueError(f"max_output_chars must be at least 1, got {max_output_chars!r}")
        self.max_output_chars = max_output_chars
        self.address = config.get("address") or None
        self.client_options = dict(config.get("client_options") or {})
        self.limits = {key: config.get(key) for key in ("timeout", "memory_bytes", "idle_timeout")}
        self._owned: set[str] = set()  # instances whose session is theirs (called without agent_data)
        super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(_SCHEMAS[self.kind])

    def _client(self) -> AsyncSandboxClient:
        per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
        key = repr((self.address, sorted(self.client_options.items(), key=lambda kv: kv[0])))
        if key not in per_loop:
            per_loop[key] = AsyncSandboxClient(self.address, **self.client_options)
        return per_loop[key]

    async def _session(self, key: str, owner: object | None) -> AsyncSession:
        lock = _opening.setdefault(key, asyncio.Lock())
        async with lock:  # two tool calls of one trajectory at once open one session
            session = _sessions.get(key)
            if session is None:
                session = await self._client().open_session(
                    "python",
                    timeout=self.limits["timeout"],
                    memory_bytes=self.limits["memory_bytes"],
                    idle_timeout=self.limits["idle_timeout"],
                )
                _sessions[key] = session
                if owner is not None:
                    weakref.finalize(owner, _close_later, key, asyncio.get_running_loop())
            return session

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """A tool instance; its session opens on the first call (a trajectory that calls no tool holds none)."""
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run the call in the trajectory's session; the answer is the cell's output (or its error), capped."""
        agent_data = kwargs.get("agent_data")
        request_id = getattr(agent_data, "request_id", None)
        key = f"trajectory:{request_id}" if request_id else f"instance:{instance_id}"
        if not request_id:
            self._owned.add(instance_id)
        argument = parameters.get(_ARGUMENT[self.kind]) if isinstance(parameters, dict) else None
        if not isinstance(argument, str):
            return ToolResponse(text=f"{self.kind}: give '{_ARGUMENT[self.kind]}' as a string"), 0.0, {}
        session = await self._session(key, agent_data if request_id else None)
        try:
            result = await session.run(argument if self.kind == "python" else bash_cell(argument))
        except SessionNotFound:
            _sessions.pop(key, None)  # expired or lost with its sandbox: the next call opens a fresh one
            raise
        if not result.session_alive:
            _sessions.pop(key, None)
        metrics = {"status": result.status.name, "time_seconds": result.time_seconds}
        return ToolResponse(text=cell_text(result, self.max_output_chars)), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """0.0: the reward function scores the trajectory, not the tool."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Close the instance's own session (a trajectory's closes when the trajectory is gone)."""
        if instance_id not in self._owned:
            return
        self._owned.discard(instance_id)
        _opening.pop(f"instance:{instance_id}", None)
        session = _sessions.pop(f"instance:{instance_id}", None)
        if session is not None:
            try:
                await session.close()
            except SandboxdError as e:
                log.debug("sandboxd: closing the session of instance %s: %s", instance_id, e)
