"""Byte-level BPE tokenizer (Radford et al. 2019, GPT-2 byte-level BPE) trained with the
``tokenizers`` library, saved as ``tokenizer.json`` + ``tokenizer_config.json`` so that
``AutoTokenizer.from_pretrained(dir)`` loads it offline. Same special tokens and layout as
the tests' tiny checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
# A minimal chat template (Jinja, as transformers' ``apply_chat_template`` and Dynamo's frontend
# read it from tokenizer_config.json): "role: content" lines, then "assistant:" to generate.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def train_tokenizer(texts: Iterable[str], out: Path, vocab_size: int) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts``; save it under ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE  # /v1/chat/completions (Dynamo's frontend needs one)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def encode_documents(tok: PreTrainedTokenizerBase, texts: list[str]) -> list[torch.Tensor]:
    """Token ids of each text ([n_i] int64 each), without special tokens."""
    import torch

    ids = tok(texts, add_special_tokens=False)["input_ids"]
    return [torch.tensor(x, dtype=torch.int64) for x in ids]


def concat_with_eos(docs: list[torch.Tensor], eos_id: int) -> torch.Tensor:
    """One token stream [N] int64: the documents, each followed by ``eos_id``."""
    import torch

    parts: list[torch.Tensor] = []
    for d in docs:
        parts.append(d)
        parts.append(torch.tensor([eos_id], dtype=torch.int64))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
