"""From two scrapes of each worker to one interval's figures, summed over the workers (pure).

A worker's delta is ``current - previous`` per counter. A counter that went down, or a changed
``_created`` time (vLLM), means the worker restarted (or its model was reloaded): its counters
began again at 0, so the delta is the current value itself, and the interval says ``resets``
(the same rule as Prometheus' ``rate()``/``increase()``). Workers add up, as
tenstorrent/tt-inference-server PR #4978 sums every worker's delta behind Dynamo's frontend.

Figures: ``acceptance_rate`` = accepted / draft tokens; ``tau`` (tokens per verify step, bonus
included) = 1 + accepted / drafts where the engine counts drafts (vLLM's "mean acceptance
length"), else the engines' gauges weighted by each worker's activity. ``activity`` is the
draft tokens of the interval (SGLang: generated tokens), which the rule's idle test reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specserve.watch.series import Totals


@dataclass(frozen=True)
class Delta:
    """One worker's counts over one interval."""

    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    per_pos: tuple[float, ...]
    tokens: float | None
    gauge_tau: float | None
    gauge_rate: float | None
    reset: bool

    @property
    def activity(self) -> float:
        return (self.draft_tokens if self.draft_tokens is not None else self.tokens) or 0.0


def _went_down(prev: float | None, cur: float | None) -> bool:
    return prev is not None and cur is not None and cur < prev


def _minus(cur: float | None, prev: float | None, reset: bool) -> float | None:
    if cur is None:
        return None
    return cur if reset or prev is None else cur - prev


def delta(prev: Totals, cur: Totals) -> Delta:
    """``cur - prev`` of one worker, reset-aware."""
    pairs = [(prev.drafts, cur.drafts), (prev.draft_tokens, cur.draft_tokens),
             (prev.accepted, cur.accepted), (prev.tokens, cur.tokens),
             *zip(prev.per_pos, cur.per_pos, strict=False)]
    reset = any(_went_down(p, c) for p, c in pairs) or (
        prev.created is not None and cur.created is not None and prev.created != cur.created)
    per_pos = tuple(c if reset else c - (prev.per_pos[k] if k < len(prev.per_pos) else 0.0)
                    for k, c in enumerate(cur.per_pos))
    return Delta(_minus(cur.drafts, prev.drafts, reset),
                 _minus(cur.draft_tokens, prev.draft_tokens, reset),
                 _minus(cur.accepted, prev.accepted, reset), per_pos,
                 _minus(cur.tokens, prev.tokens, reset), cur.gauge_tau, cur.gauge_rate, reset)


@dataclass(frozen=True)
class Interval:
    """One interval over every worker that answered both scrapes."""

    workers: int
    resets: int
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    per_pos: tuple[float, ...]
    activity: float
    acceptance_rate: float | None
    tau: float | None

    def to_dict(self) -> dict[str, Any]:
        per_pos = [a / self.drafts for a in self.per_pos] if self.drafts else []
        return {"workers": self.workers, "resets": self.resets, "drafts": self.drafts,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted,
                "activity": self.activity, "acceptance_rate": self.acceptance_rate,
                "tau": self.tau, "per_position_acceptance": per_pos}


def _add(vals: Sequence[float | None]) -> float | None:
    got = [v for v in vals if v is not None]
    return sum(got) if got else None


def _weighted(pairs: Sequence[tuple[float | None, float]]) -> float | None:
    got = [(v, w) for v, w in pairs if v is not None and w > 0]
    total = sum(w for _, w in got)
    return sum(v * w for v, w in got) / total if total else None


def combine(deltas: Sequence[Delta]) -> Interval:
    """The workers' deltas summed into one interval."""
    drafts = _add([d.drafts for d in deltas])
    drafted = _add([d.draft_tokens for d in deltas])
    accepted = _add([d.accepted for d in deltas])
    per_pos = [0.0] * max((len(d.per_pos) for d in deltas), default=0)
    for d in deltas:
        for k, v in enumerate(d.per_pos):
            per_pos[k] += v
    activity = sum(d.activity for d in deltas)
    if drafted and accepted is not None:
        rate: float | None = accepted / drafted
    else:
        rate = _weighted([(d.gauge_rate, d.activity) for d in deltas])
    if drafts and accepted is not None:
        tau: float | None = 1.0 + accepted / drafts
    else:
        tau = _weighted([(d.gauge_tau, d.activity) for d in deltas])
    return Interval(len(deltas), sum(d.reset for d in deltas), drafts, drafted, accepted,
                    tuple(per_pos), activity, rate, tau)
