"""``sandboxd_client.verl`` against a real daemon, and verl 0.9.1's own code calling it.

verl cannot share the test environment (it pins ``transformers`` 5.10.4; TRL's
extra needs 5.23), so scripts/setup.sh gives it one of its own, ``.venv-verl``,
and the tests at the end run ``verl_checks.py`` there as a subprocess: Hydra
composition of verl's ``ppo_trainer.yaml`` with the README's and
docs/client.md's own lines, ``get_custom_reward_fn``, the reward loop on a
local Ray as ``main_ppo`` runs it (``RewardLoopManager`` with ``compute_score``,
``compute_score_async`` and the ``remote`` manager), the agent loop's
per-sample reward calls (``AgentLoopWorker``, a scripted model its only
stand-in), verl's own prime_code scorer on the same rows, and the tools
through verl's tool registry. The tests above them call the module directly
for what verl's managers do not reach: ``compute_score_batch``, rows the
daemon refuses, numpy ground truths, an unreachable daemon.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from sandboxd_client import verl as sandboxd_verl

from tests.conftest import DaemonProcess, skip_or_fail

np = pytest.importorskip("numpy")

# verl_checks.py runs every verl flow in one subprocess on a local Ray: 2.5 min on a quiet 2-core machine, over
# 10 min with two busy loops per CPU beside it. Its test waits as long as the subprocess may run (VERL_CHECKS_SECONDS).
VERL_CHECKS_SECONDS = 1500
pytestmark = [pytest.mark.docker, pytest.mark.timeout(VERL_CHECKS_SECONDS + 120)]

KEYS = {"score", "acc", "pass_rate", "status", "infra_failure"}
ADD = "```python\nprint(sum(map(int, input().split())))\n```"
ADD_TESTS = json.dumps({"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]})
# verl's prime_code function-call form: arguments as JSON one per line, the return value as JSON.
PRIME_CALL = "```python\ndef add(a, b):\n    return a + b\n```"
PRIME_CALL_TESTS = json.dumps({"inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"], "fn_name": "add"})

# (data_source, solution_str, ground_truth, extra_info, expected score, acc, pass_rate, status)
ROWS: list[tuple[str, str, Any, dict[str, Any], float, float, float, str]] = [
    ("openai/gsm8k", "so the answer is \\boxed{72}", "72", {"index": 0}, 1.0, 1.0, 1.0, "OK"),
    ("openai/gsm8k", "\\boxed{71}", "72", {"index": 1}, -1.0, 0.0, 0.0, "WRONG_ANSWER"),
    ("lighteval/MATH", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", {}, 1.0, 1.0, 1.0, "OK"),
    ("math_dapo", "no idea", "3", {}, -1.0, 0.0, 0.0, "NO_ANSWER"),
    ("codecontests", ADD, ADD_TESTS, {"language": "python"}, 1.0, 1.0, 1.0, "OK"),
    ("codecontests", "```python\nprint(3)\n```", ADD_TESTS, {}, -1.0, 0.0, 0.5, "WRONG_ANSWER"),
    ("likaixin/TACO-verified", ADD, json.loads(ADD_TESTS), {}, 1.0, 1.0, 1.0, "OK"),
    ("apps", PRIME_CALL, PRIME_CALL_TESTS, {}, 1.0, 1.0, 1.0, "OK"),
    ("taco", PRIME_CALL.replace("a + b", "a"), PRIME_CALL_TESTS, {}, -1.0, 0.0, 0.0, "WRONG_ANSWER"),
]


def extra_info_of(row_extra: dict[str, Any]) -> dict[str, Any]:
    # verl adds these to every sample's extra_info before calling.
    return {**row_extra, "num_turns": None, "rollout_reward_scores": {}}


def check(score: Any, row: tuple[Any, ...]) -> None:
    *_, expected, acc, pass_rate, status = row
    assert isinstance(score, dict) and set(score) == KEYS, score
    assert (score["score"], score["acc"], score["pass_rate"], score["status"]) == (expected, acc, pass_rate, status)
    assert score["infra_failure"] is False


@pytest.fixture
def reward_kwargs(daemon: DaemonProcess) -> dict[str, Any]:
    return {"address": daemon.address, "infra_failure_value": 0.0}


def test_compute_score_batch(reward_kwargs: dict[str, Any]) -> None:
    """For callers of one's own that hold a batch (0.9.1 has no batch manager): numpy columns in, one dict per
    sample out, in order, every dict with the same keys and value types (verl stacks them per key)."""
    rows = ROWS * 4
    scores = sandboxd_verl.compute_score_batch(
        data_sources=np.array([r[0] for r in rows], dtype=object),
        solution_strs=[r[1] for r in rows],
        ground_truths=[r[2] for r in rows],
        extra_infos=np.array([extra_info_of(r[3]) for r in rows], dtype=object),
        **reward_kwargs,
    )
    assert len(scores) == len(rows)
    for score, row in zip(scores, rows, strict=True):
        check(score, row)
    assert all({k: type(v) for k, v in s.items()} == {k: type(v) for k, v in scores[0].items()} for s in scores)


def test_a_row_the_daemon_refuses_costs_only_its_own_score(reward_kwargs: dict[str, Any]) -> None:
    """The real daemon refuses a whole batch, before any of it runs, for one job it cannot take (here a
    language it does not know, which only the daemon can tell); the other rows are still scored."""
    rows = ROWS * 2
    extra_infos = [extra_info_of(r[3]) for r in rows]
    refused = len(rows) // 2
    extra_infos[refused] = {**(extra_infos[refused] or {}), "language": "cobol"}
    data_sources = [r[0] for r in rows]
    data_sources[refused] = "codecontests"
    scores = sandboxd_verl.compute_score_batch(
        data_sources=data_sources,
        solution_strs=[r[1] for r in rows],
        ground_truths=[r[2] if i != refused else json.dumps({"inputs": ["1"], "outputs": ["1"]})
                       for i, r in enumerate(rows)],
        extra_infos=extra_infos,
        **reward_kwargs,
    )
    assert scores[refused]["status"] == "INVALID_REQUEST" and scores[refused]["infra_failure"]
    for i, (score, row) in enumerate(zip(scores, rows, strict=True)):
        if i != refused:
            check(score, row)


def test_numpy_ground_truths(reward_kwargs: dict[str, Any]) -> None:
    """Parquet gives numpy scalars and arrays; they must score like plain values."""
    score = sandboxd_verl.compute_score("openai/gsm8k", "\\boxed{72}", np.int64(72), **reward_kwargs)
    assert score["score"] == 1.0
    tests = {"inputs": np.array(["1 2\n"], dtype=object), "outputs": np.array(["3\n"], dtype=object)}
    score = sandboxd_verl.compute_score("codecontests", ADD, tests, **reward_kwargs)
    assert score["status"] == "OK", score


def test_unknown_data_source_stops_the_run(reward_kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="register_data_source"):
        sandboxd_verl.compute_score("my_unknown_set", "x", "1", **reward_kwargs)
    with pytest.raises(ValueError, match="differ in length"):
        sandboxd_verl.compute_score_batch(["openai/gsm8k"], ["a", "b"], ["1"], None, **reward_kwargs)


def test_unreachable_daemon_scores_infra_value() -> None:
    score = sandboxd_verl.compute_score(
        "openai/gsm8k",
        "\\boxed{1}",
        "1",
        address="unix:///nonexistent/sandboxd-verl.sock",
        infra_failure_value=0.0,
        client_options={"max_retries": 0},
    )
    assert score == {"score": 0.0, "acc": 0.0, "pass_rate": 0.0, "status": "UNAVAILABLE", "infra_failure": True}




# -- verl 0.9.1 itself ------------------------------------------------------------------------------------------------
# verl's own code, in the environment scripts/setup.sh makes for it (verl pins transformers 5.10.4, TRL's extra 5.23),
# run as a subprocess (tests/integration/verl_checks.py) against this test's daemon.

REPO = Path(__file__).resolve().parents[2]
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"
WRONG_CALL = PRIME_CALL.replace("a + b", "a - b")
# Rows through verl: (data_source, solution_str, ground_truth, extra_info, score, status, verl's own scorer takes it).
VERL_ROWS: list[tuple[str, str, Any, dict[str, Any], float, str, bool]] = [
    ("openai/gsm8k", "so the answer is \\boxed{72}", "72", {}, 1.0, "OK", False),
    ("openai/gsm8k", "\\boxed{71}", "72", {}, -1.0, "WRONG_ANSWER", False),
    ("codecontests", ADD, ADD_TESTS, {}, 1.0, "OK", True),
    ("codecontests", "```python\nprint(3)\n```", ADD_TESTS, {}, -1.0, "WRONG_ANSWER", True),
    # The prime_code function-call form, which sandboxd refused before as an infrastructure failure.
    ("apps", PRIME_CALL, PRIME_CALL_TESTS, {}, 1.0, "OK", True),
    ("taco", WRONG_CALL, PRIME_CALL_TESTS, {}, -1.0, "WRONG_ANSWER", True),
    # The other code datasets' own shapes, under their Hub names (verl has no scorer of its own for these).
    ("deepmind/code_contests", ADD, json.dumps({"public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
                                                "private_tests": {"input": ["2 5\n"], "output": ["7\n"]}}),
     {}, 1.0, "OK", False),
    ("livecodebench/code_generation_lite", ADD,
     json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]), {}, 1.0, "OK", False),
    ("livecodebench/code_generation_lite", PRIME_CALL,
     json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}]), {"fn_name": "add"}, 1.0, "OK", False),
    ("PrimeIntellect/verifiable-coding-problems", PRIME_CALL, json.dumps({"test_cases": [
        {"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]}]}), {}, 1.0, "OK", False),
    ("BAAI/TACO", PRIME_CALL, json.dumps({"inputs": [[1, 2]], "outputs": [[3]], "fn_name": "add"}), {}, 1.0, "OK",
     False),
]




def fenced(code: str) -> str:
    return f"```python\n{code}```"


def r1_compressed(tests: dict[str, Any]) -> str:
    """A LiveCodeBench row's ground_truth as verl's r1 recipe writes it (recipe/r1/data_process.py)."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


