"""The alarm rule (pure): one interval against the baseline, and the streak over intervals.

Rule, stated once (``specserve watch --help`` and ``docs/reliability.md`` say the same):

- an interval is **idle** when its activity (draft tokens; SGLang: generated tokens) is below
  ``min_activity``: it is not judged, and it neither extends nor breaks a streak;
- an active interval is **low** when its acceptance rate is below
  ``baseline rate × (1 − tolerance)`` or its tau below ``baseline tau × (1 − tolerance)``
  (each only where both sides have the figure);
- an **alarm** is raised when ``consecutive`` active intervals in a row are low; it is raised
  once per episode, and the first active interval that is not low ends the episode
  (a ``recovered`` event).

:func:`rule_exprs` gives the same thresholds to the Prometheus rule writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.errors import SpecserveError
from specserve.watch.baseline import Baseline
from specserve.watch.interval import Interval


@dataclass(frozen=True)
class Rule:
    tolerance: float = 0.3
    consecutive: int = 2
    min_activity: float = 64.0

    def __post_init__(self) -> None:
        if not 0.0 < self.tolerance < 1.0:
            raise SpecserveError(f"--tolerance {self.tolerance}: must be in (0, 1)")
        if self.consecutive < 1:
            raise SpecserveError(f"--consecutive {self.consecutive}: must be at least 1")


@dataclass(frozen=True)
class Thresholds:
    acceptance_rate: float | None
    tau: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance_rate": self.acceptance_rate, "tau": self.tau}


def thresholds(base: Baseline, rule: Rule) -> Thresholds:
    """The floors: baseline × (1 − tolerance)."""
    f = 1.0 - rule.tolerance
    return Thresholds(None if base.acceptance_rate is None else base.acceptance_rate * f,
                      None if base.tau is None else base.tau * f)


def below(iv: Interval, th: Thresholds) -> list[str]:
    """The figures of ``iv`` under their floor (empty: not low)."""
    out = []
    if th.acceptance_rate is not None and iv.acceptance_rate is not None \
            and iv.acceptance_rate < th.acceptance_rate:
        out.append("acceptance_rate")
    if th.tau is not None and iv.tau is not None and iv.tau < th.tau:
        out.append("tau")
    return out


@dataclass(frozen=True)
class State:
    streak: int = 0      # consecutive low active intervals
    alarmed: bool = False


@dataclass(frozen=True)
class Verdict:
    status: str          # "idle" | "ok" | "low"
    low: tuple[str, ...]
    state: State
    alarm: bool          # this interval raised the alarm
    recovered: bool      # this interval ended an alarm


def judge(iv: Interval, th: Thresholds, rule: Rule, st: State) -> Verdict:
    """One interval under the rule, from the state the previous ones left."""
    if iv.activity < rule.min_activity:
        return Verdict("idle", (), st, False, False)
    low = below(iv, th)
    if not low:
        return Verdict("ok", (), State(), False, st.alarmed)
    streak = st.streak + 1
    alarm = streak >= rule.consecutive and not st.alarmed
    return Verdict("low", tuple(low), State(streak, st.alarmed or alarm), alarm, False)
