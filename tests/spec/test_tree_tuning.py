"""Greedy Medusa tree construction: hand-derived optimal trees, brute-force optimality over every
prefix-closed tree of a small budget, the prefix rule, and the accuracy estimator on simulated
tree-verify outcomes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserve.errors import SpecserveError
from specserve.spec.tree import MC_SIM_7B_63, MedusaTree
from specserve.spec.tree_tuning import (
    HeadAccuracies,
    Path,
    acceptance_block,
    accuracies_from_accepted_nodes,
    expected_tau,
    greedy_tree,
    head_accuracies_from_json,
    parse_accepted_nodes,
    verify_steps,
)


def _all_prefix_closed(num_heads: int, topk: int, size: int) -> set[frozenset[Path]]:
    """Every prefix-closed set of ``size`` nodes (depth <= num_heads, rank < topk)."""
    level: set[frozenset[Path]] = {frozenset()}
    for _ in range(size):
        nxt: set[frozenset[Path]] = set()
        for tree in level:
            frontier = [(r,) for r in range(topk)] + [
                (*p, r) for p in tree if len(p) < num_heads for r in range(topk)]
            nxt.update(tree | {c} for c in frontier if c not in tree)
        level = nxt
    return level


def test_hand_derived_small_trees() -> None:
    # a = [[0.6, 0.2], [0.5, 0.3]]: node values (0)=.6 (0,0)=.3 (1)=.2 (0,1)=.18 (1,0)=.1 (1,1)=.06
    acc = HeadAccuracies.of([[0.6, 0.2], [0.5, 0.3]])
    assert greedy_tree(acc, 1).choices == ((0,),)
    assert greedy_tree(acc, 2).choices == ((0,), (0, 0))
    assert greedy_tree(acc, 3).choices == ((0,), (0, 0), (1,))
    assert greedy_tree(acc, 4).choices == ((0,), (0, 0), (1,), (0, 1))
    assert greedy_tree(acc, 4).tau == pytest.approx(1 + 0.6 + 0.3 + 0.2 + 0.18)
    # a chain wins when head 0 is sure: values (0)=.9 (0,0)=.72 (0,0,0)=.504 > (1)=.05
    chain = HeadAccuracies.of([[0.9, 0.05], [0.8, 0.1], [0.7, 0.1]])
    assert greedy_tree(chain, 3).choices == ((0,), (0, 0), (0, 0, 0))
    # a bush wins when heads beyond the first are weak
    bush = HeadAccuracies.of([[0.4, 0.3, 0.2], [0.1, 0.05, 0.01]])
    assert greedy_tree(bush, 3).choices == ((0,), (1,), (2,))


@pytest.mark.parametrize("seed", range(6))
def test_greedy_is_optimal_by_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    heads, topk = 3, 3
    rows = []
    for _ in range(heads):
        raw = sorted((rng.random() for _ in range(topk)), reverse=True)
        scale = rng.uniform(0.3, 1.0) / sum(raw)
        rows.append([v * scale for v in raw])
    acc = HeadAccuracies.of(rows)
    for size in range(1, 6):
        best = max(expected_tau(sorted(t), acc) for t in _all_prefix_closed(heads, topk, size))
        got = greedy_tree(acc, size)
        assert len(got.choices) == size
        assert got.tau == pytest.approx(best, abs=1e-12)
        assert expected_tau(got.choices, acc) == pytest.approx(got.tau)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.floats(0.0, 0.25), min_size=1, max_size=4), min_size=1, max_size=5),
    budget=st.integers(1, 70),
)
def test_tuned_tree_always_satisfies_prefix_rule(rows: list[list[float]], budget: int) -> None:
    acc = HeadAccuracies.of(rows)
    tuned = greedy_tree(acc, budget)
    for n in range(1, len(tuned.choices) + 1):  # every prefix of the insertion order is a tree
        MedusaTree.from_choices(tuned.choices[:n], num_heads=acc.num_heads)
    assert all(b >= a for a, b in zip(tuned.tau_by_nodes, tuned.tau_by_nodes[1:], strict=False))
    assert len(tuned.choices) <= budget


def test_zero_accuracy_nodes_are_not_added() -> None:
    acc = HeadAccuracies.of([[0.5, 0.0], [0.0]])
    assert greedy_tree(acc, 10).choices == ((0,),)


def test_cumulative_topk_and_bad_input() -> None:
    acc = HeadAccuracies.from_cumulative([[0.5, 0.7, 0.75]])
    assert acc.acc[0] == pytest.approx((0.5, 0.2, 0.05))
    with pytest.raises(SpecserveError, match="sum to"):
        HeadAccuracies.of([[0.5, 0.7, 0.75]], "eval.json")
    with pytest.raises(SpecserveError, match="not in"):
        HeadAccuracies.of([[1.5]])
    with pytest.raises(SpecserveError, match="head,rank"):
        parse_accepted_nodes({"0-1": 3}, "s.json")


def _simulate(acc: list[list[float]], tree: tuple[Path, ...], steps: int,
              rng: random.Random) -> dict[Path, int]:
    """Tree verify at T=0 under the independence model: each head's correct token sits at one
    rank (or none), drawn from its accuracies; walk down while the node is in the tree."""
    nodes = set(tree)
    counts: dict[Path, int] = {}
    for _ in range(steps):
        path: Path = ()
        for head, row in enumerate(acc):
            u, rank = rng.random(), -1
            for r, a in enumerate(row):
                u -= a
                if u < 0:
                    rank = r
                    break
            if rank < 0 or (*path, rank) not in nodes:
                break
            path = (*path, rank)
            counts[(head, rank)] = counts.get((head, rank), 0) + 1
    return counts


def test_estimator_recovers_accuracies_through_a_sparse_tree() -> None:
    """Through mc_sim_7b_63 (ranks at deep levels only under a few parents) the tree-aware
    estimator is unbiased. Seed 0, 20000 steps: binomial sd <= 0.004 at depth 0, larger deeper;
    bound 0.03 on well-reached cells (expected count >= 200)."""
    true = [[0.45, 0.15, 0.08, 0.05], [0.35, 0.12, 0.06], [0.3, 0.1], [0.25, 0.08]]
    rng = random.Random(0)
    steps = 20000
    counts = _simulate(true, MC_SIM_7B_63, steps, rng)
    est = accuracies_from_accepted_nodes(counts, steps, MC_SIM_7B_63)
    naive = accuracies_from_accepted_nodes(counts, steps, None)
    for h, row in enumerate(true):
        for r, a in enumerate(row):
            expected_count = counts.get((h, r), 0)
            if expected_count >= 200:
                assert est.acc[h][r] == pytest.approx(a, abs=0.03), (h, r)
    # the naive estimator (no tree) underestimates deep heads, whose ranks exist under few
    # parents (head 3 has children only under (0, 0, 0)): about 0.09 instead of 0.25
    assert naive.acc[3][0] < true[3][0] - 0.1


def test_tuned_tree_beats_default_on_its_own_model() -> None:
    """Accuracies where head 0 is sharp: the greedy tree with <= 63 nodes has tau >= mc_sim's."""
    acc = HeadAccuracies.of([[0.7, 0.1, 0.05, 0.03, 0.02], [0.6, 0.1, 0.05], [0.5, 0.1],
                             [0.4, 0.1]])
    tuned = greedy_tree(acc, 63)
    assert tuned.tau >= expected_tau(MC_SIM_7B_63, acc)
    assert len(tuned.choices) <= 63