SUM_TWO = fenced("a, b = map(int, input().split())\nprint(a + b)\n")
STDIN_TESTS = json.dumps({"inputs": ["1 2\n", "10 20\n"], "outputs": ["3\n", "30\n"]})
# verl's test shapes and verl's own verdict on each, a correct and a wrong program or two per shape: (what, data
# source, solution_str, ground_truth, verl's scorer, passes). "prime_code": default_compute_score, which runs
# prime_code (continuous: the fraction of the first ten cases passed) for these data sources; "r1": verl's r1 recipe
# for LiveCodeBench (recipe/r1/tasks/livecodebench.py: the row decompressed, then prime_code's run_test, all or
# nothing).
SHAPE_ROWS: list[tuple[str, str, str, Any, str, bool]] = [
    ("stdin", "codecontests", SUM_TWO, STDIN_TESTS, "prime_code", True),
    ("stdin, one case wrong", "codecontests", fenced("print(3)\n"), STDIN_TESTS, "prime_code", False),
    ("stdin, trailing blanks", "codeforces", fenced("a, b = map(int, input().split())\nprint(a + b, end='  \\n\\n')\n"),
     STDIN_TESTS, "prime_code", True),
    ("stdin, fn_name null, a dict", "taco", fenced("print(2 * int(input()))\n"),
     {"inputs": ["4\n"], "outputs": ["8\n"], "fn_name": None}, "prime_code", True),
    ("stdin, wrong case", "apps", fenced("print('YES')\n"), {"inputs": ["1\n"], "outputs": ["Yes\n"]},
     "prime_code", False),
    ("call", "apps", PRIME_CALL, PRIME_CALL_TESTS, "prime_code", True),
    ("call, wrong", "taco", PRIME_CALL.replace("a + b", "a - b"), PRIME_CALL_TESTS, "prime_code", False),
    ("call, method of Solution", "apps", fenced("class Solution:\n    def add(self, a, b):\n        return a + b\n"),
     PRIME_CALL_TESTS, "prime_code", True),
    ("call, tuple for a list", "apps", fenced("def pair(a, b):\n    return (a, b)\n"),
     json.dumps({"inputs": ["1\n2"], "outputs": ["[1, 2]"], "fn_name": "pair"}), "prime_code", True),
    ("call, output in a one-element list", "taco", PRIME_CALL,
     json.dumps({"inputs": ["1\n2"], "outputs": ["[3]"], "fn_name": "add"}), "prime_code", True),
    ("call, dict argument of int keys", "apps", fenced("def smallest(table):\n    return table[min(table)]\n"),
     json.dumps({"inputs": ['{"10": "a", "2": "b"}'], "outputs": ['"b"'], "fn_name": "smallest"}), "prime_code", True),
    ("call, dict argument of int keys, wrong", "apps", fenced("def smallest(table):\n    return table[max(table)]\n"),
     json.dumps({"inputs": ['{"10": "a", "2": "b"}'], "outputs": ['"b"'], "fn_name": "smallest"}), "prime_code",
     False),
    ("call, dict output of int keys", "codecontests", fenced("def size(word):\n    return {len(word): word}\n"),
     json.dumps({"inputs": ['"abc"'], "outputs": ['{"3": "abc"}'], "fn_name": "size"}), "prime_code", True),
    ("r1 LiveCodeBench, stdin", "livecodebench/code_generation_lite", SUM_TWO,
     r1_compressed({"inputs": ["1 2\n"], "outputs": ["3\n"], "fn_name": None}), "r1", True),
    ("r1 LiveCodeBench, stdin, wrong", "livecodebench/code_generation_lite", fenced("print(4)\n"),
     r1_compressed({"inputs": ["1 2\n"], "outputs": ["3\n"], "fn_name": None}), "r1", False),
    ("r1 LiveCodeBench, functional", "livecodebench/code_generation_lite",
     fenced("class Solution:\n    def maxOf(self, nums: List[int]) -> int:\n        return max(nums)\n"),
     r1_compressed({"inputs": ["[1, 5, 2]", "[-3]"], "outputs": ["5", "-3"], "fn_name": "maxOf"}), "r1", True),
    ("r1 LiveCodeBench, functional, wrong", "livecodebench/code_generation_lite",
     fenced("class Solution:\n    def maxOf(self, nums: List[int]) -> int:\n        return min(nums)\n"),
     r1_compressed({"inputs": ["[1, 5, 2]", "[-3]"], "outputs": ["5", "-3"], "fn_name": "maxOf"}), "r1", False),
]


