"""verl 0.9.1's own code against a real daemon; run by tests/integration/test_verl.py in verl's environment.

Not a test module (pytest does not collect it): verl cannot be installed beside
TRL's transformers pin, so scripts/setup.sh gives it an environment of its own
(.venv-verl) and the tests run this file there as a subprocess, with
SANDBOXD_ADDRESS set to the test's daemon. It takes the README's and
docs/client.md's command-line lines themselves, composes verl's
``ppo_trainer.yaml`` with them through Hydra, and scores through verl's own
loader, its reward loop on a local Ray and its agent loop. It asserts nothing: it prints one JSON object of
what verl did, and the test asserts on that.

Usage: python verl_checks.py REPO_ROOT ROWS_JSON (``{"rows": [...], "shapes": [...]}``)
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.reward_score import default_compute_score

# A Hydra override as the docs and examples write one for verl: a key under one of ppo_trainer.yaml's sections (the
# legacy top-level custom_reward_function and reward_model too, which 0.9.1's main_ppo ignores), a value.
OVERRIDE = re.compile(r"\+?(?:reward|reward_model|custom_reward_function|actor_rollout_ref|algorithm|critic|data"
                      r"|trainer)\.[\w.]+=[^\s`\\]+")
# Where verl's settings are given to users.
SNIPPET_FILES = ("README.md", "docs/client.md", "examples/verl_reward.py", "examples/verl_tools.yaml")
PROMPT_LENGTH, RESPONSE_LENGTH = 4, 160
# The scripted model's chat template: roles and contents, one message a line.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def doc_snippets(repo: Path) -> list[dict[str, Any]]:
    """Every verl override of SNIPPET_FILES, in groups as a user takes them.

    A line that is one override (in a code block, a docstring or a comment; a shell's trailing
    backslash dropped) joins the override on the line before it: they go on one command line.
    An override in backticks in prose is a group of its own.
    """
    groups: list[dict[str, Any]] = []
    for name in SNIPPET_FILES:
        for number, line in enumerate((repo / name).read_text().splitlines(), 1):
            bare = line.strip().lstrip("#").strip().removesuffix("\\").strip()
            if OVERRIDE.fullmatch(bare):
                last = groups[-1] if groups else None
                if last and last["file"] == name and last["kind"] == "lines" and last["last"] == number - 1:
                    last["lines"].append(bare)
                    last["last"] = number
                else:
                    groups.append({"file": name, "line": number, "last": number, "kind": "lines", "lines": [bare]})
                continue
            groups.extend({"file": name, "line": number, "last": number, "kind": "inline", "lines": [span]}
                          for span in re.findall(r"`([^`]+)`", line) if OVERRIDE.fullmatch(span))
    return groups


def doc_overrides(repo: Path, name: str) -> list[str]:
    """The first group of lines a file gives: the README's and docs/client.md's reward settings."""
    return next(group["lines"] for group in doc_snippets(repo) if group["file"] == name and group["kind"] == "lines")


def resolved(line: str, repo: Path) -> str:
    """A path the docs give relative to the checkout (examples/...), made absolute: users run from theirs."""
    key, value = line.split("=", 1)
    if key.endswith(("path", "_path")) and not value.startswith(("pkg://", "/")):
        return f"{key}={repo / value}"
    return line


# What each reward snippet is asked to score: (data_source, solution_str, ground_truth).
SNIPPET_ROWS = {
    "gsm8k": ("openai/gsm8k", "so the answer is \\boxed{72}", "72"),
    "own_data_source": ("my_org/olympiad-2025", "\\boxed{3}", "3"),
    "float_output": ("codecontests", "```python\nprint(1 / 3)\n```", {"inputs": [""], "outputs": ["0.333333\n"]}),
}


def group_lines(group: dict[str, Any], repo: Path) -> list[str]:
    return [resolved(line, repo) for line in group["lines"]]


def plain(value: Any) -> Any:
    """A config node or a parsed override value as plain Python, to compare."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def check_snippet(group: dict[str, Any], repo: Path, base: list[str]) -> dict[str, Any]:
    """Compose verl's ppo_trainer.yaml with a group as written, check that each key has the value it gives, and
    use it: a reward setting loads a function through verl's loader, which scores SNIPPET_ROWS."""
    import sandboxd_client.verl as sandboxd_verl

    lines = group_lines(group, repo)
    keys = {line.split("=", 1)[0].lstrip("+") for line in lines}
    if any(".custom_reward_function." in line for line in lines):
        # A line of reward_kwargs, or of the function's name, is added to the docs' own lines.
        lines = [line for line in base if line.split("=", 1)[0].lstrip("+") not in keys] + lines
    out: dict[str, Any] = {"where": f"{group['file']}:{group['line']}", "lines": group["lines"]}
    config = trainer_config(lines)
    # Each key as Hydra's own parser reads the line from a command line, found in the composed config.
    parser = OverridesParser.create()
    given = {override.key_or_group: override.value() for override in parser.parse_overrides(group_lines(group, repo))}
    out["values_ok"] = all(
        plain(OmegaConf.select(config, key)) == plain(value) for key, value in given.items())
    if "reward.reward_manager.name" in keys:
        out["manager"] = get_reward_manager_cls(config.reward.reward_manager.name).__name__
    if "actor_rollout_ref.rollout.multi_turn.tool_config_path" in keys:
        out["tool_config_path"] = config.actor_rollout_ref.rollout.multi_turn.tool_config_path
    if any(".custom_reward_function." in line for line in lines):
        fn = get_custom_reward_fn(config)
        raw = fn.args[0] if fn is not None else None
        out["function"] = getattr(raw, "__name__", None)
        out["ours"] = raw in (sandboxd_verl.compute_score, sandboxd_verl.compute_score_async)
        out["scores"] = {}
        for what, (data_source, solution, ground_truth) in SNIPPET_ROWS.items():
            try:
                score = fn(data_source=data_source, solution_str=solution, ground_truth=ground_truth, extra_info={})
                if asyncio.iscoroutine(score):
                    score = asyncio.run(score)
                out["scores"][what] = score["score"]
            except ValueError as exc:  # a data source the setting does not map
                out["scores"][what] = f"ValueError: {exc}"[:200]
    return out


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


