"""verl 0.9.1's agent loop running sandboxd's tools end to end, against a real daemon.

tests/integration/verl_tool_checks.py runs in verl's environment (.venv-verl, made by scripts/setup.sh): verl's
``AgentLoopWorker``, made from ``ppo_trainer.yaml`` composed with docs/client.md's "verl tools" lines, loads
``examples/verl_tools.yaml`` with verl's own loader, and its ``ToolAgentLoop`` parses each turn's tool call and
runs it in the trajectory's sandboxd session. A scripted LLM server stands in for vLLM (no GPU here); the model's
files (config and tokenizer: a Qwen2 with Qwen2.5's chat template, tests/integration/trl_model.py) are made here.
tests/integration/test_verl.py covers the tool's calls one by one (``ToolAgentLoop._call_tool``, the older
create/release contract).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, skip_or_fail

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"
ANSWERS = {"6 * 7": "42", "6 * 8": "48"}


@pytest.fixture(scope="module")
def rollout(daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not VERL_PYTHON.exists():
        skip_or_fail("no verl environment (.venv-verl): run scripts/setup.sh (make test does)")
    missing = [m for m in ("transformers", "trl") if importlib.util.find_spec(m) is None]
    if missing:
        skip_or_fail(f"no {', '.join(missing)} (the model's files are made with them): run scripts/setup.sh")
    from transformers import Qwen2Config

    from tests.integration.trl_model import tokenizer

    model = tmp_path_factory.mktemp("tiny_qwen2")
    tok = tokenizer()
    tok.save_pretrained(model)
    Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, architectures=["Qwen2ForCausalLM"]).save_pretrained(model)
    env = {**os.environ, "SANDBOXD_ADDRESS": daemon.address, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO / "client")}
    proc = subprocess.run([str(VERL_PYTHON), str(Path(__file__).with_name("verl_tool_checks.py")), str(REPO),
                           str(model)], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_docs_lines_make_verl_load_our_tools_and_run_the_tool_agent(rollout: dict[str, Any]) -> None:
    assert rollout["verl"] == "0.9.1"
    assert rollout["client"] == str(REPO / "client" / "sandboxd_client" / "__init__.py")
    assert rollout["doc_lines"] == [
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/verl_tools.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
    ]
    assert rollout["tools"] == ["bash", "python"]
    assert rollout["tool_classes"] == ["sandboxd_client.verl_tool.SandboxTool"]
    # Without the third line 0.9.1 runs single_turn_agent: one turn, no tool shown to the model or called.
    assert rollout["agent_name"] == ["tool_agent", "tool_agent"]


def test_each_trajectory_runs_its_tool_calls_in_a_session_of_its_own(rollout: dict[str, Any]) -> None:
    # Three assistant turns and two tool answers each (verl counts the prompt's turn too).
    assert rollout["num_turns"] == [6, 6]
    for response, (expr, value) in zip(rollout["responses"], ANSWERS.items(), strict=True):
        # The python tool wrote the value to a file; the bash tool read it back in the same sandbox.
        assert f"str({expr})" in response
        assert response.count(f"<tool_response>\n{value}\n</tool_response>") == 2, response
        assert response.endswith(f"The answer is \\boxed{{{value}}}.<|im_end|>")
    # At the last turn (both trajectories there) the server saw their two sessions, two cells each.
    assert rollout["sessions_before"] == 0
    assert rollout["cells_at_last_turn"] == [[2, 2], [2, 2]]
    assert rollout["sessions_after"] == 0, "a finished trajectory gives its session back"


def test_only_the_models_tokens_are_trained_on(rollout: dict[str, Any]) -> None:
    """verl's response_mask: 1 on the tokens the server generated, 0 on the tool answers the loop appended."""
    generated: dict[str, int] = {}
    for turn in rollout["turns"]:
        generated[turn["request_id"]] = generated.get(turn["request_id"], 0) + turn["tokens"]
    assert len(generated) == 2
    assert sorted(rollout["masked_tokens"]) == sorted(generated.values())
