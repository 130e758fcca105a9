"""sandboxd as verl's custom reward function.

Per-sample (verl's default "naive" reward manager, calling from worker threads):

    custom_reward_function.path=examples/verl_reward.py
    custom_reward_function.name=compute_score

Whole batch in one call (fewer round trips, spread over every daemon):

    reward_model.reward_manager=batch
    custom_reward_function.path=examples/verl_reward.py
    custom_reward_function.name=compute_score_batch

Options arrive through `custom_reward_function.reward_kwargs`, e.g.
`+custom_reward_function.reward_kwargs.infra_failure_value=0.0`. Set
SANDBOXD_ADDRESS on every worker (one address, a comma-separated list, or
dns:///name:port). Math data sources compare with the ground truth; code data
sources run the solution against the ground truth as verl's test-case JSON.
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