def model_folder(tokenizer: Any, folder: Path) -> Path:
    """What ``actor_rollout_ref.model.path`` names: the tokenizer, with a chat template, and a model config.

    No weights: verl's reward loop and agent loop workers load the tokenizer and the config from it, and the
    model is the scripted server below.
    """
    from transformers import Qwen2Config

    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, architectures=["Qwen2ForCausalLM"])
    config.save_pretrained(folder)
    return folder


def with_config(config: Any, **changes: Any) -> Any:
    """``config`` with dotted keys set, as on the command line."""
    return OmegaConf.merge(config, OmegaConf.from_dotlist([f"{key}={value}" for key, value in changes.items()]))


def rm_result(out: DataProto, lengths: list[int]) -> dict[str, Any]:
    """What a batch's rewards came back as: the score at each sample's last valid response token, how many
    other tokens got one, and the reward_extra_info columns."""
    rm_scores = out.batch["rm_scores"]
    at_last = [rm_scores[i, n - 1].item() for i, n in enumerate(lengths)]
    elsewhere = [int((rm_scores[i] != 0).sum().item()) - (value != 0) for i, value in enumerate(at_last)]
    extra = {key: np.asarray(value).tolist() for key, value in out.non_tensor_batch.items()}
    return {"at_last": at_last, "elsewhere": elsewhere, "extra": extra,
            "keys": list(out.meta_info.get("reward_extra_keys", []))}


def stop_workers(manager: Any) -> None:
    """Kill a RewardLoopManager's workers and wait until their names (reward_loop_worker_N), which the next
    manager takes again, are free."""
    import ray

    for worker in manager.reward_loop_workers:
        ray.kill(worker)
    deadline = time.monotonic() + 60
    for i in range(len(manager.reward_loop_workers)):
        while True:
            try:
                ray.get_actor(f"reward_loop_worker_{i}")
            except ValueError:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"reward_loop_worker_{i} still alive 60 s after ray.kill")
            time.sleep(0.1)