def test_estimator_errors() -> None:
    with pytest.raises(SpecserveError, match="steps"):
        accuracies_from_accepted_nodes({(0, 0): 1}, 0)
    with pytest.raises(SpecserveError, match="empty"):
        accuracies_from_accepted_nodes({}, 10)
    with pytest.raises(SpecserveError, match="unreachable"):
        accuracies_from_accepted_nodes({(0, 0): 5, (1, 3): 2}, 10, [(0,), (0, 0)])


def test_acceptance_block_and_verify_steps() -> None:
    block: dict[str, Any] = {"accepted_nodes": {"0,0": 30, "1,0": 9}, "steps": 100}
    assert acceptance_block({"variants": {"spec": {"acceptance": block}}}) is block
    assert acceptance_block({"acceptance": block}) is block
    assert acceptance_block(block) is block
    assert acceptance_block({"variants": {"spec": {"acceptance": {"x": 1}}}}) is None
    assert acceptance_block([block]) is None
    counts = parse_accepted_nodes(block["accepted_nodes"], "s")
    assert verify_steps(block, counts, "s") == 100
    derived = {"accepted_nodes": {}, "per_position_acceptance": [0.3, 0.09], "steps": True}
    assert verify_steps(derived, counts, "s") == 100  # head-0 nodes / rate 0; bool not steps
    for bad, msg in (({"per_position_acceptance": "abc"}, "expected a list of numbers"),
                     ({"per_position_acceptance": [0.0]}, "no 'steps'"), ({}, "no 'steps'")):
        with pytest.raises(SpecserveError, match=f"s.json: .*{msg}"):
            verify_steps(bad, counts, "s.json")


def test_head_accuracies_from_json_forms() -> None:
    assert head_accuracies_from_json([[0.5, 0.25], [0.5]], "a").acc == ((0.5, 0.25), (0.5,))
    assert head_accuracies_from_json({"rank_accuracy": [[0.5]]}, "a").acc == ((0.5,),)
    cum = head_accuracies_from_json({"topk_accuracy": [[0.5, 0.75]]}, "a")
    assert cum.acc == ((0.5, 0.25),)
    top1 = head_accuracies_from_json({"medusa": {"top1_accuracy": [0.5, 0.25]}}, "a")
    assert top1.acc == ((0.5,), (0.25,))
    for bad, msg in (([["x"]], r"accuracies\[0\]: expected a list of numbers"),
                     ([0.5], "accuracies: expected one list of numbers per head"),
                     ({"topk_accuracy": [[0.5, None]]}, r"topk_accuracy\[0\]"),
                     ({"medusa": {"top1_accuracy": [True]}}, "medusa.top1_accuracy"),
                     ({"other": 1}, "expected a bench summary")):
        with pytest.raises(SpecserveError, match=f"a.json: {msg}"):
            head_accuracies_from_json(bad, "a.json")


def test_accepted_nodes_must_be_a_mapping_of_int_counts() -> None:
    with pytest.raises(SpecserveError, match="s.json: accepted_nodes must be an object"):
        parse_accepted_nodes([("0,0", 1)], "s.json")  # type: ignore[arg-type]
    with pytest.raises(SpecserveError, match="is invalid"):
        parse_accepted_nodes({"0,0": True}, "s.json")
    assert parse_accepted_nodes({"0,0": 2, " 0, 0": 1}, "s") == {(0, 0): 3}
