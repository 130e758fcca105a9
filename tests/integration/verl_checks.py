"""verl 0.9.1's own code against a real daemon; run by tests/integration/test_verl.py in verl's environment.

Not a test module (pytest does not collect it): verl cannot be installed beside
TRL's transformers pin, so scripts/setup.sh gives it an environment of its own
(.venv-verl) and the tests run this file there as a subprocess, with
SANDBOXD_ADDRESS set to the test's daemon. It takes the README's and
docs/client.md's command-line lines themselves, composes verl's
``ppo_trainer.yaml`` with them through Hydra, and scores through verl's own
loader and reward managers. It asserts nothing: it prints one JSON object of
what verl did, and the test asserts on that.

Usage: python verl_checks.py REPO_ROOT ROWS_JSON
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager
from verl.utils.reward_score import default_compute_score

# One override per line, as the docs give them (a trailing shell backslash dropped).
OVERRIDE = re.compile(r"^\s*(\+?reward\.custom_reward_function\.[\w.]+=\S+?)\s*\\?$")
PROMPT_LENGTH, RESPONSE_LENGTH = 4, 160


def doc_overrides(path: Path) -> list[str]:
    return [m.group(1) for line in path.read_text().splitlines() if (m := OVERRIDE.match(line))]


def trainer_config(overrides: list[str]) -> Any:
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def byte_tokenizer() -> Any:
    """A real tokenizer, made here: byte-level, no merges, so any text decodes back to itself."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    vocab["<pad>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


def batch_of(rows: list[dict[str, Any]], tokenizer: Any) -> tuple[DataProto, list[int]]:
    """A DataProto as verl's rollout leaves it: left-padded prompts, right-padded responses."""
    pad = tokenizer.pad_token_id
    prompts = torch.full((len(rows), PROMPT_LENGTH), pad)
    responses = torch.full((len(rows), RESPONSE_LENGTH), pad)
    mask = torch.zeros((len(rows), PROMPT_LENGTH + RESPONSE_LENGTH), dtype=torch.long)
    lengths = []
    for i, row in enumerate(rows):
        ids = tokenizer(row["solution_str"], add_special_tokens=False)["input_ids"]
        assert len(ids) <= RESPONSE_LENGTH, len(ids)
        prompts[i, -1] = 0
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, PROMPT_LENGTH - 1 : PROMPT_LENGTH + len(ids)] = 1
        lengths.append(len(ids))
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={
            "data_source": np.array([row["data_source"] for row in rows], dtype=object),
            "reward_model": np.array([{"ground_truth": row["ground_truth"]} for row in rows], dtype=object),
            "extra_info": np.array([dict(row["extra_info"]) for row in rows], dtype=object),
        },
    )
    return data, lengths


async def reward_loop(config: Any, tokenizer: Any, data: DataProto) -> tuple[list[Any], list[list[float]], str]:
    """What 0.9.1's reward loop worker does with a batch: run_single per sample, gathered; then rm_scores."""
    manager = load_reward_manager(config, tokenizer)
    outs = await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))
    rm_scores = type(manager).assemble_rm_scores(data, [out["reward_score"] for out in outs])
    return outs, rm_scores.tolist(), type(manager).__name__


async def tool_calls(repo: Path) -> dict[str, Any]:
    """examples/verl_tools.yaml through verl's tool registry, called through ToolAgentLoop._call_tool itself."""
    import gc
    import os
    from types import SimpleNamespace
    from uuid import uuid4

    import grpc
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc
    from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall
    from verl.tools.tool_registry import initialize_tools_from_config

    tools = initialize_tools_from_config(str(repo / "examples" / "verl_tools.yaml"))
    # The attributes _call_tool reads of its loop, as the rollout config sets them.
    loop = SimpleNamespace(tools={tool.name: tool for tool in tools}, max_tool_response_length=8192,
                           tool_response_truncate_side="middle")
    channel = grpc.aio.insecure_channel(os.environ["SANDBOXD_ADDRESS"])
    sessions = pb_grpc.SessionsStub(channel)

    async def open_sessions() -> int:
        return len((await sessions.List(pb.ListSessionsRequest(), timeout=10)).sessions)

    def trajectory() -> Any:
        return AgentData(messages=[], image_data=[], video_data=[], audio_data=None, mm_processor_kwargs=None,
                         metrics={}, request_id=uuid4().hex, tools_kwargs={})

    async def call(data: Any, name: str, **arguments: Any) -> Any:
        response, reward, metrics = await ToolAgentLoop._call_tool(
            loop, FunctionCall(name=name, arguments=json.dumps(arguments)), {}, data)
        return [response.text, reward, metrics]

    out: dict[str, Any] = {"names": sorted(loop.tools), "schemas": {
        tool.name: tool.get_openai_tool_schema().model_dump(exclude_none=True) for tool in tools}}
    before = await open_sessions()
    first, second = trajectory(), trajectory()
    out["calls"] = [
        await call(first, "python", code="x = 41\nx + 1"),
        await call(first, "python", code="x"),
        await call(first, "bash", command="echo hi > note.txt; cat note.txt"),
        await call(first, "python", code="open('note.txt').read()"),
        await call(first, "bash", command="exit 3"),
        await call(second, "python", code="x"),
        await call(first, "python", code=7),
    ]
    out["sessions_during"] = await open_sessions() - before
    del first, second
    gc.collect()
    for _ in range(50):  # the finalizers schedule the closes on this loop
        await asyncio.sleep(0.1)
        if await open_sessions() == before:
            break
    out["sessions_after"] = await open_sessions() - before
    # The older contract: create at the start of a trajectory, execute without agent_data, release at its end.
    python = loop.tools["python"]
    instance_id, _ = await python.create()
    response, _, _ = await python.execute(instance_id, {"code": "y = 5"})
    response, _, _ = await python.execute(instance_id, {"code": "y * 2"})
    out["instance_call"] = response.text
    out["instance_sessions"] = await open_sessions() - before
    out["instance_reward"] = await python.calc_reward(instance_id)
    await python.release(instance_id)
    out["instance_sessions_after"] = await open_sessions() - before
    await channel.close()
    return out


