"""Drafts given from outside, proposed once: TensorRT-LLM's ``draft_input_ids`` (and optional
``draft_logits``) of a draft-target or n-gram loop driven by a client or a BLS model
(Leviathan et al. 2023; Chen et al. 2023). Used with :meth:`SpecDecoder.verify
<specserve.runtime.decoder.SpecDecoder.verify>`, whose first (and only) step verifies the drafts
after each full context.

q: with ``draft_logits`` (the draft model's raw logits of its K tokens, ``[K, V]``) it is
``logits_to_probs(draft_logits, T, top_k, top_p)`` under the row's OWN sampling params, the
distribution the drafts were sampled from when the draft ran with the same params; without them
it is one-hot on the drafts (n-gram, or greedy drafts), which is lossless for any drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.runtime.model import Transformer
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers.base import (
    ChainProposal,
    ChainProposer,
    SlotProposer,
    pad_drafts,
)
from specserve.spec.sampling import logits_to_probs


class ExternalDraftProposer(ChainProposer):
    """``drafts[b]`` (token ids; may be empty) for row b of the coming ``generate``/``verify``
    call, with ``draft_logits[b]`` ``[len(drafts[b]), V]`` or None (one-hot q). Row b gets its
    drafts once, at the step whose pending token is the last token of its prompt (the first step
    of :meth:`~specserve.runtime.decoder.SpecDecoder.verify`); never again, so in a plain
    ``generate`` (where the prefill has sampled a token already) it proposes nothing."""

    def slots(self) -> SlotProposer | None:
        """None: drafts are given per row of one verify() call."""
        return None

    name = "external"

    def __init__(self, drafts: Sequence[Sequence[int]],
                 draft_logits: Sequence[torch.Tensor | None] | None = None,
                 max_draft_len: int | None = None) -> None:
        self.drafts = [[int(t) for t in d] for d in drafts]
        self.draft_logits = list(draft_logits) if draft_logits is not None \
            else [None] * len(self.drafts)
        if len(self.draft_logits) != len(self.drafts):
            raise ValueError(f"{len(self.draft_logits)} draft_logits for {len(self.drafts)} "
                             "draft rows")
        longest = max((len(d) for d in self.drafts), default=0)
        if max_draft_len is not None and longest > max_draft_len:
            raise ValueError(f"{longest} drafts exceed max_draft_len {max_draft_len}")
        super().__init__(max(max_draft_len or longest, 1))
        for b, (d, lg) in enumerate(zip(self.drafts, self.draft_logits, strict=True)):
            if lg is not None and (lg.dim() != 2 or lg.shape[0] != len(d)):
                raise ValueError(f"row {b}: draft_logits {tuple(lg.shape)} must be "
                                 f"[{len(d)}, V]")
        self.vocab: int | None = None
        self.device: torch.device | str = "cpu"
        self._prompt_lens: list[int] = []
        self._done: list[bool] = []

    def bind(self, target: Transformer) -> None:
        """The target's vocabulary (checked against drafts and logits) and device (of q)."""
        v = target.cfg.vocab_size
        for b, (d, lg) in enumerate(zip(self.drafts, self.draft_logits, strict=True)):
            bad = next((t for t in d if not 0 <= t < v), None)
            if bad is not None:
                raise ValueError(f"row {b}: draft token id {bad} outside the vocab ({v})")
            if lg is not None and lg.shape[1] != v:
                raise ValueError(f"row {b}: draft_logits {tuple(lg.shape)} must be "
                                 f"[{len(d)}, {v}] (the target's vocab)")
        self.vocab, self.device = v, target.device

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        if len(prompts) != len(self.drafts):
            raise ValueError(f"{len(prompts)} prompts for {len(self.drafts)} draft rows")
        self._prompt_lens = [len(p) for p in prompts]
        self._done = [False] * len(prompts)

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        rows: list[list[int]] = []
        for b, (seq, lim) in enumerate(zip(seqs, limits, strict=True)):
            fresh = not self._done[b] and len(seq) == self._prompt_lens[b]
            rows.append(self.drafts[b][:lim] if fresh and lim > 0 else [])
            self._done[b] = True  # once: the first step after the prompt, or never
        k = max(limits)
        tokens = pad_drafts(rows, k, self.device)  # [B, k]
        counts = [len(r) for r in rows]
        sampled = [b for b, p in enumerate(params) if p.temperature > 0 and counts[b]]
        if not any(self.draft_logits[b] is not None for b in sampled):
            return ChainProposal(tokens, counts, None)  # one-hot q for every row
        assert self.vocab is not None, "bind() comes first"
        q = torch.zeros(len(seqs), k, self.vocab, device=self.device)  # [B, k, V]
        for b in sampled:
            c, lg, p = counts[b], self.draft_logits[b], params[b]
            if lg is None:  # this row: one-hot q on its drafts
                q[b, torch.arange(c, device=self.device), tokens[b, :c]] = 1.0
            else:
                q[b, :c] = logits_to_probs(lg[:c].to(self.device), p.temperature, p.top_k,
                                           p.top_p)
        return ChainProposal(tokens, counts, q)
