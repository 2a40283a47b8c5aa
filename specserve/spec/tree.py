"""Medusa sparse candidate trees (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads", §2.1.2 tree attention).

A tree is given as ``medusa_choices``: a list of paths, each listing the top-k rank chosen at
each depth (depth d = Medusa head d-1); the root (the last token sampled by the base model) is
implicit and written nowhere. One entry is one tree node, so the number of draft tokens equals
``len(choices)`` (TensorRT-LLM's ``max_draft_len`` must be at least that). Valid trees contain
every prefix of every path, no duplicates, and are no deeper than the number of heads.

TensorRT-LLM's Triton backend takes the tree as a brace string ``"{0}, {0, 0}, {1}"``
(``medusa_choices`` parameter of the ``tensorrt_llm`` model). ``MC_SIM_7B_63`` is Medusa's
default tree (``medusa/model/medusa_choices.py``), also the C++/Triton default.

Node order everywhere: root first, then paths sorted by (depth, path), so parents precede
children. Pure functions build the buffers for one verify forward: the attention mask over tree
nodes, position offsets (depth), parents, and the root-to-leaf retrieve paths.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from specserve.errors import SpecserveError

Path = tuple[int, ...]

MC_SIM_7B_63: tuple[Path, ...] = tuple(
    tuple(p)
    for p in [
        [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4],
        [2, 0], [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8],
        [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0],
        [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0],
        [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2],
        [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0],
        [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0],
    ]
)


def to_brace(choices: Iterable[Sequence[int]]) -> str:
    """TensorRT-LLM's brace form of ``medusa_choices``, in the given order: ``{0}, {0, 0}, {1}``
    (the one serializer: :meth:`MedusaTree.to_brace`, the Triton ``medusa_choices`` parameter)."""
    return ", ".join("{" + ", ".join(str(int(i)) for i in p) + "}" for p in choices)


@dataclass(frozen=True)
class MedusaTree:
    """A validated tree; ``choices`` sorted by (depth, path)."""

    choices: tuple[Path, ...]

    @classmethod
    def from_choices(
        cls, choices: Iterable[Sequence[int]], num_heads: int | None = None
    ) -> MedusaTree:
        paths = [tuple(int(i) for i in c) for c in choices]
        _validate(paths, num_heads)
        return cls(tuple(sorted(paths, key=lambda p: (len(p), p))))

    @classmethod
    def default(cls) -> MedusaTree:
        return cls.from_choices(MC_SIM_7B_63)

    @classmethod
    def from_brace(cls, text: str, num_heads: int | None = None) -> MedusaTree:
        """Parse TensorRT-LLM's ``"{0}, {0, 0}"`` form (a Python list literal also works)."""
        s = text.strip()
        if s.startswith("{"):
            s = "[" + s.replace("{", "[").replace("}", "]") + "]"
        if not re.fullmatch(r"[\[\]\d,\s]*", s):
            raise SpecserveError(f"medusa_choices: not a brace or list form: {text[:60]!r}")
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError) as e:
            raise SpecserveError(f"medusa_choices: cannot parse {text[:60]!r}") from e
        if not isinstance(value, list) or not all(isinstance(p, list) for p in value):
            raise SpecserveError("medusa_choices: expected a list of paths")
        return cls.from_choices(value, num_heads)

    def to_brace(self) -> str:
        """TensorRT-LLM's Triton ``medusa_choices`` form: ``{0}, {0, 0}, {1}``."""
        return to_brace(self.choices)

    def to_list(self) -> list[list[int]]:
        return [list(p) for p in self.choices]

    @property
    def num_nodes(self) -> int:
        """Draft tokens per step (the root excluded)."""
        return len(self.choices)

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.choices), default=0)

    def max_topk(self) -> int:
        """Largest top-k rank used at any depth, plus one."""
        return max((max(p) for p in self.choices), default=-1) + 1


def _validate(paths: list[Path], num_heads: int | None) -> None:
    if not paths:
        raise SpecserveError("medusa_choices: the tree is empty")
    seen = set()
    for p in paths:
        if not p:
            raise SpecserveError("medusa_choices: empty path [] (the root is implicit)")
        if any(i < 0 for i in p):
            raise SpecserveError(f"medusa_choices: negative rank in {list(p)}")
        if p in seen:
            raise SpecserveError(f"medusa_choices: duplicate path {list(p)}")
        seen.add(p)
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise SpecserveError(f"medusa_choices: {list(p)} lacks its prefix {list(p[:-1])}")
    depth = max(len(p) for p in paths)
    if num_heads is not None and depth > num_heads:
        raise SpecserveError(
            f"medusa_choices: tree depth {depth} exceeds the number of Medusa heads {num_heads}"
        )


