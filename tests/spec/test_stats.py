from __future__ import annotations

import pytest

from specserve.spec.stats import AcceptanceStats


def test_observe_and_rates() -> None:
    s = AcceptanceStats()
    s.observe(4, 4)
    s.observe(4, 1)
    s.observe(4, 0)
    assert (s.draft_tokens, s.accepted_tokens, s.emitted_tokens, s.steps) == (12, 5, 8, 3)
    assert s.acceptance_rate == pytest.approx(5 / 12)
    assert s.tau == pytest.approx(8 / 3)
    assert s.per_position_acceptance == [2 / 3, 1 / 3, 1 / 3, 1 / 3]
    assert s.accept_hist == [1, 1, 0, 0, 1]


def test_every_drafted_position_has_an_accepted_count() -> None:
    """A position drafted but never accepted counts 0 (rate 0.0), not missing; an older dict
    without those zeros reads the same."""
    s = AcceptanceStats()
    s.observe(4, 1)
    s.observe(2, 0)
    assert (s.per_position_drafted, s.per_position_accepted) == ([2, 2, 1, 1], [1, 0, 0, 0])
    assert s.per_position_acceptance == [0.5, 0.0, 0.0, 0.0]
    old = AcceptanceStats.from_dict({"per_position_drafted": [2, 2, 1, 1],
                                     "per_position_accepted": [1]})
    assert old.per_position_acceptance == [0.5, 0.0, 0.0, 0.0]


def test_merge_is_sum_and_round_trips() -> None:
    a, b = AcceptanceStats(), AcceptanceStats()
    a.observe(3, 2, nodes=[(0, 0), (1, 0)])
    b.observe(5, 5, positions_drafted=2, nodes=[(0, 0)])
    m = a.merge(b)
    assert m.draft_tokens == 8 and m.accepted_tokens == 7 and m.steps == 2
    assert m.accepted_nodes == {"0,0": 2, "1,0": 1}
    assert AcceptanceStats.from_dict(m.to_dict()) == m


def test_empty_and_invalid() -> None:
    s = AcceptanceStats()
    assert s.acceptance_rate == 0.0 and s.tau == 0.0
    with pytest.raises(ValueError):
        s.observe(2, 3)


def test_emitted_cut_by_stop_condition() -> None:
    s = AcceptanceStats()
    s.observe(4, 3, num_emitted=2)
    assert s.emitted_tokens == 2 and s.tau == 2.0
