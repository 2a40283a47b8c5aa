"""specserve.conform.stats: the chi-square p-value against scipy, the test's size and power on
seeded samples, pooling."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from scipy import stats as sps

from specserve.conform.stats import (
    chi2_sf,
    chi_square_two_sample,
    detectable_tv,
    gammaincc,
    pool,
    total_variation,
)


@pytest.mark.parametrize("x,dof", [(0.5, 1), (3.84, 1), (10.0, 4), (30.0, 10), (150.0, 99),
                                   (2.0, 30), (400.0, 300)])
def test_chi2_sf_matches_scipy(x: float, dof: int) -> None:
    assert chi2_sf(x, dof) == pytest.approx(sps.chi2.sf(x, dof), rel=1e-9, abs=1e-300)


def test_gammaincc_edges() -> None:
    assert gammaincc(2.0, 0.0) == 1.0
    with pytest.raises(ValueError):
        gammaincc(0.0, 1.0)


def _draw(rng: random.Random, weights: list[float], n: int) -> list[int]:
    return rng.choices(range(len(weights)), weights=weights, k=n)


def test_same_distribution_is_not_rejected_and_skew_is() -> None:
    rng = random.Random(7)
    p = [0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02]
    skew = [x * x for x in p]
    rejected_same = sum(chi_square_two_sample(_draw(rng, p, 300), _draw(rng, p, 300),
                                              alpha=0.01).reject for _ in range(100))
    assert rejected_same <= 5          # size: about 1 in 100 at alpha 0.01
    rejected_skew = sum(chi_square_two_sample(_draw(rng, skew, 300), _draw(rng, p, 300),
                                              alpha=0.01).reject for _ in range(20))
    assert rejected_skew == 20         # power against p^2


def test_statistic_matches_scipy_contingency() -> None:
    a = [0] * 50 + [1] * 30 + [2] * 20
    b = [0] * 40 + [1] * 40 + [2] * 20
    res = chi_square_two_sample(a, b)
    chi2, p, dof, _ = sps.chi2_contingency([[50, 30, 20], [40, 40, 20]], correction=False)
    assert res.statistic == pytest.approx(chi2)
    assert res.p_value == pytest.approx(p)
    assert res.dof == dof


def test_pool_merges_rare_categories() -> None:
    a = Counter({"x": 50, "y": 40, "r1": 1, "r2": 1})
    b = Counter({"x": 45, "y": 45, "r3": 2})
    ra, rb = pool(a, b, 5.0)
    assert sum(ra) == sum(a.values()) and sum(rb) == sum(b.values())
    assert len(ra) == 2                   # the rare bin is too small: folded into the last
    assert total_variation(Counter("aab"), Counter("abb")) == pytest.approx(1 / 3)


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        chi_square_two_sample([], [1])
    with pytest.raises(ValueError):
        chi_square_two_sample([1], [1], alpha=1.5)
    assert detectable_tv(300) > detectable_tv(3000)