def main() -> None:
    repo, rows = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    out: dict[str, Any] = {"verl": verl.__version__}
    readme, client_doc = doc_overrides(repo / "README.md"), doc_overrides(repo / "docs" / "client.md")
    out["readme_overrides"], out["client_doc_overrides"] = readme, client_doc

    config = trainer_config(client_doc)
    out["reward_config"] = OmegaConf.to_container(config.reward.custom_reward_function, resolve=True)
    fn = get_custom_reward_fn(config)
    import sandboxd_client.verl as sandboxd_verl

    # docs/client.md's line for data sources of one's own, through Hydra too.
    kinds = re.search(r"\+reward\.custom_reward_function\.reward_kwargs\.data_source_kinds=\{[^`]*\}",
                      (repo / "docs" / "client.md").read_text())
    out["kinds_override"] = kinds.group(0) if kinds else None
    if kinds:
        kinds_fn = get_custom_reward_fn(trainer_config([*client_doc, kinds.group(0)]))
        out["kinds_score"] = kinds_fn(data_source="my_org/olympiad-2025", solution_str="\\boxed{3}",
                                      ground_truth="3", extra_info={}) if kinds_fn else None

    out["loaded_is_ours"] = fn is not None and fn.args[0] is sandboxd_verl.compute_score
    out["readme_loaded_is_ours"] = (
        (readme_fn := get_custom_reward_fn(trainer_config(readme))) is not None
        and readme_fn.args[0] is sandboxd_verl.compute_score
    )
    # The keys the docs gave before: accepted, and ignored by main_ppo's loader.
    old = trainer_config(["+custom_reward_function.path=pkg://sandboxd_client.verl",
                          "+custom_reward_function.name=compute_score"])
    out["old_keys_loaded"] = get_custom_reward_fn(old) is not None
    try:
        get_reward_manager_cls("batch")
        out["batch_manager"] = "exists"
    except ValueError as e:
        out["batch_manager"] = str(e)
    out["managers"] = {name: get_reward_manager_cls(name).__name__
                       for name in ("naive", "dapo", "gdpo", "rate_limited", "remote")}

    # examples/verl_reward.py by file path: its register_data_source() reaches the function it hands verl.
    example_fn = get_custom_reward_fn(OmegaConf.merge(config, {"reward": {"custom_reward_function": {
        "path": str(repo / "examples" / "verl_reward.py")}}}))
    out["example_score"] = example_fn(data_source="my_org/olympiad-2025", solution_str="\\boxed{3}",
                                      ground_truth="3", extra_info={})

    # The remote manager ships the function to Ray actors with cloudpickle.
    from ray import cloudpickle

    out["pickles_by_name"] = len(cloudpickle.dumps(fn)) < 10_000
    by_file = get_custom_reward_fn(OmegaConf.merge(config, {"reward": {"custom_reward_function": {
        "path": sandboxd_verl.__file__}}}))
    try:
        cloudpickle.dumps(by_file)
        out["pickles_by_file"] = "ok"
    except Exception as e:  # what the remote manager met
        out["pickles_by_file"] = f"{type(e).__name__}: {e}"

    # Scoring: verl's loaded function called as the managers call it, and verl's own scorer on the same rows.
    out["scores"] = [
        fn(data_source=r["data_source"], solution_str=r["solution_str"], ground_truth=r["ground_truth"],
           extra_info={**r["extra_info"], "num_turns": None, "rollout_reward_scores": {}})
        for r in rows
    ]
    out["verl_own"] = [
        float(default_compute_score(r["data_source"], r["solution_str"], r["ground_truth"], r["extra_info"]))
        if r.get("verl_scores_it") else None
        for r in rows
    ]

    tokenizer = byte_tokenizer()
    data, lengths = batch_of(rows, tokenizer)
    outs, rm_scores, manager = asyncio.run(reward_loop(config, tokenizer, data))
    out["reward_loop"] = {"manager": manager, "outs": outs, "rm_scores": rm_scores,
                          "last_token": [n - 1 for n in lengths]}
    async_config = OmegaConf.merge(config, {"reward": {"custom_reward_function": {"name": "compute_score_async"}}})
    outs, _, _ = asyncio.run(reward_loop(async_config, tokenizer, data))
    out["reward_loop_async"] = [o["reward_score"] for o in outs]
    out["naive_is_registered"] = get_reward_manager_cls("naive") is NaiveRewardManager
    try:  # the reward checks above stand on their own
        out["tools"] = asyncio.run(tool_calls(repo))
    except Exception:
        import traceback

        out["tools"] = {"error": traceback.format_exc()}
    print(json.dumps(out, default=repr))


if __name__ == "__main__":
    main()