@pytest.fixture(scope="module")
def verl_run(daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not VERL_PYTHON.exists():
        skip_or_fail("no verl environment (.venv-verl): run scripts/setup.sh (make test does)")
    rows = tmp_path_factory.mktemp("verl") / "rows.json"
    rows.write_text(json.dumps({
        "rows": [{"data_source": ds, "solution_str": s, "ground_truth": gt, "extra_info": extra, "verl_scores_it": own}
                 for ds, s, gt, extra, _, _, own in VERL_ROWS],
        "shapes": [{"data_source": ds, "solution_str": s, "ground_truth": gt, "judge": judge}
                   for _, ds, s, gt, judge, _ in SHAPE_ROWS],
    }))
    # PYTHONPATH: this checkout's client, not the one installed in .venv-verl (editable, from wherever setup ran);
    # the local Ray's workers inherit it, and SANDBOXD_ADDRESS, as a node's do.
    env = {**os.environ, "SANDBOXD_ADDRESS": daemon.address, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO / "client")}
    proc = subprocess.run([str(VERL_PYTHON), str(Path(__file__).with_name("verl_checks.py")), str(REPO), str(rows)],
                          capture_output=True, text=True, timeout=VERL_CHECKS_SECONDS, env=env,
                          cwd=rows.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_verl_composes_the_docs_lines_and_loads_our_function(verl_run: dict[str, Any]) -> None:
    """The README's and docs/client.md's lines, through verl's Hydra config and get_custom_reward_fn."""
    assert verl_run["verl"] == "0.9.1"
    expected = ["reward.custom_reward_function.path=pkg://sandboxd_client.verl",
                "reward.custom_reward_function.name=compute_score",
                "+reward.custom_reward_function.reward_kwargs.infra_failure_value=0.0"]
    assert verl_run["readme_overrides"] == expected and verl_run["client_doc_overrides"] == expected
    assert verl_run["reward_config"] == {"path": "pkg://sandboxd_client.verl", "name": "compute_score",
                                         "reward_kwargs": {"infra_failure_value": 0.0}}
    assert verl_run["loaded_is_ours"] and verl_run["readme_loaded_is_ours"]
    # What the docs say of 0.9.1: the old top-level keys are ignored, there is no batch manager, the managers.
    assert verl_run["old_keys_loaded"] is False
    assert verl_run["batch_manager"] == "Unknown reward manager: batch"
    assert set(verl_run["managers"]) == {"naive", "dapo", "gdpo", "rate_limited", "remote"}
    # The remote manager ships the function to Ray: by name it pickles; loaded by file path it did not.
    assert verl_run["pickles_by_name"] is True
    assert "_thread.lock" in verl_run["pickles_by_file"]


# The verl settings each file gives (a group: the lines a user puts on one command line, or one in prose), at least.
SNIPPET_GROUPS = {"README.md": 2, "docs/client.md": 6, "examples/verl_reward.py": 3, "examples/verl_tools.yaml": 1}


def test_every_verl_snippet_composes_and_runs(verl_run: dict[str, Any]) -> None:
    """Every verl override that README.md, docs/client.md, examples/verl_reward.py and examples/verl_tools.yaml give,
    composed with verl's ppo_trainer.yaml as written, each key holding the value Hydra reads from the line; a reward
    setting loads its function through get_custom_reward_fn, which then scores: a GSM8K answer; a data source of
    one's own where the setting maps one (data_source_kinds, or the example file that registers it); a float
    printed with more digits where it asks for the float checker. The tool settings run verl's ToolAgentLoop
    (test_verl_tool_agent_loop_runs_the_tools_in_one_sandbox); the remote manager's runs on Ray
    (test_verl_reward_loop_on_ray)."""
    snippets = verl_run["snippets"]
    found = {name: sum(s["where"].startswith(f"{name}:") for s in snippets) for name in SNIPPET_GROUPS}
    assert all(found[name] >= least for name, least in SNIPPET_GROUPS.items()), found
    tool_paths = set()
    for snippet in snippets:
        where, lines = snippet["where"], snippet["lines"]
        assert "error" not in snippet and snippet["values_ok"], snippet
        text = " ".join(lines)
        if "scores" in snippet:
            assert snippet["ours"] and snippet["function"] in ("compute_score", "compute_score_async"), snippet
            scores = snippet["scores"]
            assert scores["gsm8k"] == 1.0, snippet
            maps_own = "data_source_kinds" in text or "path=examples/verl_reward.py" in text
            assert (scores["own_data_source"] == 1.0) is maps_own, snippet
            assert scores["float_output"] == (1.0 if "checker:float" in text else -1.0), snippet
        elif "manager" in snippet:  # a reward manager verl registers (the remote one runs on Ray below)
            assert snippet["manager"].endswith("RewardManager"), snippet
        else:
            assert "tool_config_path" in snippet, f"{where}: a verl setting no check uses: {lines}"
            tool_paths.add(snippet["tool_config_path"])
    assert tool_paths == {str(REPO / "examples" / "verl_tools.yaml")}, "the tool settings the rollout ran"


def test_the_verl_example_runs_as_a_script(daemon: DaemonProcess) -> None:
    """examples/verl_reward.py's smoke test, `python examples/verl_reward.py` with SANDBOXD_ADDRESS set."""
    env = {**os.environ, "SANDBOXD_ADDRESS": daemon.address, "PYTHONPATH": str(REPO / "client")}
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "verl_reward.py")], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    scores = [ast.literal_eval(line) for line in proc.stdout.splitlines()]
    assert [score["score"] for score in scores] == [1.0, 1.0] and not any(s["infra_failure"] for s in scores)


