"""Grammar-constrained distributions (structured output), pure tensor math.

A grammar matcher (xgrammar's ``GrammarMatcher.fill_next_token_bitmask``, mlc-ai/xgrammar
``python/xgrammar/matcher.py``) describes the tokens allowed next as an int32 bitmask of
``ceil(V / 32)`` words (``get_bitmask_shape``): bit ``j`` of word ``w`` set = token ``32 w + j``
allowed. The *constrained* distribution of a position is the target's with every disallowed
logit set to -inf, before temperature, top-k and top-p (as xgrammar's
``apply_token_bitmask_inplace`` does to logits). Speculative verification stays exact with
respect to that distribution (Leviathan et al. 2023, Alg. 1) when both sides are constrained:
the target's logits are masked at every verified position, and the draft's q is masked and
renormalized over the same allowed set, because a draft outside the set is cut before
verification, so the drafts that reach the verifier are distributed as the renormalized q.
"""

from __future__ import annotations

import torch

WORD_BITS = 32


def bitmask_to_allowed(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask ``[..., W]`` int32 (W = ceil(V / 32)) -> allowed ``[..., V]`` bool."""
    shifts = torch.arange(WORD_BITS, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask.to(torch.int32)[..., None] >> shifts) & 1  # [..., W, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()  # [..., V]


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits ``[..., V]``, allowed ``[..., V]`` bool -> a copy with -inf where not allowed."""
    return logits.masked_fill(~allowed, float("-inf"))


def mask_probs(probs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """probs ``[..., V]`` (a draft's q), allowed ``[..., V]`` bool -> q restricted to the allowed
    tokens and renormalized (float32; a row with no mass left stays all zero)."""
    kept = probs.float() * allowed
    mass = kept.sum(dim=-1, keepdim=True)
    return kept / mass.clamp_min(1e-30)
