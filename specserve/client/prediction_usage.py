"""The client's own count of ``accepted_prediction_tokens`` (OpenAI's usage field of Predicted
Outputs), recomputed from the emitted tokens and the prediction alone, to check what a server
reports.

At T = 0 the engine's steps can be replayed: the first token comes from the prefill; each later
step drafts from the prediction by the published lookup (docs/methods/predicted-outputs.md:
the longest suffix of the output so far, :data:`MIN_MATCH` to :data:`MAX_MATCH` tokens, found in
the prediction, the occurrence nearest the output's position; an output shorter than MIN_MATCH
must begin the prediction), at most ``max_draft`` tokens and never past ``max_tokens``. Greedy
verification keeps the longest run of drafts the output agrees with, then emits one token of the
target's own, so the step ends there. A step whose lookup misses drafts with the engine's own
proposer (``fallback``: its drafts at that output position, capped as the engine caps them;
None = plain decoding, one token).
The accepted prediction drafts summed over the steps are the count. This module is written
apart from the engine's (:mod:`specserve.runtime.proposers.prediction`) on purpose: a test
holds the two lookups equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_MATCH = 32
MIN_MATCH = 3
MAX_DRAFT = 16

Fallback = Callable[[int], Sequence[int]]  # output position -> the proposer's drafts there


def lookup(out: Sequence[int], prediction: Sequence[int], k: int,
           min_match: int = MIN_MATCH) -> list[int]:
    """Up to ``k`` prediction tokens that follow the longest suffix of ``out`` found in it."""
    if k <= 0 or not prediction:
        return []
    pred, out = list(prediction), list(out)
    if len(out) < min_match:
        return pred[len(out):len(out) + k] if pred[:len(out)] == out else []
    for n in range(min(MAX_MATCH, len(out)), min_match - 1, -1):
        suffix = out[-n:]
        ends = [i for i in range(n - 1, len(pred) - 1) if pred[i - n + 1:i + 1] == suffix]
        if ends:
            end = min(ends, key=lambda i: (abs(i - (len(out) - 1)), i))
            return pred[end + 1:end + 1 + k]
    return []


def agreed(drafts: Sequence[int], emitted: Sequence[int], at: int) -> int:
    """How many of ``drafts`` the output repeats from position ``at`` on."""
    n = 0
    while n < len(drafts) and at + n < len(emitted) and emitted[at + n] == drafts[n]:
        n += 1
    return n


def accepted_prediction_tokens(emitted: Sequence[int], prediction: Sequence[int],
                               max_tokens: int, max_draft: int = MAX_DRAFT,
                               fallback: Fallback | None = None) -> int:
    """The prediction drafts a greedy (T = 0) engine accepted while emitting ``emitted``
    (stop tokens excluded) with at most ``max_draft`` prediction drafts a step."""
    total, at = 0, 1 if emitted else 0  # the prefill emits the first token
    while at < len(emitted):
        limit = min(max_draft, max_tokens - at - 1)
        drafts = lookup(emitted[:at], prediction, limit)
        run = agreed(drafts, emitted, at)
        if drafts:
            total += run
        elif fallback is not None:
            run = agreed(fallback(at), emitted, at)
        at += run + 1
    return total
