"""Reward-model scoring: a sequence-classification model turns (prompt, completion) into one number.

This module is the scorer and nothing else: it loads a model from a local
folder (never from the hub), formats each pair the way the model was trained
(its chat template when the tokenizer has one, a text pair otherwise),
truncates to a configured length, runs one padded forward pass per batch and
returns one raw scalar per pair. The same code runs inside a sandbox (see
``sandboxd.agent.host.rewardmodel``, which owns batching and the process around
it) and in-process (benchmarks, the GPU run, tests).

torch and transformers are imported on first use: the daemon and the light
images never need them.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

NORMALIZATIONS = ("none", "sigmoid", "affine")
# max_batch_tokens when not set, by device (CPU, GPU). On 2 CPU cores, batches of 32 pairs of
# 150-550 tokens went from 65 pairs/s in one pass to 98-108 in passes of 512-2,048 tokens.
# On an H100 an 8B model was busy with 8 pairs of 360 tokens (2,900); a 1B model gained 13%
# from 8 to 32 such pairs.
DEFAULT_BATCH_TOKENS = {False: 1024, True: 8192}
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class ScorerSettings:
    """What the scorer needs to know about one model; built from the daemon's config."""

    name: str
    path: str
    device: str = "cpu"  # "cpu" or "cuda"
    max_length: int = 2048
    dtype: str = "auto"
    # Which logit is the reward (models with num_labels > 1).
    label: int = 0
    # CPU threads for torch; 0 leaves torch's default.
    threads: int = 0
    # Fraction of the GPU's memory this process may take; 0 = no cap.
    memory_fraction: float = 0.0
    # Padded tokens (pairs x the longest of them) per forward pass; 0 = the device's default.
    max_batch_tokens: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScorerSettings:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass
class PairScore:
    """One pair's outcome: a raw score, or a status saying why there is none."""

    raw: float | None = None
    status: str = "ok"  # ok | rejected | memory_limit | internal
    message: str = ""
    tokens: int = 0
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value not in (None, "", False)}


def normalize(raw: float, mode: str, scale: float = 1.0, shift: float = 0.0) -> float:
    """The reward reported for a raw score: unchanged, ``scale * raw + shift``, or its sigmoid."""
    value = scale * raw + shift if mode in ("affine", "sigmoid") else raw
    if mode == "sigmoid":
        # The two branches keep exp() from overflowing for large |value|.
        if value >= 0:
            return 1.0 / (1.0 + math.exp(-value))
        z = math.exp(value)
        return z / (1.0 + z)
    return value


def _chat_text(tokenizer: Any, prompt: str, completion: str) -> str:
    conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    return str(tokenizer.apply_chat_template(conversation, tokenize=False))


