"""The chi-square check of the losslessness tests: observed counts against exact probabilities,
cells expected below 5 pooled into one (the usual validity rule)."""

from __future__ import annotations

import torch


def chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of ``counts`` (any shape) under ``probs`` (same shape, summing to 1)."""
    from scipy.stats import chisquare

    expected = probs.flatten() * counts.sum()
    keep = expected >= 5  # pool small cells into one
    obs = torch.cat([counts.flatten()[keep], counts.flatten()[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)