class ScriptedModel:
    """The rollout server of verl's agent loop, scripted: a prompt that names row N is answered with row N's
    solution_str. verl's ``LLMServerClient.generate`` contract; everything around it is verl's own."""

    def __init__(self, tokenizer: Any, answers: dict[str, str]) -> None:
        self.tokenizer, self.answers = tokenizer, answers

    async def generate(self, *, prompt_ids: list[int], **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        prompt = self.tokenizer.decode(prompt_ids)
        answer = next(answer for key, answer in self.answers.items() if key in prompt)
        return TokenOutput(token_ids=self.tokenizer(answer, add_special_tokens=False)["input_ids"],
                           stop_reason="completed")


async def agent_loop(config: Any, reward_workers: list[Any], rows: list[dict[str, Any]], tokenizer: Any) -> Any:
    """verl's AgentLoopWorker on a batch of prompts, its default single-turn loop, the reward loop's Ray workers
    scoring each sample as it finishes (``_compute_score``: one ``compute_score.remote`` per sample)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    answers = {f"question {i}:": row["solution_str"] for i, row in enumerate(rows)}
    worker = AgentLoopWorker(config, ScriptedModel(tokenizer, answers), reward_loop_worker_handles=reward_workers)
    batch = DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([[{"role": "user", "content": f"question {i}: solve it"}] for i in range(len(rows))],
                               dtype=object),
        "data_source": np.array([row["data_source"] for row in rows], dtype=object),
        "reward_model": np.array([{"ground_truth": row["ground_truth"]} for row in rows], dtype=object),
        "extra_info": np.array([dict(row["extra_info"]) for row in rows], dtype=object),
    })
    out = await worker.generate_sequences(batch)
    prompt_length = out.batch["prompts"].size(1)
    lengths = out.batch["attention_mask"][:, prompt_length:].sum(dim=1).tolist()
    responses = [tokenizer.decode(out.batch["responses"][i, :n]) for i, n in enumerate(lengths)]
    return {**rm_result(out, lengths), "responses": responses}


class ToolUsingModel:
    """A scripted model that uses the tools of examples/verl_tools.yaml in hermes format, as verl's default
    multi-turn parser reads them: Python computes 6 * 7 and writes it to a file, bash reads the file, and the
    answer is what bash printed. Its score shows that both tools ran, in one sandbox."""

    CALLS = [{"name": "python", "arguments": {"code": "x = 6 * 7\nopen('answer.txt', 'w').write(str(x))\nx"}},
             {"name": "bash", "arguments": {"command": "cat answer.txt"}}]

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def generate(self, *, prompt_ids: list[int], **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        prompt = self.tokenizer.decode(prompt_ids)
        turn = prompt.count("tool: ")  # CHAT_TEMPLATE's tool messages so far
        if turn < len(self.CALLS):
            text = f"<tool_call>{json.dumps(self.CALLS[turn])}</tool_call>"
        else:
            printed = prompt.rsplit("tool: ", 1)[1].split("\n")[0]
            text = f"The file says \\boxed{{{printed}}}"
        return TokenOutput(token_ids=self.tokenizer(text, add_special_tokens=False)["input_ids"],
                           stop_reason="completed")


async def tool_agent_loop(config: Any, reward_workers: list[Any], tokenizer: Any, tool_lines: list[str]) -> Any:
    """verl's ToolAgentLoop with docs/client.md's lines (examples/verl_tools.yaml, loaded by AgentLoopWorker),
    the scripted ToolUsingModel, the reward from the reward loop's Ray workers."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = with_config(OmegaConf.merge(config, OmegaConf.from_dotlist(tool_lines)),
                         **{"actor_rollout_ref.rollout.response_length": 512})
    worker = AgentLoopWorker(config, ToolUsingModel(tokenizer), reward_loop_worker_handles=reward_workers)
    batch = DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([[{"role": "user", "content": "What is 6 * 7?"}]], dtype=object),
        "agent_name": np.array(["tool_agent"], dtype=object),
        "data_source": np.array(["openai/gsm8k"], dtype=object),
        "reward_model": np.array([{"ground_truth": "42"}], dtype=object),
        "extra_info": np.array([{}], dtype=object),
    })
    before = await open_sessions()
    out = await worker.generate_sequences(batch)
    prompt_length = out.batch["prompts"].size(1)
    lengths = out.batch["attention_mask"][:, prompt_length:].sum(dim=1).tolist()
    # The trajectory is over: its session is closed from the tool's finalizer, on this (the worker's) loop.
    gc.collect()
    for _ in range(100):
        if await open_sessions() == before:
            break
        await asyncio.sleep(0.1)
    return {**rm_result(out, lengths), "response": tokenizer.decode(out.batch["responses"][0, : lengths[0]]),
            "num_turns": int(out.non_tensor_batch["__num_turns__"][0]),
            "tool_tokens": int(lengths[0] - out.batch["response_mask"][0].sum().item()),
            "sessions_left": await open_sessions() - before}


