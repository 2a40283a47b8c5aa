"""Choosing the draft length per step from measured acceptance and a measured step cost (pure).

Speculation pays when the tokens a step emits grow faster than what the step costs. With a
per-token acceptance rate alpha, a chain of k drafts emits ``1 + alpha + ... + alpha^k`` tokens
in expectation (Leviathan et al. 2023, eq. 1, "Fast Inference from Transformers via Speculative
Decoding"), while the verify forward of a batch of B rows costs T(B (k + 1)): the target's time
for that many token rows, flat while the step is bound by reading the weights and rising once
it is bound by compute. So the best k maximises the batch's expected tokens per second,

    sum_b E(alpha_b, min(k, cap_b)) / (T(B (k + 1)) + k c_draft),

with k = 0 (plain decoding) among the candidates, so that speculation is chosen only where it
is expected to pay. The same objective as Leviathan et al. §3.4's choice of gamma, per step and
with a measured T instead of a constant cost ratio; TensorRT-LLM's ``draft_len_schedule`` and
vLLM's adaptive draft length act on the same trade-off with a schedule written by hand.

alpha is estimated per row from its own verify steps: each step that verified drafts is a run
of Bernoulli(alpha) trials ended by the first rejection, so ``accepted / (accepted + rejected
steps)`` is alpha's maximum-likelihood estimate; a few pseudo-trials at the engine-wide rate
shrink a new row's estimate towards it. Acceptance need not be the same at every depth: a
prompt-lookup draft whose first token is right is likely a copy, so its next ones are right
more often (measured on the real model: about 0.3 at depth 1 against 0.6-0.8 beyond). ``scale``
carries the engine's measured rate at depth i over its mean rate, so row b's draft i is
accepted with probability ``alpha_b * scale[i]``, given the ones before it (1 at every depth:
the geometric model above).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.errors import SpecserveError

__all__ = ["DraftLenChoice", "StepCost", "chain_expected_tokens", "choose_draft_len",
           "row_alpha"]


P_MAX = 0.98  # no draft is taken as certain


def chain_expected_tokens(alpha: float, k: int, scale: Sequence[float] = ()) -> float:
    """Expected tokens one verify step of ``k`` chained drafts emits (the corrected or bonus
    token included): 1 + alpha + ... + alpha^k, or with per-depth ``scale`` (index i: draft
    i + 1; the last repeats) 1 + p1 + p1 p2 + ..., p_i = min(alpha scale_i, P_MAX)."""
    if not scale:
        return float(sum(alpha ** i for i in range(k + 1)))
    total, run = 1.0, 1.0
    for i in range(k):
        run *= min(alpha * scale[min(i, len(scale) - 1)], P_MAX)
        total += run
    return total


def row_alpha(accepted: int, rejected: int, prior: float, weight: float = 4.0,
              z: float = 0.0) -> float:
    """A row's acceptance rate: its ``accepted`` drafts and ``rejected`` steps (steps that
    rejected a draft), with ``weight`` pseudo-trials at ``prior``; ``z`` > 0: that many
    standard errors below the estimate (a lower bound: few trials, little trust)."""
    n = accepted + rejected + weight
    mean = (accepted + weight * prior) / n
    return max(mean - z * math.sqrt(mean * (1 - mean) / n), 0.0)


@dataclass(frozen=True)
class StepCost:
    """T(rows): seconds of one target forward (logits included) over ``rows`` token rows,
    measured at ``rows`` (increasing); linear between points and beyond the last two."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.rows) < 2 or len(self.rows) != len(self.seconds):
            raise SpecserveError("a step cost needs at least two (rows, seconds) points")
        if list(self.rows) != sorted(set(self.rows)) or self.rows[0] < 1:
            raise SpecserveError(f"step cost rows must increase from >= 1, got {self.rows}")
        if any(s <= 0 for s in self.seconds):
            raise SpecserveError("step cost seconds must be > 0")

    def at(self, rows: int) -> float:
        """Seconds for ``rows`` token rows (at least the first point's)."""
        i = min(max(bisect_left(self.rows, rows), 1), len(self.rows) - 1)
        r0, r1 = self.rows[i - 1], self.rows[i]
        s0, s1 = self.seconds[i - 1], self.seconds[i]
        return max(s0 + (s1 - s0) * (rows - r0) / (r1 - r0), self.seconds[0])

    def ratio(self, rows: int, base: int) -> float:
        """T(rows) / T(base)."""
        return self.at(rows) / self.at(base)


@dataclass(frozen=True)
class DraftLenChoice:
    """The chosen draft length and what the objective said: expected tokens per second at the
    chosen ``k`` and at k = 0 (``rate / plain_rate`` is the expected speedup of this step)."""

    k: int
    rate: float
    plain_rate: float


def choose_draft_len(alphas: Sequence[float], caps: Sequence[int],
                     pinned: Sequence[tuple[float, int]], batch_rows: int, cost: StepCost,
                     draft_cost: float, k_max: int,
                     overhead: Sequence[float] = (), margin: float = 0.0,
                     scale: Sequence[float] = ()) -> DraftLenChoice:
    """The k in 0..``k_max`` with the most expected tokens per second for one step.

    Row i drafts ``min(k, caps[i])`` tokens at acceptance ``alphas[i]``; ``pinned``: (alpha,
    draft length) of rows whose length the policy does not set (their tokens count, and the
    forward is at least that long). ``batch_rows``: the sequences of the verify forward (all
    of the batch's: the forward pads them to one length); ``draft_cost``: seconds per drafted
    position; ``overhead[w]``: seconds a step of draft width w takes beyond T (0 where
    missing); ``margin``: a k > 0 must beat k = 0 by this fraction (the estimates' error);
    ``scale``: acceptance by depth (:func:`chain_expected_tokens`)."""
    if len(alphas) != len(caps):
        raise SpecserveError("one acceptance rate per capped row")
    fixed = sum(chain_expected_tokens(a, k, scale) for a, k in pinned)
    k_pin = max((k for _, k in pinned), default=0)
    best: DraftLenChoice | None = None
    plain = 0.0
    for k in range(k_max + 1):
        width = max(k, k_pin)
        tokens = fixed + sum(chain_expected_tokens(a, min(k, c), scale)
                             for a, c in zip(alphas, caps, strict=True))
        extra = overhead[width] if width < len(overhead) else 0.0
        rate = tokens / (cost.at(batch_rows * (width + 1)) + extra + draft_cost * k)
        if k == 0:
            plain = rate
        if best is None or rate > best.rate and rate > plain * (1 + margin):
            best = DraftLenChoice(k, rate, plain)
    assert best is not None
    return DraftLenChoice(best.k, best.rate, plain)
