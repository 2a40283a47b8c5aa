"""Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; the n-gram proposer of vLLM and
transformers' ``prompt_lookup_num_tokens``): find a recent earlier occurrence of the last n tokens
(n = 3..1) and propose what followed it. No model; q is one-hot.
"""

from __future__ import annotations

import torch

from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers.base import ChainProposal, ChainProposer, pad_drafts


def ngram_lookup(seq: list[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed an earlier match of the last n tokens (longest n first).

    Among matches of one n, the most recent one that is followed by ``k`` tokens wins (a match
    right before the end, as in a run of one repeated token, is followed by fewer); failing that,
    the one followed by the most tokens.
    """
    size = len(seq)
    for n in range(max_n, min_n - 1, -1):
        if size <= n:
            continue
        suffix = seq[-n:]
        last = suffix[-1]
        best: list[int] = []
        for i in range(size - 2, n - 2, -1):  # i = end index of a candidate match
            if seq[i] == last and seq[i - n + 1:i + 1] == suffix:
                cont = seq[i + 1:i + 1 + k]
                if len(cont) == k:
                    return cont
                if len(cont) > len(best):
                    best = cont
        if best:
            return best
    return []


class NgramProposer(ChainProposer):
    """Prompt lookup: no model, one-hot q."""

    name = "ngram"

    def __init__(self, max_draft_len: int = 4, max_n: int = 3, min_n: int = 1,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(max_draft_len)
        self.max_n, self.min_n, self.device = max_n, min_n, device

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        drafts = [ngram_lookup(s, n, self.max_n, self.min_n) if n > 0 else []
                  for s, n in zip(seqs, limits, strict=True)]
        return ChainProposal(pad_drafts(drafts, max(limits), self.device),
                             [len(d) for d in drafts], None)