def test_verl_scores_as_its_own_scorer_does(verl_run: dict[str, Any]) -> None:
    naive = verl_run["ray"]["naive"]["extra"]
    for i, (own, row) in enumerate(zip(verl_run["verl_own"], VERL_ROWS, strict=True)):
        assert (naive["score"][i], naive["status"][i]) == row[4:6], (row, naive)
        if row[6]:  # verl's prime_code scorer (continuous for these data sources): the fraction of tests passed
            assert own == naive["pass_rate"][i], (row, own, naive["pass_rate"][i])


def test_verl_shapes_judged_as_verls_own_scorer_judges_them(verl_run: dict[str, Any]) -> None:
    """Each of verl's test shapes, sandboxd's verdict through verl's loader beside verl's own scorer's."""
    for (what, *_, passes), ours, own in zip(SHAPE_ROWS, verl_run["shapes"]["ours"], verl_run["shapes"]["verl"],
                                             strict=True):
        assert ours["infra_failure"] is False, (what, ours)
        assert (ours["acc"] == 1.0, own["passed"]) == (passes, passes), (what, ours, own)
        if own["fraction"] is not None:  # prime_code's continuous score, where it runs every case (under 10)
            assert ours["pass_rate"] == own["fraction"], (what, ours, own)


def check_rewards(result: dict[str, Any], what: str) -> None:
    """Each sample's score on its last valid response token and nowhere else, every key of our dict in
    reward_extra_info, column by column in the batch's order."""
    expected = [row[4] for row in VERL_ROWS]
    assert result["at_last"] == expected, (what, result)
    assert result["elsewhere"] == [0] * len(VERL_ROWS), (what, result)
    assert set(result["keys"]) == KEYS, (what, result["keys"])
    assert result["extra"]["score"] == expected, what
    assert result["extra"]["status"] == [row[5] for row in VERL_ROWS], what
    assert result["extra"]["infra_failure"] == [False] * len(VERL_ROWS), what


