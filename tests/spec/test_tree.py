from __future__ import annotations

import itertools

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.spec.tree import (
    MC_SIM_7B_63,
    MedusaTree,
    build_tree_buffers,
    build_tree_tokens,
    tree_greedy_verify,
    tree_levels,
)


def test_default_tree_shape() -> None:
    t = MedusaTree.default()
    assert t.num_nodes == 63 == len(MC_SIM_7B_63)
    assert t.depth == 4
    assert t.max_topk() == 10


def test_brace_round_trip_and_format() -> None:
    t = MedusaTree.from_choices([[0], [1], [0, 0]])
    assert t.to_brace() == "{0}, {1}, {0, 0}"
    assert MedusaTree.from_brace(t.to_brace()) == t
    assert MedusaTree.from_brace(MedusaTree.default().to_brace()) == MedusaTree.default()
    assert MedusaTree.from_brace("[[0], [0, 0]]").num_nodes == 2


@pytest.mark.parametrize(
    "choices, message",
    [
        ([[0], [0, 1, 0]], "lacks its prefix"),
        ([[0], [0]], "duplicate"),
        ([], "empty"),
        ([[0], [0, 0], [0, 0, 0]], "exceeds the number of Medusa heads 2"),
        ([[]], "root is implicit"),
    ],
)
def test_invalid_trees(choices: list[list[int]], message: str) -> None:
    with pytest.raises(SpecserveError, match=message):
        MedusaTree.from_choices(choices, num_heads=2)


def test_bad_brace_text() -> None:
    with pytest.raises(SpecserveError):
        MedusaTree.from_brace("{0}, {a}")


def test_mask_is_ancestry_and_positions_are_depths() -> None:
    t = MedusaTree.default()
    b = build_tree_buffers(t)
    n = t.num_nodes + 1
    assert b.attn_mask.shape == (n, n)
    index = {p: i + 1 for i, p in enumerate(t.choices)}
    for i, p in enumerate(t.choices, start=1):
        ancestors = {0, i} | {index[p[:d]] for d in range(1, len(p))}
        assert set(torch.nonzero(b.attn_mask[i]).flatten().tolist()) == ancestors
        assert int(b.position_ids[i]) == len(p)
        assert int(b.head_index[i]) == len(p) - 1 and int(b.topk_rank[i]) == p[-1]
    # each retrieve path is a chain of parents ending in a leaf
    for path in b.retrieve_paths.tolist():
        nodes = [x for x in path if x >= 0]
        assert nodes[0] == 0
        assert all(int(b.parents[c]) == par for par, c in itertools.pairwise(nodes))


def test_tree_tokens_from_head_topk() -> None:
    t = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0]])
    b = build_tree_buffers(t)
    topk = torch.tensor([[[10, 11], [20, 21]]])  # [B=1, H=2, k=2]
    assert build_tree_tokens(torch.tensor([5]), topk, b).tolist() == [[5, 10, 11, 20, 20]]


def _tree_logits(tokens: list[int], best_after: dict[int, int], vocab: int = 32):  # type: ignore[no-untyped-def]
    logits = torch.full((1, len(tokens), vocab), -10.0)
    for node, tok in best_after.items():
        logits[0, node, tok] = 10.0
    return logits


def test_tree_greedy_picks_longest_accepted_path() -> None:
    # nodes: 0 root, 1 [0], 2 [1], 3 [0,0], 4 [1,0]
    t = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0]])
    b = build_tree_buffers(t)
    tokens = torch.tensor([[5, 10, 11, 20, 21]])
    # target: after root -> 11 (node 2 accepted), after node 2 -> 21 (node 4), after 4 -> 7
    r = tree_greedy_verify(tokens, _tree_logits([0] * 5, {0: 11, 1: 3, 2: 21, 3: 3, 4: 7}), b)
    assert r.num_emitted.tolist() == [3]
    assert r.tokens.tolist() == [[11, 21, 7]]
    assert r.accepted_nodes.tolist() == [[0, 2, 4]]
    # nothing accepted: emit the target's argmax after the root
    r0 = tree_greedy_verify(tokens, _tree_logits([0] * 5, {0: 9, 1: 3, 2: 3, 3: 3, 4: 3}), b)
    assert r0.tokens.tolist() == [[9, -1, -1]] and r0.accepted_nodes.tolist() == [[0, -1, -1]]


def test_tree_verify_matches_plain_greedy_chain() -> None:
    """For a chain-shaped tree, tree verification equals chain greedy verification."""
    from specserve.spec.verify import greedy_verify

    torch.manual_seed(0)
    t = MedusaTree.from_choices([[0], [0, 0], [0, 0, 0]])
    b = build_tree_buffers(t)
    for _ in range(50):
        logits = torch.randn(2, 4, 5)
        draft = torch.randint(0, 5, (2, 3))
        tokens = torch.cat([torch.zeros(2, 1, dtype=torch.long), draft], 1)
        tr = tree_greedy_verify(tokens, logits, b)
        gr = greedy_verify(draft, logits)
        assert torch.equal(tr.tokens, gr.tokens) and torch.equal(tr.num_emitted, gr.num_emitted)


def test_tree_levels_feed_each_depths_inner_nodes_with_their_ancestors_slots() -> None:
    """[0] [1] [0,0] [0,1] [1,0] [0,0,0] [0,1,0] (nodes 1..7): level 0 fills depth 1 from the
    root; level 1 feeds nodes 1, 2 (both have children) at slots 0, 1, each seeing itself;
    level 2 feeds nodes 3, 4 at slots 2, 3, each seeing its parent (node 1, slot 0) and itself;
    node 5 = [1, 0] is a leaf, never fed."""
    lv = tree_levels(MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0],
                                              [0, 1, 0]]))
    assert len(lv) == 3
    assert lv[0].nodes.tolist() == [0] and lv[0].children.tolist() == [1, 2]
    assert lv[0].ranks.tolist() == [0, 1] and lv[0].parent_slot.tolist() == [0, 0]
    assert lv[1].nodes.tolist() == [1, 2] and lv[1].first_slot == 0
    assert lv[1].visible.tolist() == [[True, False], [False, True]]
    assert lv[1].children.tolist() == [3, 4, 5] and lv[1].parent_slot.tolist() == [0, 0, 1]
    assert lv[1].ranks.tolist() == [0, 1, 0]
    assert lv[2].nodes.tolist() == [3, 4] and lv[2].first_slot == 2
    assert lv[2].feed_parent.tolist() == [0, 0]  # both children of node 1 (level 1's first)
    assert lv[2].visible.tolist() == [[True, False, True, False], [True, False, False, True]]
    assert lv[2].children.tolist() == [6, 7] and lv[2].parent_slot.tolist() == [0, 1]