async def open_sessions() -> int:
    """How many sessions the daemon holds open."""
    import grpc
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(os.environ["SANDBOXD_ADDRESS"]) as channel:
        return len((await pb_grpc.SessionsStub(channel).List(pb.ListSessionsRequest(), timeout=10)).sessions)


def start_ray() -> None:
    """A local Ray, given time to start on a loaded machine, and started again when it still does not.

    Ray 2.60 waits 30 s for the GCS to write its port (RAY_gcs_server_port_wait_time_s) and a fixed
    30 s for the raylet to register (ray/_private/node.py); a 2-core machine under a load of 20 missed
    each ("Timed out waiting for file .../gcs_server_port", "The current node timed out during
    startup"), failing the module. Logical CPUs: each reward worker actor takes one to be placed, the
    remote manager's actors one each.
    """
    import ray

    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    for attempt in range(3):
        try:
            ray.init(num_cpus=4, include_dashboard=False)
            return
        except Exception as exc:
            if "timed out" not in str(exc).lower() or attempt == 2:
                raise
            print(f"verl_checks: Ray did not start ({exc}); again", file=sys.stderr)
            ray.shutdown()


def on_ray(config: Any, tokenizer: Any, rows: list[dict[str, Any]], folder: Path,
           tool_lines: list[str]) -> dict[str, Any]:
    """0.9.1's reward loop as main_ppo runs it, on a local Ray (one session for all of it; 2 cores start it in
    about 10 s): RewardLoopManager.compute_rm_score with compute_score (2 workers, the batch split between
    them), with compute_score_async, and with the remote manager; and the agent loop's per-sample path, single
    turn and with the tools."""
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    config = with_config(config, **{"actor_rollout_ref.model.path": model_folder(tokenizer, folder / "model"),
                                    "actor_rollout_ref.rollout.name": "vllm",  # a name only: no server starts
                                    "actor_rollout_ref.rollout.prompt_length": PROMPT_LENGTH * 16,
                                    "actor_rollout_ref.rollout.response_length": RESPONSE_LENGTH})
    data, lengths = batch_of(rows, tokenizer)
    out: dict[str, Any] = {"seconds": {}}
    started = time.monotonic()

    def lap(stage: str) -> None:
        out["seconds"][stage] = round(time.monotonic() - started - sum(out["seconds"].values()), 1)

    start_ray()
    try:

        @ray.remote
        def seen_by_a_worker() -> list[str | None]:
            import sandboxd_client

            return [sandboxd_client.__file__, os.environ.get("SANDBOXD_ADDRESS")]

        out["worker_sees"] = ray.get(seen_by_a_worker.remote())
        lap("ray_start")
        manager = RewardLoopManager(with_config(config, **{"reward.num_workers": 2}))
        out["naive"] = rm_result(manager.compute_rm_score(data), lengths)
        lap("naive")
        out["agent_loop"] = asyncio.run(agent_loop(config, manager.reward_loop_worker_handles, rows, tokenizer))
        lap("agent_loop")
        out["tool_agent_loop"] = asyncio.run(tool_agent_loop(config, manager.reward_loop_worker_handles, tokenizer,
                                                             tool_lines))
        lap("tool_agent_loop")
        stop_workers(manager)
        manager = RewardLoopManager(with_config(config, **{
            "reward.num_workers": 1, "reward.custom_reward_function.name": "compute_score_async"}))
        out["naive_async"] = rm_result(manager.compute_rm_score(data), lengths)
        stop_workers(manager)
        lap("naive_async")
        manager = RewardLoopManager(with_config(config, **{
            "reward.num_workers": 1, "reward.reward_manager.name": "remote"}))
        out["remote"] = rm_result(manager.compute_rm_score(data), lengths)
        stop_workers(manager)
        lap("remote")
    finally:
        ray.shutdown()
    return out