def test_verl_reward_loop_on_ray(verl_run: dict[str, Any]) -> None:
    """0.9.1's RewardLoopManager on a local Ray, as main_ppo runs it: its workers load our function by the docs'
    lines and score the batch split between them (compute_score), awaited (compute_score_async), and through
    the remote manager's own Ray actors; rm_scores as the trainer gets them."""
    ray = verl_run["ray"]
    assert ray["worker_sees"][0] == str(REPO / "client" / "sandboxd_client" / "__init__.py"), ray["worker_sees"]
    assert ray["worker_sees"][1], "a Ray worker inherits SANDBOXD_ADDRESS"
    for what in ("naive", "naive_async", "remote"):
        check_rewards(ray[what], what)


def test_verl_agent_loop_scores_each_sample_as_it_finishes(verl_run: dict[str, Any]) -> None:
    """verl's AgentLoopWorker and its single-turn loop (a scripted model is the only stand-in): each finished
    sample goes to a reward loop worker on Ray (one compute_score.remote per sample), and the batch comes back
    with rm_scores and reward_extra_info."""
    loop = verl_run["ray"]["agent_loop"]
    assert loop["responses"] == [row[1] for row in VERL_ROWS]
    check_rewards(loop, "agent loop")


def test_verl_tool_agent_loop_runs_the_tools_in_one_sandbox(verl_run: dict[str, Any]) -> None:
    """A whole multi-turn rollout of verl's ToolAgentLoop with examples/verl_tools.yaml loaded by AgentLoopWorker
    (multi_turn.tool_config_path): the scripted model's Python call writes 42 to a file, its bash call reads it
    back, its answer is what bash printed; scored on Ray like any sample."""
    loop = verl_run["ray"]["tool_agent_loop"]
    assert "tool: 42\n" in loop["response"] and loop["response"].endswith("The file says \\boxed{42}"), loop
    assert loop["num_turns"] == 6  # user, then assistant and tool twice, then the answer
    assert loop["tool_tokens"] > 0, "the tool responses are in the response, masked out of the loss"
    assert loop["at_last"] == [1.0] and loop["elsewhere"] == [0], loop
    assert loop["extra"]["status"] == ["OK"]
    assert loop["sessions_left"] == 0, "the finished trajectory gave its session back"