@dataclass(frozen=True)
class TreeBuffers:
    """Buffers for one tree-verify forward over ``N+1`` nodes (index 0 = root).

    attn_mask ``[N+1, N+1]`` bool: node i sees node j iff j is i or an ancestor of i.
    position_ids ``[N+1]``: depth (offset from the root's position).
    parents ``[N+1]``: parent index, -1 for the root.
    head_index ``[N+1]``: Medusa head that proposed the node (depth-1), -1 for the root.
    topk_rank ``[N+1]``: rank of the node's token in that head's top-k, -1 for the root.
    retrieve_paths ``[L, depth+1]``: node indices of each root-to-leaf path, -1 padded.
    """

    attn_mask: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor
    head_index: torch.Tensor
    topk_rank: torch.Tensor
    retrieve_paths: torch.Tensor


def build_tree_buffers(tree: MedusaTree) -> TreeBuffers:
    """Pure builder of the tree-attention buffers (Medusa ``generate_medusa_buffers``)."""
    index = {p: i + 1 for i, p in enumerate(tree.choices)}
    n = tree.num_nodes + 1
    parents = [-1] + [index.get(p[:-1], 0) for p in tree.choices]
    mask = torch.eye(n, dtype=torch.bool)
    mask[:, 0] = True
    for i, p in enumerate(tree.choices, start=1):
        for d in range(1, len(p)):
            mask[i, index[p[:d]]] = True
    has_child = {p[:-1] for p in tree.choices}
    leaves = [p for p in tree.choices if p not in has_child]
    paths = torch.full((len(leaves), tree.depth + 1), -1, dtype=torch.long)
    for r, leaf in enumerate(leaves):
        paths[r, 0] = 0
        for d in range(1, len(leaf) + 1):
            paths[r, d] = index[leaf[:d]]
    return TreeBuffers(
        attn_mask=mask,
        position_ids=torch.tensor([0] + [len(p) for p in tree.choices], dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        head_index=torch.tensor([-1] + [len(p) - 1 for p in tree.choices], dtype=torch.long),
        topk_rank=torch.tensor([-1] + [p[-1] for p in tree.choices], dtype=torch.long),
        retrieve_paths=paths,
    )


def build_tree_tokens(
    root_tokens: torch.Tensor, head_topk: torch.Tensor, buffers: TreeBuffers
) -> torch.Tensor:
    """Candidate tokens for every node.

    root_tokens ``[B]``; head_topk ``[B, H, k]`` (top-k token ids of each Medusa head, best
    first) -> ``[B, N+1]``: node i holds ``head_topk[head_index[i], topk_rank[i]]``.
    """
    heads = buffers.head_index[1:].to(head_topk.device)
    ranks = buffers.topk_rank[1:].to(head_topk.device)
    nodes = head_topk[:, heads, ranks]  # [B, N]
    return torch.cat([root_tokens[:, None].long(), nodes.long()], dim=1)


@dataclass(frozen=True)
class TreeVerifyResult:
    """Greedy tree verification for a batch.

    tokens ``[B, D+1]``: emitted tokens (accepted nodes' tokens, then the bonus), -1 padded.
    num_emitted ``[B]``: accepted + 1. accepted_nodes ``[B, D+1]``: node indices of the accepted
    path starting with the root (0), -1 padded; its length per row is ``num_emitted``.
    """

    tokens: torch.Tensor
    num_emitted: torch.Tensor
    accepted_nodes: torch.Tensor

    @property
    def num_accepted(self) -> torch.Tensor:
        return self.num_emitted - 1


def tree_greedy_verify(
    tree_tokens: torch.Tensor, target_logits: torch.Tensor, buffers: TreeBuffers
) -> TreeVerifyResult:
    """Longest accepted root-to-leaf path under greedy decoding.

    tree_tokens ``[B, N+1]``; target_logits ``[B, N+1, V]`` (the target's logits at each node,
    computed with ``buffers.attn_mask``). Node i is accepted iff its parent is accepted and its
    token equals the target's argmax after the parent. Ties keep the first path.
    """
    best = target_logits.argmax(dim=-1)  # [B, N+1]
    parents = buffers.parents.to(best.device)
    match = tree_tokens.long() == best[:, parents.clamp_min(0)]  # [B, N+1]
    match[:, 0] = True
    paths = buffers.retrieve_paths.to(best.device)  # [L, D+1]
    valid = paths >= 0
    path_match = match[:, paths.clamp_min(0)] & valid  # [B, L, D+1]
    acc_len = path_match.long().cumprod(dim=-1).sum(dim=-1)  # [B, L], includes the root
    best_len, best_path = acc_len.max(dim=-1)  # [B]
    nodes = paths[best_path]  # [B, D+1]
    cols = torch.arange(paths.shape[1], device=best.device)
    accepted = torch.where(cols < best_len[:, None], nodes, torch.full_like(nodes, -1))
    rows = torch.arange(best.shape[0], device=best.device)
    last = accepted[rows, best_len - 1]  # [B] last accepted node
    node_tok = tree_tokens.long().gather(1, accepted[:, 1:].clamp_min(0))  # [B, D]
    tokens = torch.cat([node_tok, torch.full_like(node_tok[:, :1], -1)], dim=1)
    tokens = torch.where(cols < (best_len - 1)[:, None], tokens, torch.full_like(tokens, -1))
    tokens[rows, best_len - 1] = best[rows, last]
    return TreeVerifyResult(tokens=tokens, num_emitted=best_len, accepted_nodes=accepted)


@dataclass(frozen=True)
class TreeLevel:
    """One expansion of a draft tree grown by an autoregressive drafter (EAGLE's static tree:
    the choices' ranks are top-k ranks of the drafter's distribution *after its parent*, not of
    independent heads as in Medusa; TensorRT-LLM's ``eagle_choices`` use the same paths).

    Level d (0-based) feeds the ``nodes`` at depth d that have children (d = 0: the root alone,
    which the drafter has already run) and fills their children: child ``children[i]`` takes
    rank ``ranks[i]`` of the distribution at ``nodes[parent_slot[i]]``. ``feed_parent[j]`` is
    the index, in the previous level's ``nodes``, of node j's parent (the drafter's output there
    is node j's input feature); ``visible [len(nodes), slots]`` says which drafter cache slots of
    this and the earlier levels' fed nodes node j attends to (its ancestors and itself); the
    nodes of level d are written at slots ``first_slot..first_slot + len(nodes) - 1``."""

    nodes: torch.Tensor        # [n] int64
    feed_parent: torch.Tensor  # [n] int64
    first_slot: int
    visible: torch.Tensor      # [n, first_slot + n] bool
    children: torch.Tensor     # [c] int64
    parent_slot: torch.Tensor  # [c] int64
    ranks: torch.Tensor        # [c] int64

    def to(self, device: torch.device | str) -> TreeLevel:
        return TreeLevel(self.nodes.to(device), self.feed_parent.to(device), self.first_slot,
                         self.visible.to(device), self.children.to(device),
                         self.parent_slot.to(device), self.ranks.to(device))


def tree_levels(tree: MedusaTree) -> list[TreeLevel]:
    """The expansion plan of ``tree`` for an autoregressive drafter: level 0 (the root) and one
    level per depth whose nodes have children (pure; node indices as :func:`build_tree_buffers`)."""
    index = {p: i + 1 for i, p in enumerate(tree.choices)}
    path_of = {0: ()} | {i: p for p, i in index.items()}
    fed: dict[int, int] = {}  # node -> drafter cache slot (levels >= 1)
    levels: list[TreeLevel] = []
    prev: tuple[int, ...] = (0,)
    prev_local: dict[int, int] = {0: 0}
    for depth in range(tree.depth):
        nodes = prev if depth == 0 else tuple(
            index[p] for p in tree.choices if len(p) == depth and
            any(len(c) == depth + 1 and c[:-1] == p for c in tree.choices))
        first = len(fed)
        if depth:
            for j, node in enumerate(nodes):
                fed[node] = first + j
        vis = torch.zeros(len(nodes), len(fed), dtype=torch.bool)
        for j, node in enumerate(nodes if depth else ()):
            p = path_of[node]
            for d in range(1, len(p) + 1):
                vis[j, fed[index[p[:d]]]] = True
        kids = [p for p in tree.choices if len(p) == depth + 1]
        local = {n: j for j, n in enumerate(nodes)}
        feed_parent = tuple(prev_local[index[path_of[n][:-1]]] if depth > 1 else 0
                            for n in nodes)
        parent_slot = [local[index[c[:-1]] if len(c) > 1 else 0] for c in kids]
        levels.append(TreeLevel(_long(nodes), _long(feed_parent), first, vis,
                                _long([index[c] for c in kids]), _long(parent_slot),
                                _long([c[-1] for c in kids])))
        prev_local = local
        prev = nodes
    return levels


def _long(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long)