@dataclass
class RewardModel:
    """A loaded model and tokenizer, ready to score batches."""

    settings: ScorerSettings
    model: Any
    tokenizer: Any
    device: str
    device_name: str
    dtype: str
    load_seconds: float
    chat_template: bool
    info: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.settings.name, "device": self.device, "device_name": self.device_name,
                "dtype": self.dtype, "load_seconds": round(self.load_seconds, 3),
                "chat_template": self.chat_template, "max_length": self.settings.max_length, **self.info}

    # ---- formatting --------------------------------------------------------------
    def encode(self, prompt: str, completion: str) -> list[int]:
        """Token ids of one whole pair, not truncated: may be longer than max_length (see :meth:`truncate`).

        The prompt and the completion are text, never control tokens: a special token's
        string written in them (``<|im_end|>``, ``</s>``) is tokenized as the characters it
        is made of. Otherwise a completion could end its own turn and forge the rest of the
        conversation (a user's question, the assistant's answer) that the model scores, or
        write the end-of-sequence token where the model reads its score.
        """
        tokenizer = self.tokenizer
        if not self.chat_template:
            return list(tokenizer(prompt, completion, split_special_tokens=True)["input_ids"])
        # The template writes the special tokens itself (BOS included); adding them again would
        # give the model an input it never saw in training.
        if self._special_text.search(prompt) or self._special_text.search(completion):
            return self._encode_around_texts(prompt, completion)
        return list(tokenizer(_chat_text(tokenizer, prompt, completion), add_special_tokens=False)["input_ids"])

    @functools.cached_property
    def _special_text(self) -> re.Pattern[str]:
        """Matches any special token's string: the tokenizer's named ones and its special added tokens."""
        tokenizer = self.tokenizer
        strings = {str(token) for token in tokenizer.all_special_tokens}
        added_tokens = getattr(tokenizer, "added_tokens_decoder", {}).values()
        strings.update(str(added) for added in added_tokens if getattr(added, "special", False))
        strings.discard("")
        if not strings:
            return re.compile(r"(?!)")  # matches nothing
        return re.compile("|".join(re.escape(text) for text in sorted(strings, key=len, reverse=True)))

    def _encode_around_texts(self, prompt: str, completion: str) -> list[int]:
        """A chat pair whose texts hold special tokens' strings: the template's parts are
        tokenized as the template wrote them, the two texts with their special tokens split.

        The template is rendered once with markers in place of the texts to find its parts,
        and once with the texts to check that it put them in unchanged (or trimmed, as some
        templates do); a template that changes them otherwise cannot be split safely.
        """
        tokenizer = self.tokenizer
        marker = f"sandboxd{os.urandom(8).hex()}"
        marked = _chat_text(tokenizer, marker + "p", marker + "c")
        parts = re.split(f"{marker}[pc]", marked)
        if len(parts) != 3 or marked.find(marker + "p") > marked.find(marker + "c"):
            raise ValueError("the chat template does not write the prompt and the completion once each, in order")
        rendered = _chat_text(tokenizer, prompt, completion)
        for texts in ((prompt, completion), (prompt.strip(), completion.strip())):
            if rendered == parts[0] + texts[0] + parts[1] + texts[1] + parts[2]:
                break
        else:
            raise ValueError("the texts hold special tokens and the chat template changes them: "
                             "they cannot be kept apart from its own tokens")
        ids: list[int] = []
        for part, text in zip(parts, (*texts, None), strict=True):
            if part:
                ids += tokenizer(part, add_special_tokens=False)["input_ids"]
            if text:
                ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return ids

    def truncate(self, prompt: str, completion: str, ids: list[int]) -> list[int]:
        """``ids`` (:meth:`encode` of the pair) cut to max_length tokens.

        A chat-formatted pair loses its end (the end of the completion goes first). A text
        pair is encoded again with the tokenizer's own ``longest_first`` truncation, which
        shortens the longer text and keeps the special tokens around both.
        """
        max_length = self.settings.max_length
        if len(ids) <= max_length:
            return ids
        if self.chat_template:
            return ids[:max_length]
        # The slice only matters when the tokenizer cannot get under max_length by truncating.
        return list(self.tokenizer(prompt, completion, truncation="longest_first", max_length=max_length,
                                   split_special_tokens=True)["input_ids"])[:max_length]

    # ---- scoring -------------------------------------------------------------------
    def score(self, pairs: list[tuple[str, str]]) -> list[PairScore]:
        """One PairScore per pair, in order; never raises for a bad pair or an out-of-memory batch."""
        results: list[PairScore] = [PairScore() for _ in pairs]
        encoded: list[tuple[int, list[int]]] = []
        for index, (prompt, completion) in enumerate(pairs):
            try:
                ids = self.encode(prompt, completion)
                tokens = len(ids)
                ids = self.truncate(prompt, completion, ids)
            except Exception as exc:  # a template that raises on this content, a tokenizer error
                results[index] = PairScore(status="rejected", message=f"pair could not be formatted: {exc}"[:500])
                continue
            results[index].tokens = tokens
            results[index].truncated = tokens > len(ids)
            if not ids:
                results[index] = PairScore(status="rejected", message="pair encodes to no tokens")
                continue
            encoded.append((index, ids))
        for chunk in self.chunks(encoded):
            self._forward(chunk, results)
        return results

    def chunks(self, encoded: list[tuple[int, list[int]]]) -> list[list[tuple[int, list[int]]]]:
        """The pairs sorted by length and cut into forward passes of at most ``max_batch_tokens``
        padded tokens (a pair longer than that goes alone).

        A pass pads every pair to its longest, so a batch of mixed lengths computes mostly
        padding: sorted, each pass holds pairs of about one length. The cap also bounds a
        pass's memory, whatever ``max_batch`` lets in.
        """
        budget = self.settings.max_batch_tokens or DEFAULT_BATCH_TOKENS[self.device.startswith("cuda")]
        chunks: list[list[tuple[int, list[int]]]] = [[]]
        for item in sorted(encoded, key=lambda item: len(item[1])):
            # Sorted: this pair is the longest so far, so the pass would pad to its length.
            if chunks[-1] and (len(chunks[-1]) + 1) * len(item[1]) > budget:
                chunks.append([])
            chunks[-1].append(item)
        return [chunk for chunk in chunks if chunk]

    def _forward(self, encoded: list[tuple[int, list[int]]], results: list[PairScore]) -> None:
        """Score `encoded` in one padded batch; on failure split it in halves, down to single pairs."""
        if not encoded:
            return
        failure, memory, values = "", False, []
        try:
            values = self._logits([ids for _, ids in encoded])
        except Exception as exc:
            failure, memory = f"{type(exc).__name__}: {exc}"[:500], _is_out_of_memory(exc)
        # The retries happen outside the except block: until it ends, the exception's traceback
        # keeps the failed forward's frames, and their activations, alive. On an H100 a real
        # out-of-memory batch left 309 MiB held that way, so no half could ever fit.
        if failure:
            if memory:
                self._free_memory()
            if len(encoded) > 1:
                middle = len(encoded) // 2
                self._forward(encoded[:middle], results)
                self._forward(encoded[middle:], results)
                return
            index = encoded[0][0]
            results[index].status, results[index].message = ("memory_limit" if memory else "internal"), failure
            return
        for (index, _), value in zip(encoded, values, strict=True):
            if math.isfinite(value):
                results[index].raw = value
            else:
                results[index].status, results[index].message = "internal", f"the model gave {value} for this pair"

    def _logits(self, batch: list[list[int]]) -> list[float]:
        import torch

        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in batch)
        right = getattr(self.tokenizer, "padding_side", "right") != "left"
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            span = slice(0, len(ids)) if right else slice(width - len(ids), width)
            input_ids[row, span] = torch.tensor(ids, dtype=torch.long)
            attention[row, span] = 1
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)).logits
        return logits[:, self.settings.label].float().cpu().tolist()

    def _free_memory(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            # Tensors of the failed forward caught in reference cycles go back to the allocator
            # first, then the allocator's cached blocks to the GPU.
            gc.collect()
            torch.cuda.empty_cache()


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text or "can't allocate memory" in text


def _torch_dtype(torch: Any, name: str, device: str) -> Any:
    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, name)


