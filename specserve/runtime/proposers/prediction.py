"""Predicted Outputs (OpenAI's ``prediction``, a client-supplied guess of the output, e.g. the
unedited file of a code edit): the prediction is a draft source. Each step, the longest suffix
of the request's output so far (up to :data:`MAX_MATCH` tokens) is looked up in the prediction
and what follows it there is proposed (at the start, the prediction's first tokens); among
several matches of that suffix the one nearest the output's own position wins (an edit shifts
the alignment by a few tokens, never far). No match: the engine's own proposer drafts that
row, or nothing (plain decoding) when it has none. Drafts are one-hot (q = 1 on the predicted
token), so verification stays lossless: greedy at T = 0, rejection sampling otherwise (the
prompt-lookup argument of Saxena 2023; vLLM's n-gram proposer is the same idea over the
prompt).

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
MAX_PREDICTION_DRAFT = 16  # most prediction drafts per step


def prediction_drafts(out: Sequence[int], prediction: Sequence[int], k: int) -> list[int]:
    """Up to ``k`` tokens of ``prediction`` after the longest suffix of ``out`` found in it
    (the occurrence whose end is nearest ``len(out) - 1``); ``prediction[:k]`` for an empty
    output; [] when no token of the suffix matches or nothing follows the match."""
    if k <= 0 or not prediction:
        return []
    pred = list(prediction)
    if not out:
        return pred[:k]
    size, here = len(pred), len(out) - 1
    for n in range(min(MAX_MATCH, len(out)), 0, -1):
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
