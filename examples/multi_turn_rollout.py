"""A multi-turn rollout loop with a code interpreter tool, one sandboxd session per rollout.

Tool-integrated reasoning (ReTool-style): the policy writes text with
```python blocks; each block runs in the rollout's session, whose variables
persist from turn to turn; the interpreter's output goes back into the
context as an <output> block; the episode ends when the policy gives a
\\boxed{} answer or runs out of turns, and the answer is scored by sandboxd's
math verifier.

    python examples/multi_turn_rollout.py --address unix:///run/sandboxd/sandboxd.sock

A scripted policy stands in for the model so that the example runs anywhere;
replace `ScriptedPolicy.generate` with a call to your inference engine (vLLM,
SGLang, TRL's generate) that continues the transcript.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from dataclasses import dataclass, field

from sandboxd_client import AsyncSandboxClient, AsyncSession, CellResult, Status

CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
MAX_TURNS = 6
# What the model sees of a cell's output (the rest of a flood is the model's problem).
OUTPUT_CHARS = 2000


@dataclass
class Episode:
    prompt: str
    ground_truth: str
    transcript: list[str] = field(default_factory=list)
    tool_calls: int = 0
    reward: float = 0.0


class ScriptedPolicy:
    """Replays canned turns; the second turn uses a variable the first one defined."""

    def __init__(self, n: int) -> None:
        self.turns = [
            f"Let me compute the sum.\n```python\nterms = [k * k for k in range(1, {n} + 1)]\nsum(terms)\n```",
            "Check it against the closed form.\n```python\nclosed = len(terms) * (len(terms) + 1) * "
            "(2 * len(terms) + 1) // 6\nclosed == sum(terms), closed\n```",
            f"Both agree, so the answer is \\boxed{{{n * (n + 1) * (2 * n + 1) // 6}}}.",
        ]

    async def generate(self, transcript: list[str]) -> str:
        turn = sum(1 for part in transcript if part.startswith("assistant:"))
        return self.turns[min(turn, len(self.turns) - 1)]


def tool_output(result: CellResult) -> str:
    """How one cell is shown to the model: stdout, the last value, or the error."""
    parts = [result.stdout, result.value, result.stderr if not result.ok else ""]
    text = "\n".join(part for part in parts if part).strip()
    if result.status == Status.TIMEOUT:
        text += "\n[the cell timed out]"
    return text[:OUTPUT_CHARS]


async def run_tools(session: AsyncSession, reply: str, episode: Episode) -> bool:
    """Run the reply's code blocks in the session; False once the interpreter is gone."""
    for code in CODE_BLOCK.findall(reply):
        result = await session.run(code)
        episode.tool_calls += 1
        episode.transcript.append(f"tool: <output>\n{tool_output(result)}\n</output>")
        if not result.session_alive:
            # The interpreter died (os._exit, an ignored interrupt): the episode ends here.
            return False
    return True


async def rollout(client: AsyncSandboxClient, policy: ScriptedPolicy, episode: Episode) -> Episode:
    episode.transcript.append(f"user: {episode.prompt}")
    last_reply = ""
    async with await client.open_session(timeout=10.0) as session:
        for _ in range(MAX_TURNS):
            last_reply = await policy.generate(episode.transcript)
            episode.transcript.append(f"assistant: {last_reply}")
            if not CODE_BLOCK.search(last_reply) or not await run_tools(session, last_reply, episode):
                break
    # The policy's last words are its answer, whether it finished or ran out of turns.
    episode.reward = (await client.score_math(last_reply, episode.ground_truth)).reward
    return episode


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $SANDBOXD_ADDRESS or the local socket")
    parser.add_argument("--rollouts", type=int, default=8)
    args = parser.parse_args()
    async with AsyncSandboxClient(args.address) as client:
        # One warm session per live rollout: tell the daemon before the step starts.
        await client.set_batch_hint(args.rollouts, sessions=args.rollouts)
        sizes = [10 + i for i in range(args.rollouts)]
        episodes = [Episode(f"What is the sum of k^2 for k = 1..{n}?", str(n * (n + 1) * (2 * n + 1) // 6))
                    for n in sizes]
        done = await asyncio.gather(*(rollout(client, ScriptedPolicy(n), e) for n, e in zip(sizes, episodes,
                                                                                            strict=True)))
    for episode in done:
        print(f"reward {episode.reward:+.1f} after {episode.tool_calls} tool calls: {episode.prompt}")
    print("\n".join(done[0].transcript))


if __name__ == "__main__":
    asyncio.run(main())
