"""An oracle chain proposer for benchmarks (``benchmarks/runtime.py``): it proposes a known
continuation, so that the speculative machinery of Leviathan et al. 2023 is timed apart from
acceptance (everything is accepted while the sequence follows its reference).
"""

from __future__ import annotations

import torch

from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers.base import (
    ChainProposal,
    ChainProposer,
    SlotProposer,
    pad_drafts,
)


class OracleProposer(ChainProposer):
    """Proposes the next tokens of known reference sequences (prompt + continuation) while the
    sequence still follows its reference; nothing after a divergence."""

    name = "oracle"

    def slots(self) -> SlotProposer | None:
        """None: references are indexed by the row of one generate() call."""
        return None

    def __init__(self, references: list[list[int]], max_draft_len: int = 4,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(max_draft_len)
        self.references, self.device = references, device

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        drafts = []
        for seq, ref, k in zip(seqs, self.references, limits, strict=True):
            n = len(seq)
            drafts.append(ref[n:n + k] if ref[:n] == seq else [])
        return ChainProposal(pad_drafts(drafts, max(limits), self.device),
                             [len(d) for d in drafts], None)
