"""Tiny, random-init checkpoints for tests: a byte-level BPE tokenizer, Llama target and draft in
the Hugging Face layout (safetensors), and Medusa heads in the FasterDecoding layout that
TensorRT-LLM's ``examples/medusa/convert_checkpoint.py`` reads (``config.json`` with
``medusa_num_heads``/``medusa_num_layers``; ``medusa_lm_head.safetensors`` with tensors
``{h}.{l}.linear.weight|bias`` and ``{h}.{num_layers}.weight``). Everything is made offline and is
deterministic for a seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TINY_TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "for i in range(10):\n    print(i, i * i)\n\n"
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n"
) * 4

# Chinese, emoji and accented Latin: a BPE trained on it has multi-byte tokens, whole characters
# and also pieces of characters (a token ending or starting mid-character).
MULTILINGUAL_TEXT = (
    "你好，世界！今天天气很好。我们一起学习中文和编程。🙂🚀🎉 emoji 😀 héllo wörld ñandú "
    "数据 模型 推理 服务 😂👍 def add(a, b):\n    return a + b\n"
) * 8


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet (Radford et al. 2019, ``bytes_to_unicode``): char -> byte."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = dict(zip(keep, keep, strict=True))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def byte_level_char(byte: int) -> str:
    """The character that stands for ``byte`` in a byte-level BPE vocabulary."""
    return next(c for c, b in _byte_level_alphabet().items() if b == byte)


def token_bytes(tokenizer_json: Path, ids: list[int]) -> list[bytes]:
    """The raw bytes of each id of a byte-level BPE (``tokenizer.json``; special tokens as their
    text's UTF-8)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    alphabet = _byte_level_alphabet()
    out = []
    for i in ids:
        piece = tok.id_to_token(i)
        if piece is None:
            raise ValueError(f"id {i} is not in {tokenizer_json}")
        if all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        else:
            out.append(piece.encode("utf-8"))
    return out


def chars_split_across(chunks: list[list[bytes]]) -> list[str]:
    """Valid multi-byte characters whose bytes span a boundary between two chunks (each chunk
    the byte strings of its tokens), as a lossy UTF-8 decode of all the bytes yields them."""
    data = b"".join(b for chunk in chunks for b in chunk)
    bounds, pos = [], 0
    for chunk in chunks[:-1]:
        pos += sum(len(b) for b in chunk)
        bounds.append(pos)
    out = []
    for end in bounds:
        for start in range(max(0, end - 3), end):
            lead = data[start]
            size = 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else (
                4 if 0xF0 <= lead < 0xF5 else 0)
            if size and end < start + size <= len(data):
                try:  # a lead byte always starts a sequence: valid here means decoded whole
                    out.append(data[start:start + size].decode("utf-8"))
                except UnicodeDecodeError:
                    pass
    return out


@dataclass(frozen=True)
class TinyCheckpoint:
    """Paths of a tiny checkpoint set made by :func:`make_tiny_checkpoint`."""

    root: Path
    target: Path
    draft: Path
    medusa: Path
    tokenizer: Path


def make_tokenizer(out: Path, vocab_size: int = 256, text: str = TINY_TEXT) -> Path:
    """Train a byte-level BPE tokenizer on ``text`` and save it loadable by AutoTokenizer."""
    from specserve.train.tokenizer import train_tokenizer

    train_tokenizer([text], out, vocab_size)
    return out


def make_llama(
    out: Path,
    tokenizer_dir: Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    vocab_size: int | None = None,
) -> Path:
    """Save a random-init LlamaForCausalLM (fp32, safetensors) plus a copy of the tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    cfg = LlamaConfig(
        vocab_size=vocab_size or len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


def make_qwen3(
    out: Path,
    tokenizer_dir: Path,
    *,
    hidden_size: int = 48,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    seed: int = 0,
    norm_noise: float = 0.3,
    **config: object,
) -> Path:
    """Save a random-init Qwen3ForCausalLM (fp32, safetensors) plus a copy of the tokenizer.

    ``head_dim`` defaults to 16 with hidden 48 / 4 heads (12): independent of the hidden size, as
    in Qwen3-0.6B (1024 / 16 heads, head_dim 128). Every RMSNorm weight (q_norm and k_norm too)
    gets noise of std ``norm_noise`` so a wrong or missing norm changes the output. No EOS id in
    the config, so HF ``generate()`` runs to ``max_new_tokens``."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden_size,
                      intermediate_size=hidden_size * 2, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=512, **config)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * norm_noise)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


def make_medusa_heads(
    out: Path,
    hidden_size: int,
    vocab_size: int,
    *,
    num_heads: int = 4,
    num_layers: int = 1,
    seed: int = 0,
    base_model: str = "target",
) -> Path:
    """Random Medusa-1 heads in the FasterDecoding layout (what TensorRT-LLM's converter reads)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            w = torch.randn(hidden_size, hidden_size, generator=g) * 0.02
            tensors[f"{h}.{layer}.linear.weight"] = w
            tensors[f"{h}.{layer}.linear.bias"] = torch.zeros(hidden_size)
        lm = torch.randn(vocab_size, hidden_size, generator=g) * 0.02
        tensors[f"{h}.{num_layers}.weight"] = lm
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "medusa_lm_head.safetensors"))
    cfg = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": base_model,
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def make_tiny_checkpoint(root: Path, *, seed: int = 0, vocab_size: int = 256,
                         text: str = TINY_TEXT) -> TinyCheckpoint:
    """Tokenizer (trained on ``text``), target (2 layers, hidden 64), independent random draft
    (1 layer, hidden 32) and 4 Medusa heads under ``root``."""
    tok = make_tokenizer(root / "tokenizer", vocab_size=vocab_size, text=text)
    target = make_llama(root / "target", tok, seed=seed)
    draft = make_llama(root / "draft", tok, hidden_size=32, layers=1, heads=2, kv_heads=1,
                       seed=seed + 1)
    n_vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    medusa = make_medusa_heads(root / "medusa", 64, n_vocab, seed=seed + 2)
    return TinyCheckpoint(root=root, target=target, draft=draft, medusa=medusa, tokenizer=tok)
