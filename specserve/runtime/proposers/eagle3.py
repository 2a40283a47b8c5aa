"""EAGLE-3 chain proposals (Li et al. 2025, "EAGLE-3"; the head: :mod:`specserve.runtime.eagle3`).

The head reads the target's residual stream at a few layers from the verify forward the
decoder runs anyway (``Transformer.capture``; :class:`StepOutcome` ``aux``). Each proposal
first catches up: the kept positions' fused target states paired with their next tokens go
through the head in one forward (its KV cache holds one entry per target position); the
output at the last position gives draft 1, and each further draft feeds the head its own
output with the previous draft's embedding, as vLLM's EAGLE proposer does. Drafts are argmax
at T = 0 and sampled from q (the head's distribution mapped to the target vocabulary, zero
outside the draft vocabulary) otherwise, so rejection sampling stays lossless.
"""

from __future__ import annotations

import torch

from specserve.runtime.eagle3 import Eagle3Head
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Transformer
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers.base import (
    ChainProposal,
    ChainProposer,
    StepOutcome,
    pad_drafts,
    sample_rows,
)


class Eagle3Proposer(ChainProposer):
    """An EAGLE-3 head over the target's captured layers; records q for rejection sampling."""

    name = "eagle3"

    def __init__(self, head: Eagle3Head, max_draft_len: int = 4) -> None:
        super().__init__(max_draft_len)
        self.head = head
        self.cache: KVCache | None = None
        self.pool: KVCache  # in-flight batching only (reserve)
        # per row: fused target features [n, H] of positions cache.lengths[b].. not fed yet
        self.feats: list[torch.Tensor | None] = []

    def bind(self, target: Transformer) -> None:
        """Capture the head's layers in every target forward; share the target's embedding."""
        self.head.to(device=target.device, dtype=target.dtype).decode_layout()
        self.head.bind(target.embed.weight)
        target.capture = self.head.cfg.aux_layer_ids

    def _need(self, max_len: int) -> int:
        return max_len + self.max_draft_len + 2

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        b = len(prompts)
        if self.cache is None or self.cache.batch != b or self.cache.max_len < self._need(max_len):
            self.cache = self.head.new_cache(b, self._need(max_len))
        self.cache.lengths = [0] * b
        self.feats = [None] * b

    def reserve(self, capacity: int, max_len: int) -> None:
        self.pool = self.head.new_cache(capacity, self._need(max_len))
        self.cache = self.pool.view(0, 0)
        self.feats = []

    def admit(self, prompts: list[list[int]], outcome: StepOutcome) -> None:
        """Newcomers as the last rows; ``outcome.aux`` covers their prompts from position 0."""
        assert self.cache is not None and outcome.aux is not None
        n, m, lens = self.cache.batch, len(prompts), list(self.cache.lengths)
        self.cache = self.pool.view(0, n + m)
        self.cache.lengths = lens + [0] * m
        self.feats += [self.head.fuse(outcome.aux[i, :len(p)]) for i, p in enumerate(prompts)]

    def evict(self, row: int) -> None:
        assert self.cache is not None
        lens, last = list(self.cache.lengths), self.cache.batch - 1
        if row != last:
            self.pool.move_row(last, row, lens[last])
            lens[row], self.feats[row] = lens[last], self.feats[last]
        self.feats.pop()
        self.cache = self.pool.view(0, last)
        self.cache.lengths = lens[:last]

    def update(self, outcome: StepOutcome) -> None:
        """Keep the fused target states of the positions the head has not seen (the kept
        tokens of this forward: index i along T is position ``len(seq) - 2 - last + i``)."""
        assert self.cache is not None and outcome.aux is not None
        for b, seq in enumerate(outcome.seqs):
            buf = self.feats[b]
            have = self.cache.lengths[b] + (0 if buf is None else buf.shape[0])
            first = len(seq) - 2 - outcome.last[b]  # position of index 0
            lo = have - first
            if lo < 0:
                raise RuntimeError(f"eagle3: row {b} lacks target states for positions "
                                   f"{have}..{first - 1}")
            new = self.head.fuse(outcome.aux[b, lo:outcome.last[b] + 1])  # [n, H]
            self.feats[b] = new if buf is None else torch.cat([buf, new])

    def _catch_up(self, seqs: list[list[int]]) -> torch.Tensor:
        """Feed every row's pending (feature, next token) pairs; the head's output at each
        row's last position [B, H]."""
        assert self.cache is not None
        dev, h = self.head.device, self.head.cfg.hidden_size
        lens = list(self.cache.lengths)
        counts = [0 if f is None else f.shape[0] for f in self.feats]
        t = max(max(counts), 1)
        feats = torch.zeros(len(seqs), t, h, dtype=self.head.dtype, device=dev)
        rows = []
        for b, (seq, f, n) in enumerate(zip(seqs, self.feats, counts, strict=True)):
            if f is not None and n:
                feats[b, :n] = f
            rows.append(seq[lens[b] + 1:lens[b] + 1 + n])
        out = self.head(pad_drafts(rows, t, dev), feats, self.cache)  # [B, T, H]
        self.cache.lengths = [x + n for x, n in zip(lens, counts, strict=True)]
        self.feats = [None] * len(seqs)
        last = torch.tensor([max(n - 1, 0) for n in counts], device=dev)
        picked: torch.Tensor = out[torch.arange(len(seqs), device=dev), last]  # [B, H]
        return picked

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        assert self.cache is not None
        k = max(limits)
        sampled = [i for i, p in enumerate(params) if p.temperature > 0 and limits[i] > 0]
        feat = self._catch_up(seqs)  # [B, H]
        base = list(self.cache.lengths)
        ids = self.head.target_ids()  # [Vd]
        tokens, probs = [], []
        for i in range(k):
            draft = self.head.draft_logits(feat)  # [B, Vd]
            tok = ids[draft.argmax(dim=-1)]  # [B] target ids (argmax: greedy rows)
            if sampled:  # q over the target vocabulary: 0 outside the draft vocabulary
                probs.append(sample_rows(self.head.to_target(draft), tok, sampled, limits, i,
                                         params, generators))
            tokens.append(tok)
            if i < k - 1:  # the head's own output and this draft give the next one
                out = self.head(tok[:, None], feat[:, None], self.cache)  # [B, 1, H]
                self.cache.lengths = [x + 1 for x in self.cache.lengths]
                feat = out[:, 0]
        self.cache.lengths = base  # draft entries are overwritten by the next catch-up
        drafts = torch.stack(tokens, dim=1)  # [B, k]
        q_all = torch.stack(probs, dim=1) if sampled else None  # [B, k, V]
        return ChainProposal(drafts, list(limits), q_all)

    def rollback(self, seq_lens: list[int]) -> None:
        """Unused: :meth:`update` keeps the head's state (its cache holds verified positions
        only)."""