async def tool_calls(repo: Path) -> dict[str, Any]:
    """examples/verl_tools.yaml through verl's tool registry, called through ToolAgentLoop._call_tool itself."""
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


def shape_verdicts(fn: Any, shapes: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each shape row scored by our function as verl loaded it, and by verl's own scorer ("judge")."""
    import base64
    import pickle
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    from verl.utils.reward_score.prime_code.utils import check_correctness

    def ours(row: dict[str, Any]) -> Any:
        return fn(data_source=row["data_source"], solution_str=row["solution_str"],
                  ground_truth=row["ground_truth"], extra_info={})

    def verls(row: dict[str, Any]) -> dict[str, Any]:
        if row["judge"] == "prime_code":
            score = default_compute_score(row["data_source"], row["solution_str"], row["ground_truth"], {})
            return {"passed": score == 1.0, "fraction": float(score)}
        # verl's r1 recipe, recipe/r1/tasks/livecodebench.py (not in the wheel), line for line: the row
        # decompressed (our own test data, so pickle.loads), prime_code's check_correctness on every case,
        # passed when all pass.
        in_outs = json.loads(pickle.loads(zlib.decompress(base64.b64decode(row["ground_truth"]))))
        solution = row["solution_str"].split("```python")[-1].split("```")[0]
        results, _ = check_correctness(in_outs=in_outs, generation=solution, timeout=6, debug=False)
        return {"passed": all(result is True for result in results), "fraction": None}

    # Threads: prime_code forks a process (and a multiprocessing Manager) per run.
    with ThreadPoolExecutor(4) as pool:
        return {"ours": list(pool.map(ours, shapes)), "verl": list(pool.map(verls, shapes))}


def main() -> None:
    repo, given = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    rows = given["rows"]
    out: dict[str, Any] = {"verl": verl.__version__}
    readme, client_doc = doc_overrides(repo, "README.md"), doc_overrides(repo, "docs/client.md")
    out["readme_overrides"], out["client_doc_overrides"] = readme, client_doc
    # Every verl setting the docs and examples give, composed and used as written.
    snippets = doc_snippets(repo)
    import sandboxd_client.verl as sandboxd_verl

    kinds = list(sandboxd_verl.DATA_SOURCE_KINDS)
    out["snippets"] = []
    for group in snippets:
        try:
            out["snippets"].append(check_snippet(group, repo, client_doc))
        except Exception as exc:  # a setting verl refuses: the test names it, the other checks still run
            out["snippets"].append({"where": f"{group['file']}:{group['line']}", "lines": group["lines"],
                                    "error": f"{type(exc).__name__}: {exc}"[:2000]})
        sandboxd_verl.DATA_SOURCE_KINDS[:] = kinds  # examples/verl_reward.py registers a data source at import
    tool_lines = next(group["lines"] for group in snippets
                      if any("multi_turn.tool_config_path" in line for line in group["lines"])
                      and group["kind"] == "lines" and group["file"] == "docs/client.md")

    config = trainer_config(client_doc)
    out["reward_config"] = OmegaConf.to_container(config.reward.custom_reward_function, resolve=True)
    fn = get_custom_reward_fn(config)
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

    # verl's own scorer on the rows it scores itself (prime_code's data sources).
    out["verl_own"] = [
        float(default_compute_score(r["data_source"], r["solution_str"], r["ground_truth"], r["extra_info"]))
        if r.get("verl_scores_it") else None
        for r in rows
    ]

    out["client_file"] = sandboxd_verl.__file__
    out["shapes"] = shape_verdicts(fn, given["shapes"])
    out["ray"] = on_ray(config, byte_tokenizer(), rows, Path.cwd(), [resolved(line, repo) for line in tool_lines])
    try:  # the reward checks above stand on their own
        out["tools"] = asyncio.run(tool_calls(repo))
    except Exception:
        import traceback

        out["tools"] = {"error": traceback.format_exc()}
    print(json.dumps(out, default=repr))


if __name__ == "__main__":
    main()
