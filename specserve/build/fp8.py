"""FP8 (E4M3) weight emulation for the torch engine: per-output-channel scales.

Format: OCP 8-bit floating point (E4M3, max 448), as in Micikevicius et al. 2022, "FP8 Formats
for Deep Learning" (arXiv:2209.05433). Each Linear weight W [out, in] of the decoder layers is
stored as ``q = round_e4m3(W / s)`` with ``s = amax(|W[o, :]|) / 448`` per output row, next to
``<name>_scale`` [out] float32 (ModelOpt's ``weight_scale`` naming). Embeddings, norms and the
LM head stay in the model dtype, matching TensorRT-LLM's FP8 ``exclude_modules`` (``lm_head``,
``*vocab_embedding``); Medusa heads are never quantized. Loading multiplies back (W' = q * s), so
the reference decoder sees exactly the rounding an FP8 engine's weights would have.
"""

from __future__ import annotations

import re

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_SUFFIX = "_scale"
_QUANTIZED = re.compile(r"\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")


def is_quantized_weight(name: str) -> bool:
    """True for the decoder-layer Linear weights that FP8 stores in E4M3."""
    return _QUANTIZED.search(name) is not None


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q [out, in] float8_e4m3fn, scale [out] float32)."""
    w32 = w.float()
    scale = (w32.abs().amax(dim=1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)  # [out]
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # [out, in]
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [out, in] e4m3, scale [out] -> float32 [out, in]."""
    return q.float() * scale.float()[:, None]


def quantize_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every decoder-layer Linear weight by its E4M3 copy plus a ``_scale`` tensor."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if is_quantized_weight(name) and t.dim() == 2:
            out[name], out[name + SCALE_SUFFIX] = quantize_per_channel(t)
        else:
            out[name] = t
    return out


def dequantize_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`quantize_state_dict` (float32 weights); other tensors unchanged."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in sd:
            continue
        scale = sd.get(name + SCALE_SUFFIX)
        out[name] = dequantize(t, scale) if t.dtype == torch.float8_e4m3fn and scale is not None \
            else t
    return out
