"""Reward models made from a config, with random weights: for tests and benchmarks, no hub needed.

Needs torch and transformers (imported on call), nothing else of sandboxd's, so
that it also runs on a machine with only those installed (the GPU benchmark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Words the models' tokenizer knows; anything else is <unk>.
_WORDS = (
    "the a an is are was to of and or not no yes it this that answer question what why how which "
    "one two three four five six seven eight nine ten zero plus minus times equals result final "
    "i you we they think so because therefore correct wrong good bad maybe please explain step "
    "first then next last code python function return print value list number sum add test pass "
    ". , ? ! : ( ) = + - * /"
)
VOCABULARY = tuple(_WORDS.split())
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "[CLS]", "[SEP]", "<|user|>", "<|assistant|>", "<|end|>")
# Transformer shapes by name: `tiny` for tests (well under 1 MB), `small` for the CPU
# benchmark, `1b` and `8b` the shapes of Llama-3.2-1B and Llama-3.1-8B (the base of
# Skywork-Reward-V2-Llama-3.1-8B) for the GPU benchmark, with this small vocabulary.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "small": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8},
}


def make_reward_model(folder: Path, *, kind: str = "llama", size: str = "tiny", seed: int = 0,
                      dtype: str = "float32", init_device: str = "cpu") -> Path:
    """Save a randomly initialised sequence-classification reward model and its tokenizer in ``folder``.

    ``llama``: a LlamaForSequenceClassification whose tokenizer has a chat template (the
    common shape of reward models); ``bert``: a BertForSequenceClassification without one,
    scored as a text pair (``tiny`` only). The same seed gives the same files on one
    ``init_device``; ``init_device="cuda"`` initialises the weights on the GPU (an 8B shape
    takes seconds there instead of minutes on the CPU).
    """
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate([*SPECIALS, *VOCABULARY])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    shape = SHAPES[size]
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # Random weights from a wide distribution, so that different pairs get clearly different scores.
    common: dict[str, Any] = {
        "vocab_size": len(vocab), "max_position_embeddings": 512 if size == "tiny" else 8192, "num_labels": 1,
        "initializer_range": 0.3 if size == "tiny" else 0.02, "pad_token_id": vocab["<pad>"]}
    if kind == "llama":
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
            additional_special_tokens=["<|user|>", "<|assistant|>", "<|end|>"])
        tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
                                   "<|end|> {% endfor %}")
        config: transformers.PretrainedConfig = transformers.LlamaConfig(
            **shape, **common, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"])
        model_class: type[transformers.PreTrainedModel] = transformers.LlamaForSequenceClassification
    elif kind == "bert" and size == "tiny":
        backend.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]", pad_token="<pad>", unk_token="<unk>")
        bert = {key: value for key, value in shape.items() if key != "num_key_value_heads"}
        config = transformers.BertConfig(**bert, **common)
        model_class = transformers.BertForSequenceClassification
    else:
        raise ValueError(f"no {size} {kind} model")
    config.dtype = dtype
    # Big shapes are initialised in their final dtype (an 8B model in float32 is 30 GB).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(init_device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder
