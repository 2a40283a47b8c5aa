"""Medusa proposals (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads", arXiv 2401.10774): the heads of :mod:`specserve.runtime.medusa` read the
target's last hidden state and their top-k tokens fill a candidate tree, verified in one
tree-attention forward (greedy, T=0). At T>0 the heads' top-1 chain is verified with lossless
one-hot rejection sampling, or, opt-in and LOSSY, with Medusa's typical acceptance (§2.3.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from specserve.runtime.kv_pool import Plane
from specserve.runtime.medusa import MedusaHeads
from specserve.runtime.model import Transformer
from specserve.runtime.proposers.base import (
    ChainProposal,
    ProposalRequest,
    Restored,
    SlotProposer,
    StepOutcome,
    TreeProposal,
)
from specserve.spec.tree import MedusaTree, TreeBuffers, build_tree_buffers, build_tree_tokens


class MedusaProposer:
    """Medusa heads plus a candidate tree. ``acceptance`` is "greedy" (tree verify at T=0; the
    heads' top-1 chain with lossless one-hot rejection sampling at T>0) or the LOSSY "typical"
    (Medusa's typical acceptance on the top-1 chain at T>0; never the default)."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, tree: MedusaTree, acceptance: str = "greedy") -> None:
        if acceptance not in ("greedy", "typical"):
            raise ValueError(f"acceptance must be 'greedy' or 'typical', got {acceptance!r}")
        self.heads, self.acceptance = heads, acceptance
        self.tree = MedusaTree.from_choices(tree.choices, heads.num_heads)
        self.buffers = build_tree_buffers(self.tree)
        self.topk = self.tree.max_topk()
        self.max_draft_len = self.tree.depth  # chain length at T>0
        self._chain_acceptance: Literal["exact", "typical"] = \
            "typical" if acceptance == "typical" else "exact"
        self._hidden: torch.Tensor | None = None  # [B, H] at each row's last kept position
        self._sub: dict[int, TreeBuffers] = {}  # tree prefixes for a load-aware schedule

    @property
    def lookahead(self) -> int:
        return self.tree.num_nodes

    def bind(self, target: Transformer) -> None:
        self.to(target.device, target.dtype)

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> MedusaProposer:
        """Move the heads (and cast them to the target's dtype) and the tree buffers."""
        self.heads.to(device=device, dtype=dtype)
        b = self.buffers
        self.buffers = type(b)(*(getattr(b, f).to(device) for f in b.__dataclass_fields__))
        return self

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        """Stateless across calls: the prefill's :meth:`update` brings the hidden states."""

    def get_proposal(self, request: ProposalRequest) -> ChainProposal | TreeProposal | None:
        """A tree when every row is greedy and none caps its drafts (``chain_only``), else the
        top-1 chain (None if no row may draft)."""
        hidden = self._hidden
        assert hidden is not None, "update() with the prefill outcome comes first"
        if request.tree_budget == 0:
            return None  # a load-aware schedule turned speculation off at this batch size
        if not request.chain_only and all(p.temperature == 0 for p in request.params):
            root = torch.tensor([s[-1] for s in request.seqs], device=hidden.device)  # [B]
            buf = self._buffers(request.tree_budget)
            toks = self.tree_tokens(root, hidden) if buf is self.buffers else \
                self.subtree_tokens(root, hidden, buf)
            return TreeProposal(toks, buf)
        if max(request.limits) == 0:
            return None
        return self.chain(hidden, request.limits)

    def update(self, outcome: StepOutcome) -> None:
        h, dev = outcome.hidden, outcome.hidden.device
        self._hidden = h[torch.arange(h.shape[0], device=dev), torch.tensor(outcome.last,
                                                                            device=dev)]

    aux_layers: tuple[int, ...] = ()
    catch_up_s: float = 0.0  # the heads read the last hidden state only: no backlog

    def backlog(self) -> int:
        return 0

    def slots(self) -> SlotProposer | None:
        """Itself: the per-row state is the last kept hidden state."""
        return self

    def reserve(self, capacity: int, max_len: int) -> None:
        """In-flight batching: the per-row state is the last kept hidden state only."""
        self._hidden = None

    def admit(self, prompts: list[list[int]], outcome: StepOutcome,
              restored: Sequence[Restored]) -> None:
        h, dev = outcome.hidden, outcome.hidden.device
        new = h[torch.arange(h.shape[0], device=dev), torch.tensor(outcome.last, device=dev)]
        self._hidden = new if self._hidden is None else torch.cat([self._hidden, new])

    def evict(self, row: int) -> None:
        assert self._hidden is not None
        last = self._hidden.shape[0] - 1
        if row != last:
            self._hidden[row] = self._hidden[last]
        self._hidden = self._hidden[:last]

    def planes(self) -> tuple[Plane, ...]:
        """Nothing per position (its state is the last hidden state, from the prefill)."""
        return ()

    def export(self, row: int, positions: torch.Tensor) -> list[torch.Tensor]:
        return []

    def _buffers(self, budget: int | None) -> TreeBuffers:
        """The tree's first ``budget`` nodes (a prefix of the (depth, path) order is a tree:
        parents come first), cached per budget; None or more: the whole tree."""
        if budget is None or budget >= self.tree.num_nodes:
            return self.buffers
        if budget not in self._sub:
            sub = MedusaTree.from_choices(self.tree.choices[:budget], self.heads.num_heads)
            b = build_tree_buffers(sub)
            dev = self.buffers.position_ids.device
            self._sub[budget] = type(b)(*(getattr(b, f).to(dev)
                                          for f in b.__dataclass_fields__))
        return self._sub[budget]

    def tree_tokens(self, root: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """root [B] pending tokens, hidden [B, H] -> candidate tokens [B, N+1] (root first)."""
        return self.subtree_tokens(root, hidden, self.buffers)

    def subtree_tokens(self, root: torch.Tensor, hidden: torch.Tensor,
                       buffers: TreeBuffers) -> torch.Tensor:
        """The same for the tree of ``buffers`` (a prefix of this tree) [B, N'+1]."""
        logits = self.heads(hidden).float()  # [B, num_heads, V]
        topk = logits.topk(self.topk, dim=-1).indices  # [B, num_heads, k]
        return build_tree_tokens(root, topk, buffers)

    def chain(self, hidden: torch.Tensor, limits: list[int]) -> ChainProposal:
        """The heads' top-1 tokens as a chain of up to ``limits[b]`` drafts (one-hot q)."""
        drafts = self.heads(hidden)[:, :max(limits)].float().argmax(dim=-1)  # [B, k]
        return ChainProposal(drafts, list(limits), None, self._chain_acceptance)
