"""Tiny GGUF files for tests, written with the ``gguf`` package's own writer.

:func:`write_gguf` turns a tiny Hugging Face checkpoint (``tests/helpers/tiny.py``) into a GGUF
the way llama.cpp's ``convert_hf_to_gguf.py`` lays one out: the ``<arch>.*`` hyperparameters,
the byte-level BPE vocabulary as ``tokenizer.ggml.*`` (model ``gpt2``), tensors under GGUF names
(gguf's own name table) in ggml order, and, for ``llama``, Q and K rows permuted from rotate-half
to interleaved pairs (``LlamaModel.permute``). Test-only code: the product reads GGUF, never
writes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K permutation: per head, rotate-half rows -> interleaved pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _vocab(tok_dir: Path) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """Tokens by id, their GGUF token types (1 normal, 3 control), merges, special ids."""
    data = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(data["model"]["vocab"])
    special = {t["content"]: t["id"] for t in data.get("added_tokens", []) if t.get("special")}
    vocab.update(special)
    tokens = [""] * (max(vocab.values()) + 1)
    for tok, i in vocab.items():
        tokens[i] = tok
    types = [3 if t in special else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, types, merges, special


def _metadata(w: Any, cfg: dict[str, Any], arch: str, name: str) -> None:
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])


def _tokenizer(w: Any, tok_dir: Path, chat_template: str | None) -> None:
    tokens, types, merges, special = _vocab(tok_dir)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, adder in (("<s>", w.add_bos_token_id), ("</s>", w.add_eos_token_id),
                       ("<unk>", w.add_unk_token_id), ("<pad>", w.add_pad_token_id)):
        if key in special:
            adder(special[key])
    if chat_template:
        w.add_chat_template(chat_template)


def _gguf_tensors(hf_dir: Path, cfg: dict[str, Any], arch: str) -> dict[str, np.ndarray]:
    import gguf
    from safetensors.numpy import load_file

    sd = load_file(str(hf_dir / "model.safetensors"))
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    table = gguf.get_tensor_name_map(arch_id, cfg["num_hidden_layers"])
    out: dict[str, np.ndarray] = {}
    for hf, value in sd.items():
        if hf == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        stem, _, suffix = hf.rpartition(".")
        gname = table.get_name(stem)
        assert gname is not None, hf
        if arch == "llama" and stem.endswith("q_proj"):
            value = permute_rope_rows(value, cfg["num_attention_heads"])
        elif arch == "llama" and stem.endswith("k_proj"):
            value = permute_rope_rows(value, cfg["num_key_value_heads"])
        out[f"{gname}.{suffix}"] = np.ascontiguousarray(value, dtype=np.float32)
    return out


def write_gguf(hf_dir: Path, path: Path, *, qtypes: dict[str, str] | None = None,
               arch: str | None = None, name: str = "tiny test model",
               chat_template: str | None = None, tokenizer: bool = True,
               extra: dict[str, np.ndarray] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """Write ``hf_dir`` as a GGUF at ``path``. ``qtypes`` maps a GGUF tensor-name substring
    (``"ffn_"``, ``"attn_q"``) to a ggml type name quantized by gguf's own quantizer (2-D
    weights only; the default is F32); ``arch`` overrides ``general.architecture``; ``extra``
    adds float32 tensors as they are; ``drop`` leaves GGUF tensors out; ``tokenizer=False``
    writes no ``tokenizer.ggml.*``."""
    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    real_arch = cfg["model_type"]
    w = gguf.GGUFWriter(str(path), arch or real_arch)
    _metadata(w, cfg, real_arch, name)
    if tokenizer:
        _tokenizer(w, hf_dir, chat_template)
    for gname, value in {**_gguf_tensors(hf_dir, cfg, real_arch), **(extra or {})}.items():
        if gname in drop:
            continue
        qtype = next((q for key, q in (qtypes or {}).items() if key in gname), "F32")
        if qtype == "F32" or value.ndim != 2:
            w.add_tensor(gname, value)
            continue
        t = gguf.GGMLQuantizationType[qtype]
        w.add_tensor(gname, gguf.quants.quantize(value, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_raw_tensor_gguf(path: Path, tensors: dict[str, tuple[str, np.ndarray, int]]) -> Path:
    """A GGUF holding only raw blocks: name -> (ggml type name, uint8 block bytes [rows, row
    bytes], values per row). For dequantization checks of hand-made blocks."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for name, (qtype, raw, _per_row) in tensors.items():
        t = gguf.GGMLQuantizationType[qtype]
        if qtype in ("F32", "F16"):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
