"""Minimal GRPO run in TRL with sandboxd scoring the completions.

    SANDBOXD_ADDRESS=unix:///run/sandboxd/sandboxd.sock python examples/trl_grpo.py

Needs `trl`, `datasets` and a running sandboxd; the reward function itself needs
only the `sandboxd-client` package. For a code dataset, use kind="code": the
tests column is found by name (test_cases, tests, input_output, test +
entry_point, test_list, public_tests, ...) or given with column_map.
"""

from datasets import load_dataset
from sandboxd_client.trl import make_reward_func
from trl import GRPOConfig, GRPOTrainer

SYSTEM = "Think step by step, then give the final answer as \\boxed{...}."


def to_conversation(row: dict) -> dict:
    # GSM8K's answer ends with "#### 72": keep the number as the ground truth.
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}],
        "answer": row["answer"].split("####")[-1].strip(),
    }


def main() -> None:
    dataset = load_dataset("openai/gsm8k", "main", split="train").map(to_conversation)
    # Model failures score -1.0; completions the infrastructure could not score
    # get None, which TRL leaves out of the group's advantage.
    reward = make_reward_func("math", failure_value=-1.0)  # infra failures: None, masked by TRL
    trainer = GRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=[reward],
        args=GRPOConfig(output_dir="grpo-gsm8k-sandboxd", num_generations=8, logging_steps=10),
        train_dataset=dataset,
    )
    trainer.train()


if __name__ == "__main__":
    main()
