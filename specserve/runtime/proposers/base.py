"""The proposer interface: what :class:`~specserve.runtime.decoder.SpecDecoder` asks of any
drafting method, in the spirit of transformers' ``CandidateGenerator`` (``get_candidates`` /
``update_candidate_strategy``).

Speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023) splits one step into *propose* (cheap guesses of the next tokens)
and *verify* (one target forward over them). The verification is chosen by the proposal's kind,
never by the proposer's class:

- :class:`ChainProposal` (draft model, n-gram, Medusa top-1 at T>0, ...): greedy verification at
  temperature 0, lossless rejection sampling otherwise (q from ``probs``, one-hot when None), or
  the LOSSY typical acceptance of Medusa when ``acceptance == "typical"``;
- :class:`TreeProposal` (Medusa, Cai et al. 2024; EAGLE trees): one tree-attention forward and
  greedy verification of the longest accepted root-to-leaf path.

Per ``generate`` the decoder calls ``bind`` (once, at construction), ``start``, then after every
target forward (the prefill included) ``update`` with a :class:`StepOutcome`, and before every
verify step ``get_proposal``. A proposer keeps its own state (a draft KV cache, the target's last
hidden states) and rolls it back in ``update``; the decoder holds no proposer-specific code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from specserve.runtime.grammar import DraftGuide
from specserve.runtime.kv_pool import Plane
from specserve.runtime.model import Transformer
from specserve.runtime.params import SamplingParams
from specserve.spec.sampling import logits_to_probs, sample
from specserve.spec.tree import TreeBuffers

__all__ = ["ChainProposal", "ChainProposer", "Proposal", "ProposalRequest", "Proposer",
           "Restored", "SlotProposer", "StepOutcome", "TreeProposal", "pad_drafts", "sample_rows"]


@dataclass(frozen=True)
class ChainProposal:
    """Drafts for one step: ``tokens [B, K]`` int64 (anything after ``counts[b]``), the number of
    real drafts per row, and ``probs [B, K, V]`` (q of sampled drafts) or None for one-hot q.
    ``acceptance`` "typical" asks for Medusa's LOSSY typical acceptance of sampled rows."""

    tokens: torch.Tensor
    counts: list[int]
    probs: torch.Tensor | None
    acceptance: Literal["exact", "typical"] = "exact"


@dataclass(frozen=True)
class TreeProposal:
    """A candidate tree for every row: ``tokens [B, N+1]`` (node 0 is the pending token, the
    root) and the tree-attention buffers shared by the batch (``position_ids`` = node depths)."""

    tokens: torch.Tensor
    buffers: TreeBuffers


Proposal = ChainProposal | TreeProposal


@dataclass(frozen=True)
class ProposalRequest:
    """What the decoder knows before a verify step. ``seqs[b]`` is prompt + generated (its last
    token, the pending one, is not in the target cache yet); ``limits[b]`` the most chain drafts
    row b can use (0: finished, or one token left). Row b's randomness comes only from
    ``generators[b]``."""

    seqs: list[list[int]]
    limits: list[int]
    params: list[SamplingParams]
    generators: list[torch.Generator]
    tree_budget: int | None = None   # a load-aware schedule's tree nodes (None: the whole tree)
    # a row's num_draft_tokens is below max_draft_len: a tree proposer returns its chain, whose
    # per-row ``limits`` are the caps (a tree is one shape for the whole batch)
    chain_only: bool = False
    # structured output: forks of the guided rows' grammar matchers for a proposer that masks
    # its own drafting logits (DraftModelProposer); None: no guided row
    guide: DraftGuide | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What one target forward (the prefill, or a verify step) produced and kept.

    ``hidden [B, T, H]``: the target's final hidden states (after the final norm) of the T tokens
    just fed; ``last[b]``: the index along T of row b's last kept token, whose hidden state
    predicted the pending token (0 for finished rows); ``accepted[b]``: drafts accepted this step
    (0 after the prefill); ``seqs``: the sequences now; ``paths[b]`` (tree steps only): the kept
    node indices, root first (a chain keeps positions ``0..last[b]``); ``aux [B, T, n*H]``: the
    target's residual stream at the layers ``Proposer.aux_layers`` names (EAGLE-3), else None."""

    hidden: torch.Tensor
    last: list[int]
    accepted: list[int]
    seqs: list[list[int]]
    paths: list[list[int]] | None = None
    aux: torch.Tensor | None = None


@dataclass(frozen=True)
class Restored:
    """A newcomer's first ``length`` positions restored from the prefix cache
    (:mod:`specserve.runtime.kv_pool`): per plane of :meth:`SlotProposer.planes`, its state
    there, [length, *shape] (none when ``length`` is 0)."""

    length: int = 0
    planes: tuple[torch.Tensor, ...] = ()


NOTHING_RESTORED = Restored()


class Proposer(Protocol):
    """Every proposer: draft model, n-gram, oracle, Medusa, and whatever comes next (EAGLE-3)."""

    @property
    def name(self) -> str:
        """The spec mode: "draft", "ngram", "medusa", "oracle", ..."""

    @property
    def max_draft_len(self) -> int:
        """The longest chain it proposes (the ceiling of ``ProposalRequest.limits``)."""

    @property
    def lookahead(self) -> int:
        """The most tokens one proposal adds to a verify forward (chain K, tree N nodes)."""

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """Target layers whose input residual stream it reads (EAGLE-3; ``StepOutcome.aux``
        from ``Transformer.run(capture=...)``); () for none."""

    @property
    def catch_up_s(self) -> float:
        """Seconds its last proposal spent catching up on positions seen while not drafting
        (a run of k = 0 steps, a newcomer's prompt): a one-off, not a cost of its drafts."""

    def backlog(self) -> int:
        """Positions its next proposal must catch up on before drafting (0: none kept)."""

    def slots(self) -> SlotProposer | None:
        """Its in-flight interface (rows that join and leave a running batch), or None when
        it keeps per-call state and cannot serve in flight (oracle, external drafts)."""

    def bind(self, target: Transformer) -> None:
        """Called once by the decoder: move weights to the target's device and dtype, share its
        embedding, ..."""

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        """A new ``generate`` call: the prompts and the longest any sequence can grow."""

    def get_proposal(self, request: ProposalRequest) -> Proposal | None:
        """This step's proposal, or None for a plain decoding step."""

    def update(self, outcome: StepOutcome) -> None:
        """After every target forward: roll back to the kept tokens, keep hidden states, adapt."""


