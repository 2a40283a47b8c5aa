"""Turning logits into the distributions that verification compares.

Temperature 0 is greedy: the distribution is one-hot on the argmax, so rejection sampling with it
reduces exactly to greedy verification. Top-k then top-p (nucleus, Holtzman et al. 2020) filtering
is applied to the tempered distribution, in that order, as in Hugging Face and vLLM. Speculative
verification is lossless for whatever distribution this function defines, as long as draft and
target use the same function.
"""

from __future__ import annotations

import torch


def logits_to_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Probabilities from logits ``[..., V]`` (fp32 out, same shape).

    ``temperature == 0`` gives a one-hot argmax; ``top_k <= 0`` and ``top_p >= 1`` disable those
    filters.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    x = logits.float()
    if temperature == 0.0:
        idx = x.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(x).scatter_(-1, idx, 1.0)
    x = x / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        cum = sorted_p.cumsum(dim=-1)
        drop_sorted = (cum - sorted_p) >= top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from ``probs [B, V]`` -> ``[B]`` int64."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
