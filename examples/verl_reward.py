"""sandboxd as verl's custom reward function (verl 0.9.1, `python -m verl.trainer.main_ppo`).

The installed module itself, by name (no site-packages path to find; it
pickles by reference, so the `remote` reward manager can ship it to Ray):

    reward.custom_reward_function.path=pkg://sandboxd_client.verl
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.infra_failure_value=0.0

The keys are under `reward.`: 0.9.1's trainer ignores the older top-level
`custom_reward_function.*` without a word and scores with verl's default
scorer. Every 0.9.1 reward manager (naive, dapo, gdpo, rate_limited, remote)
calls the function once per sample; `name=compute_score_async` is awaited on
the reward loop instead of running in its thread pool (not with `remote`).
There is no `batch` manager in 0.9.1.

Or this file, for data sources of your own: it registers them at import, in
every process that loads it (`register_data_source` in the driver alone
would not reach verl's reward workers):

    reward.custom_reward_function.path=examples/verl_reward.py
    reward.custom_reward_function.name=compute_score

The same without a file: `+reward.custom_reward_function.reward_kwargs.data_source_kinds={my_org/olympiad*:math}`.
Set SANDBOXD_ADDRESS on every node (one address, a comma-separated list, or
dns:///name:port). Math data sources compare with the ground truth; code
data sources run the solution against the ground truth as test cases
(docs/client.md, "verl's code datasets").
"""

from sandboxd_client.verl import (
    compute_score,
    compute_score_async,
    compute_score_batch,
    register_data_source,
)

# A data source the default mapping does not know: say how to score it.
register_data_source("my_org/olympiad*", "math")

__all__ = ["compute_score", "compute_score_async", "compute_score_batch"]


if __name__ == "__main__":
    # Smoke test against a running daemon.
    print(compute_score("openai/gsm8k", "The answer is \\boxed{72}.", "72"))
    tests = '{"inputs": ["1 2\\n"], "outputs": ["3\\n"]}'
    print(compute_score("codecontests", "```python\nprint(sum(map(int, input().split())))\n```", tests))
