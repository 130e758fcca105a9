"""A tiny tool-calling chat model for TRL tests, built offline: not a test module (pytest does not collect it).

A random model never writes a tool call, so this one is steered: :func:`steered_model` is a random 2-layer Qwen2
whose ``generate`` takes a logits processor (:class:`Script`) that allows one token at each step, the next token of
the text a script says the assistant turn holds. Its ``forward`` is the random model's own, so TRL's log-probs,
loss and optimizer step are those of a real model; only what it samples is chosen. The rest is TRL's: the chat
template renders the tools' schemas, TRL's response parser (``add_response_schema``, Qwen's) extracts the tool call
from the generated tokens, and TRL's tool loop calls the environment's method and appends its answer.

The tokenizer is byte-level with no merges (any text round-trips) plus Qwen2.5's special tokens, and its chat
template is Qwen2.5's, as TRL ships it (``trl/chat_templates/qwen2_5.jinja``): a tokenizer TRL recognises as a
Qwen2.5 one, with Hermes-style ``<tool_call>`` tool calls and ``<tool_response>`` answers.

Import this only where torch, transformers and trl are installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

ASSISTANT_HEADER = "<|im_start|>assistant\n"
# A script maps the conversation so far (the decoded prompt, with any earlier turns and tool answers) and the
# row's index in the generation batch to the text of the assistant turn being generated.
ScriptFn = Callable[[str, int], str]


def tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, no merges, Qwen2.5's special and added tokens and chat template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(sorted(alphabet))}, merges=[]))
    # use_regex=False: no pre-split, so a space is a byte token of its own like any other.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # added, not special: decoding keeps them, as Qwen2.5's does
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return tok


def tool_call(name: str, **arguments: Any) -> str:
    """A Hermes tool call as Qwen2.5 writes one."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_answers(context: str) -> list[str]:
    """The tool answers in the conversation so far, in order (Qwen2.5's ``<tool_response>`` blocks)."""
    return [part.split("\n</tool_response>", 1)[0] for part in context.split("<tool_response>\n")[1:]]


class Script(LogitsProcessor):
    """Allows only the next token of the text ``script`` gives for the turn, then end-of-turn."""

    def __init__(self, tok: PreTrainedTokenizerFast, script: ScriptFn) -> None:
        self.tok, self.script = tok, script
        self.header = tok(ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
        self.eos = int(tok.eos_token_id)
        self.turns: list[str] = []  # every turn's text, in the order they were started (for the tests to read)
        self._targets: dict[tuple[int, ...], list[int]] = {}

    def _turn_start(self, ids: list[int]) -> int:
        n = len(self.header)
        for start in range(len(ids) - n, -1, -1):
            if ids[start : start + n] == self.header:
                return start + n
        raise ValueError("no assistant header in the context: not a chat prompt")

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        allowed = torch.full_like(scores, float("-inf"))
        for row, ids in enumerate(input_ids.tolist()):
            start = self._turn_start(ids)
            key = (row, *ids[:start])
            target = self._targets.get(key)
            if target is None:
                text = self.script(str(self.tok.decode(ids[:start])), row)
                self.turns.append(text)
                target = self._targets[key] = [*self.tok(text, add_special_tokens=False)["input_ids"], self.eos]
            done = len(ids) - start
            allowed[row, target[done] if done < len(target) else self.eos] = 0.0
        return cast(torch.FloatTensor, allowed)


class SteeredQwen2(Qwen2ForCausalLM):
    """A Qwen2 whose ``generate`` follows ``self.steer`` (a :class:`Script`); everything else is Qwen2's."""

    steer: Script | None = None

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.steer is not None:
            kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), self.steer])
        return super().generate(*args, **kwargs)  # type: ignore[misc]  # GenerationMixin's self type


def steered_model(tok: PreTrainedTokenizerFast, script: ScriptFn, seed: int = 0) -> SteeredQwen2:
    """A random 2-layer Qwen2 (hidden 64) over ``tok``'s vocabulary, steered by ``script``."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None, tie_word_embeddings=False,
    )
    model = SteeredQwen2(config)
    model.steer = Script(tok, script)
    return model
