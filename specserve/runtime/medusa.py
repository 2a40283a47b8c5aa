"""Medusa-1 decoding heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads", arXiv 2401.10774, §2.1.1); the one definition, which decoding
(:mod:`specserve.runtime.proposers.medusa`) and training (:mod:`specserve.train.medusa`) share.

Each head reads the target's final hidden state (after the final norm) at the last verified
position; head h predicts the token at offset h+2 from that position (head 0 = the token after
the one the target itself samples). A head is ``num_layers`` ResBlocks ``x + SiLU(Linear(x))``
(the linear starts at zero, an identity block, as FasterDecoding's ``ResBlock``) followed by a
bias-free Linear to the vocabulary: the FasterDecoding layout (``{h}.{l}.linear.weight|bias``,
``{h}.{num_layers}.weight``) that TensorRT-LLM converts; the module's own state-dict names are
those under ``heads.``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)); the linear starts at zero (identity block)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` heads of ``num_layers`` ResBlocks over hidden size ``hidden`` and a
    vocabulary of ``vocab``; state-dict names ``heads.{h}.{l}.linear.*`` and
    ``heads.{h}.{num_layers}.weight``."""

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int) -> None:
        super().__init__()
        self.hidden, self.vocab = hidden, vocab
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
        heads = cls(int(hidden), int(vocab), num_heads, num_layers)
        heads.load_state_dict({k: sd[k.removeprefix("heads.")] for k in heads.state_dict()},
                              strict=True)
        return heads.eval()

    def init_lm_heads(self, lm_head_weight: torch.Tensor) -> None:
        """Copy the base LM head [V, H] into every head's last Linear (with zero ResBlocks, a
        fresh head then equals the base LM head)."""
        for head in self.heads:
            last = list(head.children())[-1]
            assert isinstance(last, nn.Linear)
            last.weight.data.copy_(lm_head_weight.detach().float())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., num_heads, V], in the heads' dtype."""
        return torch.stack([head(hidden) for head in self.heads], dim=-2)

    def layout_state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors under the FasterDecoding names, fp32, contiguous."""
        return {k.removeprefix("heads."): v.detach().float().contiguous().cpu()
                for k, v in self.state_dict().items()}
