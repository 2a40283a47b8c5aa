"""Proposers behind one :class:`~specserve.runtime.proposers.base.Proposer` protocol (in the
spirit of transformers' ``CandidateGenerator``), one module each:

- :mod:`.base`: the protocol, :class:`ChainProposal` / :class:`TreeProposal` (the proposal kind
  picks the verification), :class:`ProposalRequest`, :class:`StepOutcome`, and
  :class:`ChainProposer` (base of chain proposers: ``propose`` + ``rollback``);
- :mod:`.draft`: :class:`DraftModelProposer` (Leviathan et al. 2023; Chen et al. 2023);
- :mod:`.ngram`: :class:`NgramProposer`, prompt lookup decoding (Saxena 2023);
- :mod:`.medusa`: :class:`MedusaProposer` (Cai et al. 2024): tree at T=0, top-1 chain at T>0;
- :mod:`.oracle`: :class:`OracleProposer`, a known continuation (benchmarks);
- :mod:`.external`: :class:`ExternalDraftProposer`, drafts given from outside, proposed once
  (TensorRT-LLM's ``draft_input_ids``/``draft_logits``; with ``SpecDecoder.verify``).

A new proposer (EAGLE-3, ...) is one more module implementing the protocol; the decoder loop
does not change.
"""

from specserve.runtime.proposers.base import (
    ChainProposal,
    ChainProposer,
    Proposal,
    ProposalRequest,
    Proposer,
    Restored,
    SlotProposer,
    StepOutcome,
    TreeProposal,
    pad_drafts,
)
from specserve.runtime.proposers.draft import DraftModelProposer
from specserve.runtime.proposers.external import ExternalDraftProposer
from specserve.runtime.proposers.medusa import MedusaProposer
from specserve.runtime.proposers.ngram import NgramProposer, ngram_lookup
from specserve.runtime.proposers.oracle import OracleProposer

__all__ = ["ChainProposal", "ChainProposer", "DraftModelProposer", "ExternalDraftProposer",
           "MedusaProposer", "NgramProposer", "OracleProposer", "Proposal", "ProposalRequest",
           "Proposer", "Restored", "SlotProposer", "StepOutcome", "TreeProposal", "ngram_lookup",
           "pad_drafts"]