class SlotProposer(Protocol):
    """A proposer's per-sequence state that can join and leave a running batch (in-flight
    batching: :mod:`specserve.runtime.runner` calls it, :meth:`Proposer.slots` gives it): its
    rows are the runner's KV pool rows, in order."""

    def reserve(self, capacity: int, max_len: int) -> None:
        """A pool for ``capacity`` sequences of up to ``max_len`` tokens; no sequence yet."""

    def admit(self, prompts: list[list[int]], outcome: StepOutcome,
              restored: Sequence[Restored]) -> None:
        """Sequences join as the last rows; ``outcome`` is the target prefill of just them,
        which covered newcomer i's prompt after its ``restored[i].length`` first positions
        (those came from the prefix cache, with this proposer's state there)."""

    def evict(self, row: int) -> None:
        """The sequence at ``row`` leaves; the last row moves into its place."""

    def planes(self) -> tuple[Plane, ...]:
        """The per-position state it keeps per row that a prefix cache stores and restores
        with the target's K/V (the draft model's K/V, EAGLE-3's fused features); ()."""

    def export(self, row: int, positions: torch.Tensor) -> list[torch.Tensor]:
        """Row ``row``'s state at ``positions`` [N], per plane [N, *shape] (a copy; only
        positions before the row's last two tokens are asked for)."""


def sample_rows(logits: torch.Tensor, tok: torch.Tensor, rows: list[int], limits: list[int],
                step: int, params: list[SamplingParams],
                generators: list[torch.Generator]) -> torch.Tensor:
    """Draft ``step`` of the sampled ``rows``: q [B, V] from each row's params (zero for the
    other rows and for rows past their limit), and ``tok`` [B] overwritten in place by a draw
    from q with the row's own generator (randomness of row b depends only on row b)."""
    q = torch.zeros_like(logits)
    for b in rows:
        if step >= limits[b]:  # beyond this row's limit or stop: no randomness
            continue
        p = params[b]
        q[b] = logits_to_probs(logits[b], p.temperature, p.top_k, p.top_p)
        tok[b] = sample(q[b:b + 1], generators[b])[0]
    return q


def pad_drafts(rows: list[list[int]], k: int, device: torch.device | str) -> torch.Tensor:
    """Token lists -> ``[B, k]`` int64, zero-padded."""
    return torch.tensor([r + [0] * (k - len(r)) for r in rows], dtype=torch.long,
                        device=device).view(len(rows), k)


class ChainProposer:
    """Base of chain proposers: implements :class:`Proposer` over the simpler :meth:`propose`
    (called only when some row may draft) and :meth:`rollback` (new sequence lengths)."""

    name = "chain"

    def __init__(self, max_draft_len: int) -> None:
        if max_draft_len < 1:
            raise ValueError(f"max_draft_len must be >= 1, got {max_draft_len}")
        self.max_draft_len = max_draft_len

    @property
    def lookahead(self) -> int:
        return self.max_draft_len

    aux_layers: tuple[int, ...] = ()
    draft_guide: DraftGuide | None = None  # this step's (ProposalRequest.guide)
    catch_up_s: float = 0.0  # none kept: nothing to catch up on

    def backlog(self) -> int:
        return 0

    def slots(self) -> SlotProposer | None:
        """Itself: a chain proposer is stateless per row unless it says otherwise (a subclass
        with per-call state returns None)."""
        return self

    def bind(self, target: Transformer) -> None:
        """Chain proposers keep their own device and dtype."""

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        """Called once per ``generate`` with the prompts and the longest sequence possible."""

    def reserve(self, capacity: int, max_len: int) -> None:
        """In-flight batching: nothing per row to keep (see :class:`SlotProposer`)."""

    def admit(self, prompts: list[list[int]], outcome: StepOutcome,
              restored: Sequence[Restored]) -> None:
        """In-flight batching: nothing per row to keep."""

    def evict(self, row: int) -> None:
        """In-flight batching: nothing per row to keep."""

    def planes(self) -> tuple[Plane, ...]:
        """Nothing per position to keep."""
        return ()

    def export(self, row: int, positions: torch.Tensor) -> list[torch.Tensor]:
        return []

    def get_proposal(self, request: ProposalRequest) -> Proposal | None:
        """The chain of :meth:`propose` (a subclass may return a tree, as EAGLE-3 does)."""
        if max(request.limits) == 0:
            return None
        self.draft_guide = request.guide
        return self.propose(request.seqs, request.limits, request.params, request.generators)

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        """Up to ``limits[b]`` drafts for sequence b (0: none needed; it may be finished).
        Randomness for row b comes only from ``generators[b]`` and depends only on that row."""
        raise NotImplementedError

    def update(self, outcome: StepOutcome) -> None:
        self.rollback([len(s) for s in outcome.seqs])

    def rollback(self, seq_lens: list[int]) -> None:
        """The sequences are now ``seq_lens`` long (last token still unverified)."""
