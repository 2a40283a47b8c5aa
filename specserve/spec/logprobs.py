"""Log-probabilities of emitted tokens (TensorRT-LLM's ``output_log_probs`` / ``cum_log_probs``;
OpenAI's ``logprobs`` / ``top_logprobs``), from the logits the token was chosen from.

Which distribution (vLLM calls the choice ``logprobs_mode``): the target's logits at the
position that chose the token (under speculation the verify forward's, no extra forward), with
the min_tokens stop ban applied (-inf, as when it was chosen), divided by the temperature when it
is > 0 (T = 0, greedy: T = 1, the model's own distribution), then log-softmax over the whole
vocabulary: BEFORE top-k / top-p truncation, so a token outside a top-k still has a finite
log-probability and the alternatives are not renormalised. The reference engine serves no
penalties (repetition/presence/frequency are refused), so there are none to apply. Speculation
does not change these numbers: a token emitted after k accepted drafts was chosen from the logits
of the same context as without speculation (tests/runtime/test_logprobs.py, 1e-4 in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    """Per emitted token: its log-probability ``[n]`` and the ``k`` most likely alternatives
    (ids ``[n, k]``, log-probabilities ``[n, k]``, most likely first; k may be 0)."""

    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


def token_logprobs(logits: torch.Tensor, tokens: list[int], temperature: float,
                   top: int) -> TokenLogprobs:
    """logits [n, V] (row i chose ``tokens[i]``) -> :class:`TokenLogprobs` in float32."""
    scale = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits.float() / scale, dim=-1)  # [n, V]
    idx = torch.tensor(tokens, dtype=torch.long, device=lp.device)[:, None]
    own = lp.gather(1, idx)[:, 0].tolist()
    if top <= 0:
        return TokenLogprobs(own, [[] for _ in tokens], [[] for _ in tokens])
    vals, ids = lp.topk(min(top, lp.shape[-1]), dim=-1)
    return TokenLogprobs(own, ids.tolist(), vals.tolist())
