"""verl 0.9.1's agent loop calling sandboxd's tools, end to end; run by tests/integration/test_verl_tools.py.

Not a test module (pytest does not collect it): it runs in verl's environment (.venv-verl) as a subprocess, from
the repository root (so ``examples/verl_tools.yaml`` resolves as it does for a user there), with SANDBOXD_ADDRESS
set to the test's daemon. It composes verl's ``ppo_trainer.yaml`` with docs/client.md's "verl tools" lines, makes
verl's own ``AgentLoopWorker`` from that config (which loads the tools with verl's ``load_all_tools``), and has it
roll out a batch: verl's ``ToolAgentLoop`` renders the tool schemas with the model's chat template, parses each
turn's Hermes tool call (``multi_turn.format``'s default), calls the tool, and appends its answer to the context.

The one stand-in is the LLM server (vLLM or SGLang on a GPU): :class:`ScriptedServer` answers each turn with the
tokens of a scripted assistant turn: python tool call, bash tool call, final answer. At the last turn, once every
trajectory is there, it asks the daemon what sessions are open and how many cells each ran. It asserts nothing: it
prints one JSON object (the last line of stdout) and the test asserts on that.

Usage: python verl_tool_checks.py REPO_ROOT MODEL_DIR
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import verl
from hydra import compose, initialize_config_dir
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.workers.rollout.replica import TokenOutput

# docs/client.md's "verl tools" block: one override a line.
DOC_LINE = re.compile(r"^(actor_rollout_ref\.rollout\.[\w.]+=\S+)$")
PROMPT_LENGTH, RESPONSE_LENGTH = 2048, 1024
QUESTIONS = {"What is 6 * 7?": "6 * 7", "What is 6 * 8?": "6 * 8"}


def doc_lines(client_doc: Path) -> list[str]:
    section = client_doc.read_text().split("### verl tools", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [m.group(1) for line in block.splitlines() if (m := DOC_LINE.match(line.strip()))]


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedServer:
    """verl's LLM server client (``generate``) answering with scripted turns, not a model's."""

    def __init__(self, tokenizer: Any, sessions: pb_grpc.SessionsStub, trajectories: int) -> None:
        self.tokenizer, self.sessions = tokenizer, sessions
        self.turns: list[dict[str, Any]] = []
        self.cells_at_last_turn: list[list[int]] = []
        # The trajectories run at once: each waits at its last turn for the others, so that every session is
        # open, and done with its tool calls, when the daemon is asked.
        self._at_last_turn, self._all_there = 0, asyncio.Event()
        self._trajectories = trajectories

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        context = self.tokenizer.decode(prompt_ids)
        answers = [part.split("\n</tool_response>", 1)[0] for part in context.split("<tool_response>\n")[1:]]
        if not answers:
            product = next(expr for question, expr in QUESTIONS.items() if question in context)
            code = f"with open('proof.txt', 'w') as f:\n    f.write(str({product}))\n{product}"
            text = tool_call("python", code=code)
        elif len(answers) == 1:
            text = tool_call("bash", command="cat proof.txt")
        else:
            self._at_last_turn += 1
            if self._at_last_turn == self._trajectories:
                self._all_there.set()
            await asyncio.wait_for(self._all_there.wait(), timeout=60)
            listed = await self.sessions.List(pb.ListSessionsRequest(), timeout=10)
            self.cells_at_last_turn.append(sorted(s.cells_run for s in listed.sessions))
            text = f"The answer is \\boxed{{{answers[-1]}}}."
        ids = self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        self.turns.append({"request_id": request_id, "text": text, "tokens": len(ids)})
        return TokenOutput(token_ids=ids)


async def rollout(repo: Path, model: Path) -> dict[str, Any]:
    import sandboxd_client

    out: dict[str, Any] = {"verl": verl.__version__, "doc_lines": doc_lines(repo / "docs" / "client.md"),
                           "client": sandboxd_client.__file__}
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            *out["doc_lines"],
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.name=vllm",  # a user's choice of server, mandatory; none is started here
            f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
            f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
        ])
    channel = grpc.aio.insecure_channel(os.environ["SANDBOXD_ADDRESS"])
    sessions = pb_grpc.SessionsStub(channel)

    async def open_sessions() -> int:
        return len((await sessions.List(pb.ListSessionsRequest(), timeout=10)).sessions)

    before = await open_sessions()
    server = ScriptedServer(None, sessions, trajectories=len(QUESTIONS))
    worker = AgentLoopWorker(config, llm_client=server)  # our server, duck-typed
    server.tokenizer = worker.tokenizer
    out["tools"] = sorted(tool.name for tool in worker.tools)
    out["tool_classes"] = sorted({f"{type(t).__module__}.{type(t).__qualname__}" for t in worker.tools})
    questions = list(QUESTIONS)
    batch = DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([[{"role": "user", "content": q}] for q in questions], dtype=object),
        "index": np.arange(len(questions)),
        "data_source": np.array(["my_org/tool_math"] * len(questions), dtype=object),
    })
    result = await worker.generate_sequences(batch)
    out["agent_name"] = [str(name) for name in result.non_tensor_batch["agent_name"]]
    out["num_turns"] = [int(n) for n in result.non_tensor_batch["__num_turns__"]]
    out["responses"], out["masked_tokens"] = [], []
    for i in range(len(questions)):
        valid = result.batch["attention_mask"][i, PROMPT_LENGTH:].bool()
        out["responses"].append(worker.tokenizer.decode(result.batch["responses"][i][valid]))
        out["masked_tokens"].append(int(result.batch["response_mask"][i].sum()))
    out["turns"] = server.turns
    out["cells_at_last_turn"] = server.cells_at_last_turn
    out["sessions_before"] = before
    del result, batch
    gc.collect()
    for _ in range(50):  # a finished trajectory's finalizer schedules its session's close on this loop
        await asyncio.sleep(0.1)
        if await open_sessions() == before:
            break
    out["sessions_after"] = await open_sessions() - before
    await channel.close()
    return out


def main() -> None:
    repo, model = Path(sys.argv[1]), Path(sys.argv[2])
    os.chdir(repo)
    print(json.dumps(asyncio.run(rollout(repo, model)), default=repr))


if __name__ == "__main__":
    main()
