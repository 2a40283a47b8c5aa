"""Predicted Outputs (OpenAI's ``prediction``, a client-supplied guess of the output, e.g. the
unedited file of a code edit): the prediction is a draft source. Each step, the longest suffix
of the request's output so far (up to :data:`MAX_MATCH` tokens, at least :data:`MIN_MATCH`) is
looked up in the prediction and what follows it there is proposed; while the output is shorter
than that, it must be the prediction's beginning (then the prediction's next tokens are
proposed). Among several matches of the suffix the one nearest the output's own position wins
(an edit shifts the alignment by a few tokens, never far). A match of fewer than MIN_MATCH
tokens is a miss (one common token would propose garbage that costs a long verify forward): the
engine's own proposer drafts that row, or nothing (plain decoding) when it has none. Drafts are
one-hot (q = 1 on the predicted token), so verification stays lossless: greedy at T = 0,
rejection sampling otherwise (the prompt-lookup argument of Saxena 2023; vLLM's n-gram proposer
is the same idea over the prompt).

The overlay is applied by the decoder after the engine's proposer (which is asked for a chain
when any row has a prediction: ``ProposalRequest.chain_only``); it keeps no state, so it joins
and leaves in-flight batches as the rows do. Counts for the response (OpenAI's
``accepted_prediction_tokens`` / ``rejected_prediction_tokens``): prediction drafts accepted by
verification, and the prediction's length minus that.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.runtime.proposers.base import ChainProposal, pad_drafts

MAX_MATCH = 32  # longest output suffix looked up in the prediction
MIN_MATCH = 3  # shortest suffix match that proposes (shorter outputs: a prefix match)
MAX_PREDICTION_DRAFT = 16  # most prediction drafts per step


def prediction_drafts(out: Sequence[int], prediction: Sequence[int], k: int,
                      min_match: int = MIN_MATCH) -> list[int]:
    """Up to ``k`` tokens of ``prediction`` after the longest suffix of ``out`` (at least
    ``min_match`` tokens) found in it, the occurrence whose end is nearest ``len(out) - 1``;
    an output shorter than ``min_match`` that begins the prediction gets what follows it there;
    [] on a miss or when nothing follows the match."""
    if k <= 0 or not prediction:
        return []
    pred = list(prediction)
    if len(out) < min_match:
        return pred[len(out):len(out) + k] if pred[:len(out)] == list(out) else []
    size, here = len(pred), len(out) - 1
    for n in range(min(MAX_MATCH, len(out)), min_match - 1, -1):
        suffix = list(out[-n:])
        ends = [i for i in range(n - 1, size - 1)
                if pred[i] == suffix[-1] and pred[i - n + 1:i + 1] == suffix]
        if ends:
            end = min(ends, key=lambda i: (abs(i - here), i))
            return pred[end + 1:end + 1 + k]
    return []


def overlay(base: ChainProposal | None, rows: dict[int, list[int]], batch: int, k_base: int,
            device: torch.device | str) -> ChainProposal:
    """The chain of ``base`` (the engine proposer's; None = none) with row b's drafts replaced
    by ``rows[b]`` (one-hot q) for every b in ``rows``. ``k_base``: the drafts of ``base``
    that count (its counts are capped to the step's limits by the caller)."""
    k = max([k_base, *(len(r) for r in rows.values())])
    tokens = torch.zeros(batch, k, dtype=torch.long, device=device)
    counts = [0] * batch
    probs: torch.Tensor | None = None
    if base is not None:
        kb = min(k_base, base.tokens.shape[1])
        tokens[:, :kb] = base.tokens[:, :kb].to(device)
        counts = [min(c, kb) for c in base.counts]
        if base.probs is not None:
            q = base.probs[:, :kb]
            probs = torch.zeros(batch, k, q.shape[-1], dtype=q.dtype, device=q.device)
            probs[:, :kb] = q
    for b, drafts in rows.items():
        tokens[b] = pad_drafts([drafts], k, device)[0]
        counts[b] = len(drafts)
        if probs is not None:  # one-hot q on the predicted tokens
            probs[b] = 0
            if drafts:
                probs[b, torch.arange(len(drafts)), torch.tensor(drafts)] = 1.0
    acceptance = base.acceptance if base is not None else "exact"
    return ChainProposal(tokens, counts, probs, acceptance)
