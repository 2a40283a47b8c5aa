"""GGUF tensors as Hugging Face tensors: names, the rotary layout of Q and K, dequantization.

- Names: gguf's own table (``gguf.get_tensor_name_map(arch, n_blocks)``, the map llama.cpp's
  converter writes with) maps each Hugging Face module name to its GGUF name
  (``model.layers.3.self_attn.q_proj`` -> ``blk.3.attn_q``); we invert it over the names the
  Hugging Face model of the config has, as transformers' own GGUF loader does.
- Rotary layout: llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``)
  reorders the rows of ``q_proj`` and ``k_proj`` of ``llama`` checkpoints from Hugging Face's
  rotate-half layout to GGML's interleaved pairs: per head, ``reshape(h, 2, d/2, in)`` then
  ``swapaxes(1, 2)``. :func:`unpermute_rope_rows` is its inverse. Qwen2/Qwen3 are written with
  NeoX-style rotary and are not permuted.
- Values: ``gguf.quants.dequantize`` (float32), then the requested dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specserve.errors import SpecserveError

if TYPE_CHECKING:
    import torch
    from gguf import ReaderTensor

#: GGUF architectures whose Q/K rows llama.cpp permutes on conversion.
PERMUTED_ARCHITECTURES = ("llama",)


def unpermute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation. w [n_head * d, ...] -> [n_head * d, ...]."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise SpecserveError(f"cannot un-permute {rows} rows into {n_head} rotary heads")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_to_gguf_names(arch: str, n_layers: int, hf_names: list[str]) -> dict[str, str]:
    """GGUF name -> Hugging Face name for the tensors of ``hf_names`` gguf's table knows."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    table = get_tensor_name_map(arch_id, n_layers)
    out: dict[str, str] = {}
    for hf in hf_names:
        stem, _, suffix = hf.rpartition(".")
        gguf_stem = table.get_name(stem)
        if gguf_stem is not None:
            out[f"{gguf_stem}.{suffix}"] = hf
    return out


def dequantized(t: ReaderTensor) -> Any:
    """The tensor's values as a float32 numpy array in Hugging Face order [rows, cols]."""
    import numpy as np
    from gguf.quants import dequantize

    values = dequantize(t.data, t.tensor_type)
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    return np.array(values, dtype=np.float32, copy=True).reshape(shape)  # owned, writable


def hf_tensor(t: ReaderTensor, hf_name: str, arch: str, heads: tuple[int, int],
              dtype: torch.dtype) -> torch.Tensor:
    """One GGUF tensor as the Hugging Face tensor ``hf_name`` in ``dtype``; ``heads`` is
    (attention heads, KV heads) for the rotary un-permutation."""
    import torch

    w = torch.from_numpy(dequantized(t))
    if arch in PERMUTED_ARCHITECTURES:
        if hf_name.endswith("self_attn.q_proj.weight"):
            w = unpermute_rope_rows(w, heads[0])
        elif hf_name.endswith("self_attn.k_proj.weight"):
            w = unpermute_rope_rows(w, heads[1])
    return w.to(dtype).contiguous()