def _placement(device: str) -> dict[str, Any]:
    """from_pretrained's arguments that put the weights straight on ``device``, or none.

    Loaded without them, a model is built in host memory and then moved: a GPU sandbox would
    need host memory for all its weights (14 GB for 8B in bf16) though they live on the GPU.
    With ``device_map`` transformers reads each tensor from the mmapped safetensors file onto
    the device, so the sandbox's memory holds file pages the kernel can drop, not a copy. That
    path needs accelerate (in sandboxd's reward-model image); without it, the model is moved.
    """
    if not device.startswith("cuda"):
        return {}
    from transformers.utils import is_accelerate_available

    return {"device_map": device} if is_accelerate_available() else {}


def load(settings: ScorerSettings) -> RewardModel:
    """Load the model in ``settings.path`` onto its device; raises on any failure to do so.

    Only local files are read (``local_files_only``), code shipped with the model is never
    run (``trust_remote_code=False``), and a model whose weights are not safetensors is
    refused: a pickle is a program.
    """
    started = time.monotonic()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    device = "cpu"
    device_name = "cpu"
    if settings.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("the model is configured for a GPU, but torch sees none in this sandbox")
        device = "cuda:0"
        device_name = torch.cuda.get_device_name(0)
        if settings.memory_fraction > 0:
            torch.cuda.set_per_process_memory_fraction(settings.memory_fraction, 0)
        # cuDNN's attention builds an execution plan for every new input shape, and padded
        # batches of chat pairs rarely repeat one: on an H100 (torch 2.11) a 1B model's lone
        # pair takes 60 ms with it and 14 ms with the flash / memory-efficient kernels instead.
        torch.backends.cuda.enable_cudnn_sdp(False)
    dtype = _torch_dtype(torch, settings.dtype, device)
    tokenizer = transformers.AutoTokenizer.from_pretrained(settings.path, local_files_only=True,
                                                           trust_remote_code=False)
    # `torch_dtype` was renamed `dtype` in transformers 4.56 (the image has 5.x).
    dtype_key = "dtype" if tuple(int(p) for p in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"
    placement = _placement(device)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        settings.path, local_files_only=True, trust_remote_code=False, use_safetensors=True, **{dtype_key: dtype},
        **placement,
    )
    if settings.label >= model.config.num_labels:
        raise ValueError(f"label {settings.label} is out of range: the model has {model.config.num_labels} labels")
    if tokenizer.pad_token_id is None:
        # Padding positions are masked out and never the token read for the score
        # (the model finds the last real token), so any id will do.
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if not placement:
        model.to(device)
    model.eval()
    chat_template = bool(getattr(tokenizer, "chat_template", None))
    loaded = RewardModel(settings=settings, model=model, tokenizer=tokenizer, device=device,
                         device_name=device_name, dtype=str(dtype).removeprefix("torch."), load_seconds=0.0,
                         chat_template=chat_template,
                         info={"parameters": sum(p.numel() for p in model.parameters()),
                               "loaded_to": "device" if placement else "host"})
    # One pass before the first job (and before a CPU snapshot): lazy kernel set-up and
    # allocator growth happen here, not on the first batch a trainer waits for.
    loaded.score([("warm-up", "warm-up")])
    loaded.load_seconds = time.monotonic() - started
    return loaded
