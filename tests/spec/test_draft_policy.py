"""The draft-length objective (specserve.spec.draft_policy): expected tokens of a chain, the
step-cost curve, a row's acceptance estimate and the choice of k. Plants: expected tokens
counted from alpha^1 (the bonus token dropped) fails the sums and the memory-bound choice; the
cost read at B rows instead of B (k + 1) fails the compute-bound choice; pinned rows' tokens
left out fails the pinned case."""

from __future__ import annotations

import pytest

from specserve.errors import SpecserveError
from specserve.spec.draft_policy import (
    P_MAX,
    StepCost,
    chain_expected_tokens,
    choose_draft_len,
    row_alpha,
)

FLAT = StepCost((1, 512), (1.0, 1.0))  # memory-bound at any width: a verify costs a plain step
LINEAR = StepCost((1, 2, 512), (1.0, 2.0, 512.0))  # compute-bound: cost grows with the rows


def test_expected_tokens_of_a_chain() -> None:
    assert chain_expected_tokens(0.0, 4) == 1.0
    assert chain_expected_tokens(1.0, 4) == 5.0
    assert chain_expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert chain_expected_tokens(0.9, 0) == 1.0


def test_step_cost_interpolates_and_extrapolates() -> None:
    c = StepCost((1, 4, 8), (1.0, 1.3, 2.1))
    assert c.at(1) == 1.0 and c.at(4) == pytest.approx(1.3)
    assert c.at(6) == pytest.approx(1.7)
    assert c.at(12) == pytest.approx(2.9)  # beyond the last point: the last slope
    assert c.ratio(8, 1) == pytest.approx(2.1)
    for rows, secs in (((1,), (1.0,)), ((2, 1), (1.0, 1.0)), ((1, 2), (1.0, 0.0))):
        with pytest.raises(SpecserveError):
            StepCost(rows, secs)


def test_row_alpha_shrinks_towards_the_prior() -> None:
    assert row_alpha(0, 0, 0.6) == pytest.approx(0.6)
    assert row_alpha(90, 10, 0.5) == pytest.approx(92 / 104)
    assert row_alpha(0, 8, 0.5, weight=4) == pytest.approx(2 / 12)
    low = row_alpha(3, 1, 0.5, z=1.0)  # mean 5/8 over 8 trials, one standard error low
    assert low == pytest.approx(5 / 8 - (5 / 8 * 3 / 8 / 8) ** 0.5)


def test_memory_bound_steps_draft_the_most() -> None:
    ch = choose_draft_len([0.6, 0.7], [4, 4], [], 2, FLAT, 0.0, 4)
    assert ch.k == 4 and ch.rate / ch.plain_rate == pytest.approx(
        (chain_expected_tokens(0.6, 4) + chain_expected_tokens(0.7, 4)) / 2)


def test_compute_bound_steps_do_not_speculate() -> None:
    ch = choose_draft_len([0.9] * 8, [4] * 8, [], 8, LINEAR, 0.0, 4)
    assert ch.k == 0 and ch.rate == ch.plain_rate


def test_the_proposer_cost_and_low_acceptance_turn_it_off() -> None:
    assert choose_draft_len([0.0], [4], [], 1, FLAT, 0.0, 4).k == 0
    assert choose_draft_len([0.5], [4], [], 1, FLAT, 10.0, 4).k == 0
    assert choose_draft_len([0.5], [4], [], 1, FLAT, 0.01, 4).k == 4


def test_caps_and_pinned_rows() -> None:
    # every row capped at 1: drafting more only pads the forward
    assert choose_draft_len([0.9, 0.9], [1, 1], [], 2, LINEAR, 0.0, 4).k <= 1
    # a pinned row at k = 4 pays the width anyway: free rows draft up to it
    cost = StepCost((1, 5, 10), (1.0, 1.0, 2.0))
    ch = choose_draft_len([0.8], [4], [(0.8, 4)], 2, cost, 0.0, 4)
    assert ch.k == 4
    # the pinned row's tokens count: with them the k = 4 step is worth more than plain
    alone = choose_draft_len([0.1], [4], [(0.95, 4)], 2, StepCost((1, 2, 10), (1.0, 1.0, 4.0)),
                             0.0, 4)
    assert alone.plain_rate == pytest.approx((1 + chain_expected_tokens(0.95, 4)) / 4.0)


def test_a_width_that_costs_more_than_the_curve_says_is_not_chosen() -> None:
    assert choose_draft_len([0.6], [4], [], 1, FLAT, 0.0, 4).k == 4
    assert choose_draft_len([0.6], [4], [], 1, FLAT, 0.0, 4, [0.0, 2.0, 2.0, 2.0, 2.0]).k == 0


def test_a_gain_within_the_margin_is_not_taken() -> None:
    cost = StepCost((1, 2, 512), (1.0, 1.4, 512.0))  # k = 1 at alpha 0.45: 1.45 / 1.4, +3.6%
    assert choose_draft_len([0.45], [1], [], 1, cost, 0.0, 1).k == 1
    assert choose_draft_len([0.45], [1], [], 1, cost, 0.0, 1, margin=0.05).k == 0


def test_acceptance_by_depth_scales_each_draft_given_the_ones_before() -> None:
    """Scale 1 at every depth is the geometric model; otherwise draft i is accepted with
    alpha * scale_i (the last scale repeating), never above P_MAX. Plant: applying the scale
    to the first draft only fails the second assert."""
    assert chain_expected_tokens(0.4, 3, [1.0]) == pytest.approx(chain_expected_tokens(0.4, 3))
    assert chain_expected_tokens(0.4, 3, [0.5, 2.0]) == pytest.approx(
        1 + 0.2 + 0.2 * 0.8 + 0.2 * 0.8 * 0.8)
    assert chain_expected_tokens(0.9, 2, [1.0, 5.0]) == pytest.approx(1 + 0.9 + 0.9 * P_MAX)
