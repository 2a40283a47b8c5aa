"""Acceptance statistics, mergeable across steps and requests.

Definitions follow TensorRT-LLM's per-request perf outputs: ``acceptance_rate`` =
``total_accepted_draft_tokens / total_draft_tokens``. The mean number of tokens emitted per verify
step, tau = emitted / steps (Leviathan et al. 2023's expected tokens per step; vLLM's "mean
acceptance length" = 1 + accepted / drafts). Per-position rates give the probability that the
i-th draft position is accepted given it was proposed: ``per_position_accepted`` has an entry
(possibly 0) for every position ever drafted, as the BLS loop's ``stats_dict``
(``triton/models/bls_lib/spec_loop.py``) writes it; ``accept_hist[n]`` counts steps that
accepted exactly n drafts (gpt-fast's ``accept_counts``). For Medusa trees, ``accepted_nodes``
counts accepted tree nodes by ``"head,rank"`` for tree tuning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


@dataclass
class AcceptanceStats:
    """Counters for one request (or many, after ``merge``)."""

    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    steps: int = 0
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    accept_hist: list[int] = field(default_factory=list)
    accepted_nodes: dict[str, int] = field(default_factory=dict)
    # steps that rejected a draft (alpha's MLE: accepted / (accepted + these)); the engine's own
    # (runtime/draft_policy.py), not in to_dict
    rejected_steps: int = field(default=0, compare=False)
    # of those, the drafts the proposer did not make (structured output's grammar-forced drafts,
    # a request's prediction) that were accepted and the steps whose first rejected draft was
    # one: the proposer's own acceptance leaves them out (own_verdicts); not in to_dict
    foreign_accepted: int = field(default=0, compare=False)
    foreign_rejected_steps: int = field(default=0, compare=False)

    def observe(
        self,
        num_drafted: int,
        num_accepted: int,
        num_emitted: int | None = None,
        positions_drafted: int | None = None,
        nodes: Iterable[tuple[int, int]] = (),
    ) -> None:
        """Record one verify step.

        num_drafted: draft tokens verified this step (tree nodes for Medusa); num_accepted:
        drafts accepted; num_emitted: tokens emitted (default accepted + 1; fewer when a stop
        condition cut the step); positions_drafted: depth proposed (default num_drafted);
        nodes: accepted tree nodes as (head, rank).
        """
        if not 0 <= num_accepted <= max(num_drafted, 0):
            raise ValueError(f"accepted {num_accepted} not in [0, drafted={num_drafted}]")
        depth = num_drafted if positions_drafted is None else positions_drafted
        self.draft_tokens += num_drafted
        self.accepted_tokens += num_accepted
        self.emitted_tokens += num_accepted + 1 if num_emitted is None else num_emitted
        self.steps += 1
        self.rejected_steps += int(num_accepted < num_drafted)
        self.per_position_drafted = _add_lists(self.per_position_drafted, [1] * depth)
        self.per_position_accepted = _add_lists(
            self.per_position_accepted, [1] * num_accepted + [0] * (depth - num_accepted))
        hist = [0] * (num_accepted + 1)
        hist[num_accepted] = 1
        self.accept_hist = _add_lists(self.accept_hist, hist)
        for head, rank in nodes:
            key = f"{head},{rank}"
            self.accepted_nodes[key] = self.accepted_nodes.get(key, 0) + 1

    def observe_foreign(self, positions: Iterable[int], num_drafted: int,
                        num_accepted: int) -> None:
        """Of the step just observed: the drafts at ``positions`` (indices in its chain) were
        not the proposer's (the grammar's, the request's prediction)."""
        at = set(positions)
        self.foreign_accepted += sum(j < num_accepted for j in at)
        self.foreign_rejected_steps += int(num_accepted < num_drafted and num_accepted in at)

    def own_verdicts(self) -> tuple[int, int]:
        """The proposer's own accepted drafts and steps that rejected one of its drafts (the
        grammar's and a prediction's drafts left out)."""
        return (self.accepted_tokens - self.foreign_accepted,
                self.rejected_steps - self.foreign_rejected_steps)

    def merge(self, other: AcceptanceStats) -> AcceptanceStats:
        """A new AcceptanceStats holding both."""
        nodes = dict(self.accepted_nodes)
        for k, v in other.accepted_nodes.items():
            nodes[k] = nodes.get(k, 0) + v
        return AcceptanceStats(
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            emitted_tokens=self.emitted_tokens + other.emitted_tokens,
            steps=self.steps + other.steps,
            per_position_drafted=_add_lists(self.per_position_drafted, other.per_position_drafted),
            per_position_accepted=_add_lists(
                self.per_position_accepted, other.per_position_accepted
            ),
            accept_hist=_add_lists(self.accept_hist, other.accept_hist),
            accepted_nodes=nodes,
            rejected_steps=self.rejected_steps + other.rejected_steps,
            foreign_accepted=self.foreign_accepted + other.foreign_accepted,
            foreign_rejected_steps=self.foreign_rejected_steps + other.foreign_rejected_steps,
        )

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (TensorRT-LLM's ``acceptance_rate``); 0 when nothing was drafted."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verify step (1.0 means no gain)."""
        return self.emitted_tokens / self.steps if self.steps else 0.0

    @property
    def plain_steps(self) -> int:
        """Steps that verified no draft (a draft length of 0: plain decoding steps)."""
        return self.steps - (self.per_position_drafted[0] if self.per_position_drafted else 0)

    @property
    def per_position_acceptance(self) -> list[float]:
        """accepted / drafted at every drafted position (0.0 where none was accepted)."""
        accepted = _add_lists(self.per_position_accepted, [0] * len(self.per_position_drafted))
        return [
            a / d if d else 0.0
            for a, d in zip(accepted, self.per_position_drafted, strict=False)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "emitted_tokens": self.emitted_tokens,
            "steps": self.steps,
            "acceptance_rate": self.acceptance_rate,
            "tau": self.tau,
            "per_position_drafted": list(self.per_position_drafted),
            "per_position_accepted": list(self.per_position_accepted),
            "per_position_acceptance": self.per_position_acceptance,
            "accept_hist": list(self.accept_hist),
            "accepted_nodes": dict(self.accepted_nodes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AcceptanceStats:
        """The counters of a ``to_dict`` (or ``spec_stats_json``) dict; missing or null: 0."""
        return cls(
            draft_tokens=int(d.get("draft_tokens") or 0),
            accepted_tokens=int(d.get("accepted_tokens") or 0),
            emitted_tokens=int(d.get("emitted_tokens") or 0),
            steps=int(d.get("steps") or 0),
            per_position_drafted=[int(x) for x in d.get("per_position_drafted") or []],
            per_position_accepted=[int(x) for x in d.get("per_position_accepted") or []],
            accept_hist=[int(x) for x in d.get("accept_hist") or []],
            accepted_nodes={str(k): int(v) for k, v in (d.get("accepted_nodes") or {}).items()},
        )
