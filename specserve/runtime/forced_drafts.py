"""Grammar-forced drafts: under structured output, the tokens the grammar dictates (JSON keys,
punctuation, fixed strings) are proposed as drafts, merged with the engine proposer's chain.

SGLang's jump-forward decoding (Zheng et al. 2024, "SGLang: Efficient Execution of Structured
Language Model Programs", the compressed finite-state machine) appends the string a grammar
forces without running the model on each of its tokens. Here those tokens are drafts instead and
are verified like any other (Leviathan et al. 2023, Chen et al. 2023), so the output is exactly
the constrained distribution and the forced string's tokenization need not be guessed right.
Per guided row, a fork of its matcher walks the merged chain position by position:

- exactly one token allowed: that token (*forced*, q one-hot). The constrained target at that
  position is one-hot on the same token, so verification always accepts it. A proposer draft
  that differs ends the proposer's chain (its later drafts follow a token never emitted);
- several allowed while the proposer's chain goes on: its draft when the grammar allows it (its
  own q, which the step masks and renormalizes as for any guided draft); one the grammar cuts
  ends the proposer's chain there;
- after the proposer's chain (or without a proposer): the grammar's jump-forward string
  (xgrammar's ``find_jump_forward_string``), as its longest allowed vocabulary piece
  (*jump*, q one-hot: a deterministic guess of the target's tokenization, verified, not sure
  to be accepted); no forced string: the chain ends. A stop token ends it too.

Lossless at any temperature: given the draft side's history (the proposer's draws, hence which
rule applied), each draft is distributed as the q it is verified with (a proposer's draft that
the grammar kept: its q renormalized over the allowed set; a grammar draft: one-hot), and that
is what Leviathan's argument needs per position; which rule applied depends on draft-side
randomness only. Greedy verification needs nothing of q. The decoder's cache lookahead
covers :data:`MAX_FORCED_DRAFT` (= Predicted Outputs' :data:`MAX_PREDICTION_DRAFT`) drafts per
step. Like Predicted Outputs' overlay, the merge keeps no state and the proposer's stays
consistent through its ``update`` (EAGLE-3 keeps the verify forward's captured states of the
kept tokens; the draft model's KV holds verified tokens only, and it drafts through
:class:`~specserve.runtime.grammar.DraftGuide`, so its drafts at forced positions are the forced
tokens; a row whose chain is shorter than the batch's longest has draft K/V of the draft's
own tokens past it, which may differ from accepted jump tokens: slower drafting there, never
another output). Rows with a prediction keep its drafts; tree proposals are left as they are.

A row whose grammar chain alone (forced and jump tokens) already fills the draft length k the
step gives it (:meth:`ForcedDrafts.cover`, before proposing) is not asked for drafts (its limit
is 0, the draft-length policy's k = 0 path: EAGLE-3 catches up on it at its next proposal, a
draft model feeds what it has not seen); the proposer is not run at all where every row is so
covered. Its drafts would have gone only to positions the grammar fills: at a forced position
the forced token wins; at a jump position its draft could replace the jump token, but both are
drafts of the same forced string. Lossless either way: the rule is picked from the grammar
state, before any draft-side draw, and verification is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specserve.runtime.batch import Batch
from specserve.runtime.grammar import GuideMatcher
from specserve.runtime.proposers.base import ChainProposal
from specserve.runtime.proposers.prediction import MAX_PREDICTION_DRAFT

MAX_FORCED_DRAFT = MAX_PREDICTION_DRAFT  # most drafts per step and row with forced tokens
OWN, FORCED, JUMP = 0, 1, 2  # where a merged draft came from


@dataclass
class RowChain:
    """One row's merged drafts and where each came from (:data:`OWN`, :data:`FORCED`,
    :data:`JUMP`)."""

    tokens: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)

    def add(self, token: int, kind: int) -> None:
        self.tokens.append(token)
        self.kinds.append(kind)

    @property
    def grammar_positions(self) -> list[int]:
        """Indices of the drafts the grammar proposed (forced or jump)."""
        return [j for j, k in enumerate(self.kinds) if k != OWN]


def jump_token(m: GuideMatcher, allowed: torch.Tensor) -> int | None:
    """The longest vocabulary piece allowed now (``allowed [V]`` bool) that the grammar's
    forced string starts with; None when nothing is forced."""
    forced, pieces = m.jump_forward(), m.guide.pieces
    for n in range(len(forced), 0, -1):
        for t in pieces.get(forced[:n], ()):
            if bool(allowed[t]):
                return t
    return None


def merge_row(m: GuideMatcher, own: list[int], limit: int, jump: bool = True) -> RowChain:
    """Walk ``m`` (a fork; it is advanced) over the merged chain: the proposer's drafts
    ``own`` with the grammar's forced tokens (module docstring), at most ``limit``.
    ``jump``: propose jump-forward tokens (else only tokens the grammar allows alone)."""
    out, alive = RowChain(), bool(own)
    while len(out.tokens) < limit and not m.terminated:
        j, allowed = len(out.tokens), m.allowed()  # [V]
        mine = own[j] if alive and j < len(own) else None
        if int(allowed.sum()) == 1:
            tok, kind = int(allowed.nonzero()[0, 0]), FORCED
            alive = alive and mine == tok
        elif mine is not None and bool(allowed[mine]):
            tok, kind = mine, OWN
        else:
            alive = False
            found = jump_token(m, allowed) if jump else None
            if found is None:
                break
            tok, kind = found, JUMP
        out.add(tok, kind)
        m.accept(tok)
        alive = alive and j + 1 < len(own)
    return out


@dataclass(frozen=True)
class ForcedDrafts:
    """The decoder's option: merge grammar-forced drafts into each guided row's chain.
    ``jump``: also jump-forward tokens (else only tokens that are the grammar's only choice);
    ``max_len``: the most drafts per row and step (within the decoder's cache lookahead)."""

    jump: bool = True
    max_len: int = MAX_FORCED_DRAFT
    skip_covered: bool = True  # no proposer drafts for rows the grammar's chain covers (cover)

    def row_limit(self, st: Batch, b: int) -> int:
        """Row b's most merged drafts this step (its cap, its tokens left)."""
        p = st.params[b]
        return min(p.draft_cap(self.max_len), p.max_tokens - len(st.out[b]) - 1)

    def cover(self, st: Batch, limits: list[int]) -> tuple[list[int], dict[int, RowChain]]:
        """Before proposing: ``limits`` with 0 for each guided row (no prediction) whose
        grammar chain alone is at least its limit long, and those chains (for :meth:`merge`)."""
        ready: dict[int, RowChain] = {}
        if not self.skip_covered:
            return limits, ready
        for b in st.active():
            m = st.guides[b]
            if m is None or m.terminated or st.params[b].prediction or limits[b] <= 0:
                continue
            chain = merge_row(m.fork(), [], self.row_limit(st, b), self.jump)
            if len(chain.tokens) >= limits[b]:
                ready[b] = chain
        return [0 if b in ready else lim for b, lim in enumerate(limits)], ready

    def merge(self, st: Batch, prop: ChainProposal | None, limits: list[int],
              device: torch.device | str,
              ready: dict[int, RowChain] | None = None) -> tuple[ChainProposal | None, list[int]]:
        """The step's proposal and per-row draft limits with the guided rows' chains merged
        (rows with a prediction, unguided and finished rows as they were; ``ready``: rows
        :meth:`cover` took, their chains); records the grammar drafts' indices in
        ``st.forced_at``."""
        st.forced_at = {}
        rows: dict[int, RowChain] = {}
        for b in st.active():
            m = st.guides[b]
            if m is None or b in st.predicted or m.terminated:
                continue
            if ready and b in ready:
                rows[b] = ready[b]
            else:
                n = 0 if prop is None else min(prop.counts[b], limits[b])
                own = [] if prop is None else prop.tokens[b, :n].tolist()
                rows[b] = merge_row(m.fork(), own, max(self.row_limit(st, b), len(own)),
                                    self.jump)
            st.forced_at[b] = rows[b].grammar_positions
        if not any(c.kinds for c in rows.values()):
            return prop, limits
        new = [len(rows[b].tokens) if b in rows else lim for b, lim in enumerate(limits)]
        return merged(prop, rows, limits, device), new


def merged(base: ChainProposal | None, rows: dict[int, RowChain], limits: list[int],
           device: torch.device | str) -> ChainProposal:
    """``base`` (None: no proposer) with row b's drafts replaced by ``rows[b]``: the
    proposer's q where the draft is its own, one-hot q where the grammar proposed it."""
    batch = len(limits)
    k_base = 0 if base is None else min(max(limits), base.tokens.shape[1])
    k = max([k_base, *(len(c.tokens) for c in rows.values())])
    tokens = torch.zeros(batch, k, dtype=torch.long, device=device)  # [B, k]
    counts = [0] * batch
    probs: torch.Tensor | None = None
    if base is not None:
        tokens[:, :k_base] = base.tokens[:, :k_base].to(device)
        counts = [min(c, lim, k_base) for c, lim in zip(base.counts, limits, strict=True)]
        if base.probs is not None:
            q = base.probs[:, :k_base]  # [B, k_base, V]
            probs = torch.zeros(batch, k, q.shape[-1], dtype=q.dtype, device=q.device)
            probs[:, :k_base] = q
    for b, chain in rows.items():
        n = len(chain.tokens)
        tokens[b] = 0
        tokens[b, :n] = torch.tensor(chain.tokens, dtype=torch.long, device=device)
        counts[b] = n
        if probs is not None:
            _one_hot_grammar_q(probs[b], chain)
    acceptance = base.acceptance if base is not None else "exact"
    return ChainProposal(tokens, counts, probs, acceptance)


def _one_hot_grammar_q(q: torch.Tensor, chain: RowChain) -> None:
    """q [k, V] of one row (the proposer's, in place): one-hot at the grammar's drafts, zero
    past the chain."""
    q[len(chain.tokens):] = 0
    for j in chain.grammar_positions:
        q[j] = 0
        q[j, chain.tokens[j]] = 1.0
