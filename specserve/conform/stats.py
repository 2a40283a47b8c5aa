"""Pure statistics of the distribution check (check 5): the two-sample chi-square test of
homogeneity over categorical samples (Pearson; e.g. NIST/SEMATECH e-Handbook 1.3.5.15, "chi-
square two sample test"), with sparse categories pooled so that every expected count is at
least ``min_expected`` (Cochran's rule), and its p-value from the regularized upper incomplete
gamma function Q(k/2, x/2) (series and continued fraction as in Numerical Recipes 6.2; no
scipy at run time, checked against ``scipy.stats.chi2.sf`` in the tests).

Also the total-variation distance between the two empirical distributions, and the smallest
TV a test of ``n`` samples per side resolves (the detectable bound the matrix states).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

OTHER = "<pooled>"


@dataclass(frozen=True)
class ChiSquare:
    """The test's result; ``reject`` at level ``alpha``."""

    statistic: float
    dof: int
    p_value: float
    alpha: float
    categories: int
    n_a: int
    n_b: int
    tv: float

    @property
    def reject(self) -> bool:
        return self.p_value < self.alpha

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"statistic": round(self.statistic, 4), "dof": self.dof,
                "p_value": self.p_value, "alpha": self.alpha, "categories": self.categories,
                "n_a": self.n_a, "n_b": self.n_b, "tv": round(self.tv, 4),
                "reject": self.reject}


def gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) for a > 0, x >= 0."""
    if a <= 0 or x < 0:
        raise ValueError(f"gammaincc needs a > 0 and x >= 0, got a={a}, x={x}")
    if x == 0:
        return 1.0
    log_pre = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:   # series for P(a, x)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    tiny = 1e-300      # Lentz's continued fraction for Q(a, x)
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_pre) * h)


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof)."""
    if dof < 1:
        return 1.0
    return gammaincc(dof / 2, max(statistic, 0.0) / 2)


def pool(a: Counter[Hashable], b: Counter[Hashable], min_expected: float
         ) -> tuple[list[int], list[int]]:
    """Counts per category for both samples, rare categories merged into one pooled bin (and
    that bin into the rarest kept one if it is still too small)."""
    n_a, n_b = sum(a.values()), sum(b.values())
    total = n_a + n_b
    keys = sorted(set(a) | set(b), key=lambda k: (-(a[k] + b[k]), repr(k)))
    kept: list[Hashable] = []
    rare: list[Hashable] = []
    for k in keys:
        m = a[k] + b[k]
        small = min(m * n_a / total, m * n_b / total) < min_expected
        (rare if small else kept).append(k)
    rows_a = [a[k] for k in kept]
    rows_b = [b[k] for k in kept]
    if rare:
        ra, rb = sum(a[k] for k in rare), sum(b[k] for k in rare)  # type: ignore[misc]
        m = ra + rb
        if min(m * n_a / total, m * n_b / total) >= min_expected or not rows_a:
            rows_a.append(ra)
            rows_b.append(rb)
        else:
            rows_a[-1] += ra
            rows_b[-1] += rb
    return rows_a, rows_b


def total_variation(a: Counter[Hashable], b: Counter[Hashable]) -> float:
    n_a, n_b = sum(a.values()), sum(b.values())
    if not n_a or not n_b:
        return 0.0
    return 0.5 * sum(abs(a[k] / n_a - b[k] / n_b) for k in set(a) | set(b))


def chi_square_two_sample(sample_a: Sequence[Hashable], sample_b: Sequence[Hashable],
                          alpha: float = 1e-3, min_expected: float = 5.0) -> ChiSquare:
    """Two-sample chi-square test that both samples come from one categorical distribution."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    a, b = Counter(sample_a), Counter(sample_b)
    n_a, n_b = sum(a.values()), sum(b.values())
    if not n_a or not n_b:
        raise ValueError("chi-square: both samples must be non-empty")
    rows_a, rows_b = pool(a, b, min_expected)
    total = n_a + n_b
    stat = 0.0
    for ca, cb in zip(rows_a, rows_b, strict=True):
        m = ca + cb
        for c, n in ((ca, n_a), (cb, n_b)):
            e = m * n / total
            stat += (c - e) ** 2 / e
    dof = len(rows_a) - 1
    return ChiSquare(stat, dof, chi2_sf(stat, dof), alpha, len(rows_a), n_a, n_b,
                     total_variation(a, b))


def detectable_tv(n_per_side: int, alpha: float = 1e-3) -> float:
    """A rough bound on the total variation a two-sample test of ``n`` per side detects: the
    one-sided Hoeffding radius sqrt(2 ln(2/alpha) / n) of each empirical frequency, halved by
    the TV's factor 1/2 and doubled for two samples (stated in the matrix, not a power curve)."""
    if n_per_side < 1:
        raise ValueError("n_per_side must be >= 1")
    return math.sqrt(2 * math.log(2 / alpha) / n_per_side)