def test_verl_tools_hold_one_session_per_trajectory(verl_run: dict[str, Any]) -> None:
    """examples/verl_tools.yaml loaded by verl's tool registry, each call made by ToolAgentLoop._call_tool, which
    creates and releases the tool around every call: the trajectory's session persists between them."""
    tools = verl_run["tools"]
    assert "error" not in tools, tools.get("error")
    assert tools["names"] == ["bash", "python"]
    assert tools["schemas"]["python"]["function"]["parameters"]["required"] == ["code"]
    assert tools["schemas"]["bash"]["function"]["parameters"]["required"] == ["command"]
    texts = [text for text, reward, _ in tools["calls"]]
    assert texts[:5] == ["42", "41", "hi", "'hi\\n'", "[exit status 3]"]
    assert "NameError" in texts[5], "another trajectory has a session of its own"
    assert texts[6] == "python: give 'code' as a string"
    assert all(reward == 0.0 for _, reward, _ in tools["calls"])
    assert tools["calls"][0][2]["status"] == "OK"
    assert tools["sessions_during"] == 2
    assert tools["sessions_after"] == 0, "a finished trajectory gives its session back"
    assert tools["instance_call"] == "10" and tools["instance_reward"] == 0.0
    assert (tools["instance_sessions"], tools["instance_sessions_after"]) == (1, 0)
