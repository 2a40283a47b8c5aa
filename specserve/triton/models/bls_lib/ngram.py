"""Prompt-lookup (n-gram) draft proposals for the BLS loop (Saxena 2023, "Prompt Lookup Decoding";
the same idea as vLLM's n-gram proposer and transformers' ``prompt_lookup_num_tokens``).

Self-contained (standard library only): copied into a repository as
``tensorrt_llm_bls/1/lib/ngram.py``.

Rule: for n = ``max_ngram`` down to ``min_ngram``, look for an earlier occurrence of the last n
tokens of the context; the first n that has one decides. Among that n's occurrences the most
recent one followed by ``k`` tokens wins; when none is (a match close to the end, as in a run of
one repeated token), the one followed by the most tokens (the earliest) wins. The proposal is
what followed it, at most ``k`` tokens; ``[]`` when no suffix of any size occurred before. This
is the rule of specserve's reference n-gram proposer, so the BLS path and the engine's own
n-gram speculation propose the same drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_MAX_NGRAM = 3


def propose(context: Sequence[int], k: int, max_ngram: int = DEFAULT_MAX_NGRAM,
            min_ngram: int = 1) -> list[int]:
    """Up to ``k`` draft tokens for ``context`` (prompt + generated so far)."""
    if k <= 0 or max_ngram < 1:
        return []
    ctx = list(context)
    size = len(ctx)
    for n in range(min(max_ngram, size - 1), max(min_ngram, 1) - 1, -1):
        suffix = ctx[size - n:]
        # start positions of earlier occurrences, most recent first (the suffix itself excluded)
        starts = [s for s in range(size - n - 1, -1, -1) if ctx[s:s + n] == suffix]
        if not starts:
            continue
        for s in starts:
            follow = ctx[s + n:s + n + k]
            if len(follow) == k:
                return follow
        return ctx[starts[-1] + n:starts[-1] + n + k]  # the earliest: the most followers
    return []
