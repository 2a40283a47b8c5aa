"""Medusa-1 decoding heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads", arXiv 2401.10774, §2.1.1).

Each head reads the target's final hidden state (after the final norm) at the last verified
position; head h predicts the token at offset h+2 from that position (head 0 = the token after
the one the target itself samples). A head is ``num_layers`` ResBlocks ``x + SiLU(Linear(x))``
followed by a bias-free Linear to the vocabulary: the FasterDecoding layout
(``{h}.{l}.linear.weight|bias``, ``{h}.{num_layers}.weight``) that TensorRT-LLM converts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` heads; :meth:`forward` maps hidden [B, H] to logits [B, num_heads, V]."""

    def __init__(self, num_heads: int, num_layers: int, hidden: int, vocab: int) -> None:
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)],
                          nn.Linear(hidden, vocab, bias=False))
            for _ in range(num_heads))

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], num_heads: int,
                        num_layers: int) -> MedusaHeads:
        """Build from a FasterDecoding state dict (already shape-checked by the loader)."""
        vocab, hidden = sd[f"0.{num_layers}.weight"].shape
        heads = cls(num_heads, num_layers, int(hidden), int(vocab))
        ours = {}
        for h in range(num_heads):
            for layer in range(num_layers):
                for p in ("weight", "bias"):
                    ours[f"heads.{h}.{layer}.linear.{p}"] = sd[f"{h}.{layer}.linear.{p}"]
            ours[f"heads.{h}.{num_layers}.weight"] = sd[f"{h}.{num_layers}.weight"]
        heads.load_state_dict(ours, strict=True)
        return heads.eval()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, H] -> float32 logits [B, num_heads, V]."""
        return torch.stack([head(hidden) for head in self.heads], dim=1).float()
