"""Draft-model speculation (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): a smaller causal LM with its own static KV cache proposes K tokens
autoregressively and records their distributions q, so that rejection sampling is lossless.
Optionally it ends a chain early at a draft it is unsure of (``min_confidence``, as transformers'
``assistant_confidence_threshold``), and proposes from a window of its context (``window``):
drafting with a bounded KV is how MagicDec (Chen et al. 2024, "MagicDec: Breaking the
Latency-Throughput Tradeoff for Long Context Generation with Speculative Decoding") and TriForce
(Sun et al. 2024) make speculation pay at long context and large batch, where every draft
forward otherwise reads the whole KV. Any draft distribution is lossless: the target verifies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.runtime.kv_pool import Plane
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Transformer
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers.base import (
    ChainProposal,
    ChainProposer,
    Restored,
    StepOutcome,
    pad_drafts,
    sample_rows,
)
from specserve.runtime.timing import step_clock


class DraftModelProposer(ChainProposer):
    """A draft LM with its own static cache; records q for lossless rejection sampling.

    A proposal first feeds the draft what it has not seen: the pending token, and one more
    after a step that accepted every draft; a row that ran k = 0 steps is a token further
    behind for each (:meth:`backlog`), and a proposal that catches up on that times it apart
    (:attr:`catch_up_s`: a one-off, not a cost of its drafts)."""

    name = "draft"
    # > 0: end a row's chain at a draft whose draft probability is below this (HF's
    # assistant_confidence_threshold); lossless, fewer wasted draft forwards for a large K.
    min_confidence = 0.0
    # > 0: its proposing forwards attend only keys from (shortest row's length - window) on
    # (prefill still attends everything); 0: the whole context
    window = 0

    def __init__(self, model: Transformer, max_draft_len: int = 4) -> None:
        super().__init__(max_draft_len)
        self.model = model.decode_layout()  # it runs one-token forwards: gemv-friendly weights
        self.cache: KVCache | None = None
        self.pool: KVCache  # in-flight batching only (reserve)
        self.seen: list[int] = []  # each row's sequence length at the last update
        self.catch_up_s = 0.0

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        b = len(prompts)
        need = max_len + self.max_draft_len + 2
        if self.cache is None or self.cache.batch != b or self.cache.max_len < need:
            self.cache = self.model.new_cache(b, need)
        self.cache.lengths = [0] * b
        self.seen = [len(p) + 1 for p in prompts]  # its first token: nothing to catch up on
        # The last prompt token is fed by the first propose (with the first generated token).
        self._feed([p[:-1] if len(p) > 1 else [] for p in prompts])

    def reserve(self, capacity: int, max_len: int) -> None:
        """In-flight batching: a draft KV pool of ``capacity`` rows; the active rows are a view
        of its first rows (:meth:`KVCache.view`), moved together with the target's."""
        self.pool = self.model.new_cache(capacity, max_len + self.max_draft_len + 2)
        self.cache = self.pool.view(0, 0)
        self.seen = []

    def admit(self, prompts: list[list[int]], outcome: StepOutcome,
              restored: Sequence[Restored]) -> None:
        """Feed the newcomers' prompts (all but the last token; after the positions restored
        from the prefix cache) into the rows after the active ones, then widen the active
        view over them."""
        assert self.cache is not None
        n, m, lens = self.cache.batch, len(prompts), list(self.cache.lengths)
        self.cache = self.pool.view(n, n + m)
        for i, r in enumerate(restored):
            if r.length:
                self.pool.restore(n + i, r.planes[0])
        self.cache.lengths = [r.length for r in restored]
        self._feed([p[r.length:-1] for p, r in zip(prompts, restored, strict=True)])
        lens += self.cache.lengths
        self.cache = self.pool.view(0, n + m)
        self.cache.lengths = lens
        self.seen += [len(p) + 1 for p in prompts]

    def planes(self) -> tuple[Plane, ...]:
        """The draft model's K/V per position (its own prefix-cache plane)."""
        return (self.pool.plane("draft"),)

    def export(self, row: int, positions: torch.Tensor) -> list[torch.Tensor]:
        return [self.pool.export(row, positions)]

    def evict(self, row: int) -> None:
        assert self.cache is not None
        lens, last = list(self.cache.lengths), self.cache.batch - 1
        if row != last:
            self.pool.move_row(last, row, lens[last])
            lens[row] = lens[last]
            self.seen[row] = self.seen[last]
        self.cache = self.pool.view(0, last)
        self.cache.lengths = lens[:last]
        self.seen.pop()

    def backlog(self) -> int:
        """Tokens the next proposal feeds beyond the usual two a row (k = 0 steps since)."""
        assert self.cache is not None
        return sum(max(s - n - 2, 0) for s, n in zip(self.seen, self.cache.lengths,
                                                       strict=True))

    def _feed(self, rows: list[list[int]], window: int = 0) -> torch.Tensor | None:
        """Feed per-row token lists (attending keys from the shortest row's length -
        ``window`` on, 0: all); last hidden state per row [B, H] (None if all empty)."""
        assert self.cache is not None
        t = max(len(r) for r in rows)
        if t == 0:
            return None
        dev = self.model.device
        tokens = pad_drafts(rows, t, dev)  # [B, T]
        lens = self.cache.lengths
        hidden = self.model.run(tokens, self.cache, window=window).hidden  # [B, T, H]
        self.cache.lengths = [n + len(r) for n, r in zip(lens, rows, strict=True)]
        out: torch.Tensor
        if all(len(r) == t for r in rows):  # every row ends at T-1: a view, no gather
            out = hidden[:, -1]
        else:
            last = torch.tensor([max(len(r) - 1, 0) for r in rows], device=dev)
            out = hidden[torch.arange(len(rows), device=dev), last]
        return out

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        assert self.cache is not None
        k = max(limits)
        sampled = [i for i, p in enumerate(params) if p.temperature > 0 and limits[i] > 0]
        # 1. catch up: feed what the draft has not seen (the pending token, maybe one more)
        clock = step_clock(self.model.device)
        t0, stale = clock(), self.backlog() > 0
        hidden = self._feed([s[n:] for s, n in zip(seqs, self.cache.lengths, strict=True)],
                            self.window)
        self.catch_up_s = clock() - t0 if stale else 0.0
        assert hidden is not None
        tokens, probs, counts = [], [], list(limits)
        for i in range(k):
            logits = self.model.logits(hidden)  # [B, V]
            if self.draft_guide is not None:  # guided rows draft inside their grammar
                logits = self.draft_guide.mask(logits)
            tok = logits.argmax(dim=-1)  # [B]
            if sampled:
                probs.append(sample_rows(logits, tok, sampled, counts, i, params, generators))
            if self.draft_guide is not None:
                self.draft_guide.advance(tok)
            tokens.append(tok)
            if self.min_confidence > 0 and self._stop_unsure(logits, tok, i, counts):
                break
            if i < k - 1:  # 2. feed each draft to get the next one's distribution
                hidden = self._feed_one(tok)
        drafts = torch.stack(tokens, dim=1)  # [B, k']
        q_all = torch.stack(probs, dim=1) if sampled else None  # [B, k', V]
        return ChainProposal(drafts, counts, q_all)

    def _stop_unsure(self, logits: torch.Tensor, tok: torch.Tensor, i: int,
                     counts: list[int]) -> bool:
        """End row b's chain at draft i when the draft gives it probability < min_confidence
        (HF's ``assistant_confidence_threshold``); True when every chain has ended.
        logits [B, V], tok [B]; ``counts`` is updated in place."""
        conf = torch.softmax(logits, dim=-1).gather(1, tok[:, None])[:, 0].tolist()  # [B]
        for b, c in enumerate(conf):
            if i < counts[b] and c < self.min_confidence:
                counts[b] = i + 1
        return all(c <= i + 1 for c in counts)

    def _feed_one(self, tok: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None
        hidden = self.model.run(tok[:, None], self.cache, window=self.window).hidden  # [B, 1, H]
        self.cache.lengths = [n + 1 for n in self.cache.lengths]
        out: torch.Tensor = hidden[:, 0]
        return out

    def rollback(self, seq_lens: list[int]) -> None:
        """Keep only the draft K/V of verified tokens (the pending one is fed next time)."""
        assert self.cache is not None
        self.seen = list(seq_lens)
        self.cache.lengths = [min(n, s - 1) for n, s in
                              zip(self.cache.lengths, seq_lens, strict=True)]
