"""Lossless verification of draft tokens (speculative decoding).

Terminology (as in vLLM's rejection sampler; note gpt-fast swaps p and q):

- ``p`` is the **target** model's distribution, ``q`` the **draft**'s (draft model, Medusa head or
  n-gram lookup). K draft tokens ``x_1..x_K`` are proposed; the target scores all K+1 positions in
  one forward.
- An **accepted** token is a draft token that passed verification.
- A **recovered** (resampled) token replaces the first rejected draft token.
- A **bonus** token is sampled from ``p`` at position K when all K drafts were accepted.

Each verify step therefore emits ``accepted + 1`` tokens (1 <= n <= K+1).

Greedy (temperature 0): accept while ``x_i == argmax p_i``; the emitted next token is
``argmax p`` at the first mismatch (or at K). Output equals greedy decoding of the target.

Rejection sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Alg. 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling"):
accept ``x_i`` with probability ``min(1, p(x_i)/q(x_i))``; at the first rejection sample from
``norm(max(0, p - q))``; if all K pass sample the bonus from ``p_{K}``. The emitted tokens are
distributed exactly as sampling from ``p`` token by token. Edge cases handled without division:
``q(x) = 0`` (accepted iff ``p(x) > 0``) and ``p == q`` (residual all zero: never reached by a
rejection with ``q(x) > 0``; falls back to ``p`` if it is). Drafts without probabilities (n-gram,
greedy Medusa chain) are the one-hot ``q`` case.

Typical acceptance (Cai et al. 2024, "Medusa", §2.3.1) is **lossy**: it accepts tokens the target
finds plausible enough, changing the output distribution. It is a separate, clearly named function
and never the default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.spec.sampling import sample


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one step for a batch.

    ``tokens [B, K+1]`` int64: the emitted tokens (accepted drafts, then the recovered or bonus
    token), ``-1`` after them. ``num_emitted [B]`` int64: accepted + 1.
    """

    tokens: torch.Tensor
    num_emitted: torch.Tensor

    @property
    def num_accepted(self) -> torch.Tensor:
        """``[B]`` number of accepted draft tokens."""
        return self.num_emitted - 1

    def emitted(self, row: int) -> list[int]:
        """The emitted tokens of one row as a Python list."""
        return [int(t) for t in self.tokens[row, : int(self.num_emitted[row])]]


def _check_shapes(draft_tokens: torch.Tensor, scores: torch.Tensor) -> tuple[int, int]:
    if draft_tokens.dim() != 2 or scores.dim() != 3:
        raise ValueError("expected draft_tokens [B, K] and target scores [B, K+1, V]")
    b, k = draft_tokens.shape
    if scores.shape[0] != b or scores.shape[1] != k + 1:
        raise ValueError(
            f"target scores {tuple(scores.shape)} do not match "
            f"draft_tokens {tuple(draft_tokens.shape)}"
        )
    return b, k


def _assemble(
    draft_tokens: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor
) -> VerifyResult:
    """Drafts up to ``num_accepted``, then ``next_token``, then -1."""
    b, k = draft_tokens.shape
    cols = torch.arange(k + 1, device=draft_tokens.device).expand(b, k + 1)
    padded = torch.cat([draft_tokens.long(), draft_tokens.new_full((b, 1), -1).long()], dim=1)
    tokens = torch.where(cols < num_accepted[:, None], padded, torch.full_like(padded, -1))
    tokens = torch.where(cols == num_accepted[:, None], next_token[:, None].long(), tokens)
    return VerifyResult(tokens=tokens, num_emitted=num_accepted + 1)


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """``accept [B, K]`` bool -> ``[B]`` length of the all-True prefix."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy verification.

    draft_tokens: ``[B, K]`` int; target_logits: ``[B, K+1, V]`` (row i scores the token after
    the i-th draft prefix). Each row stops at its own first mismatch.
    """
    _, k = _check_shapes(draft_tokens, target_logits)
    best = target_logits.argmax(dim=-1)  # [B, K+1]
    n_acc = _accepted_prefix(draft_tokens.long() == best[:, :k])  # [B]
    next_token = best.gather(1, n_acc[:, None]).squeeze(1)  # [B]
    return _assemble(draft_tokens, n_acc, next_token)


def _gather_token_probs(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs [B, K, V]``, ``tokens [B, K]`` -> ``[B, K]`` probability of each token."""
    return probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> VerifyResult:
    """Lossless speculative sampling (Leviathan et al. 2023, Alg. 1).

    draft_tokens: ``[B, K]``; draft_probs: ``[B, K, V]`` q, or None for one-hot q on the drafts;
    target_probs: ``[B, K+1, V]`` p. Randomness: ``[B, K]`` uniforms then one multinomial draw
    per row, all from ``generator``.
    """
    b, k = _check_shapes(draft_tokens, target_probs)
    p = target_probs.float()
    p_x = _gather_token_probs(p[:, :k], draft_tokens)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
        q_full = torch.zeros_like(p[:, :k]).scatter_(-1, draft_tokens.long().unsqueeze(-1), 1.0)
    else:
        if draft_probs.shape != p[:, :k].shape:
            raise ValueError(f"draft_probs {tuple(draft_probs.shape)} must be [B, K, V]")
        q_full = draft_probs.float()
        q_x = _gather_token_probs(q_full, draft_tokens)
    u = torch.rand((b, k), generator=generator, device=p.device)  # [B, K] in [0, 1)
    accept = u * q_x < p_x  # u < p/q without dividing; q=0 accepts iff p>0
    n_acc = _accepted_prefix(accept)  # [B]

    rows = torch.arange(b, device=p.device)
    p_n = p[rows, n_acc]  # [B, V] target at the stop position
    q_pad = torch.cat([q_full, torch.zeros_like(p[:, :1])], dim=1)  # [B, K+1, V]; q=0 at K
    residual = (p_n - q_pad[rows, n_acc]).clamp_min(0.0)  # == p_n for bonus rows
    mass = residual.sum(dim=-1, keepdim=True)
    dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)
    next_token = sample(dist, generator)
    return _assemble(draft_tokens, n_acc, next_token)


def typical_acceptance(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> VerifyResult:
    """LOSSY Medusa typical acceptance (Cai et al. 2024, §2.3.1); never the default.

    Accept ``x_i`` while ``p_i(x_i) > min(threshold, alpha * exp(-H(p_i)))``; the next token is
    sampled from ``p`` at the stop position. Changes the output distribution.
    """
    _, k = _check_shapes(draft_tokens, target_probs)
    p = target_probs.float()
    p_x = _gather_token_probs(p[:, :k], draft_tokens)
    entropy = -(p[:, :k] * torch.log(p[:, :k].clamp_min(1e-30))).sum(-1)  # [B, K]
    limit = torch.minimum(
        torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy)
    )
    n_acc = _accepted_prefix(p_x > limit)
    rows = torch.arange(p.shape[0], device=p.device)
    next_token = sample(p[rows, n_acc], generator)
    return _assemble(draft_tokens, n_acc, next_token)
