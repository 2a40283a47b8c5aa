"""Load-aware speculation: how much to draft at a given batch size (pure).

Verification costs grow with the batch (a verify forward of B rows x (K + 1) tokens stops being
memory-bound), while the tokens a draft saves per row do not, so past some batch size drafting
less, or not at all, is faster (Leviathan et al. 2023 §3.4's cost model per row; TensorRT-LLM's
``draft_len_schedule`` and vLLM's adaptive verification act on the same observation).

A :class:`DraftSchedule` maps batch-size lower bounds to a draft budget, in TensorRT-LLM 1.2's
semantics (``draft_len_schedule``, ``llm_args.py``): each key is the smallest batch size its
value applies to, key 1 must be there. The budget is the chain's K for chain proposers and the
number of tree nodes for Medusa (the tree's first nodes); 0 turns speculation off. Lossless at
any budget, also one that changes between steps: verification never depends on K.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from specserve.errors import SpecserveError


@dataclass(frozen=True)
class DraftSchedule:
    """``points``: (batch-size lower bound, budget), keys increasing from 1."""

    points: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        keys = [k for k, _ in self.points]
        if not keys or keys[0] != 1 or keys != sorted(set(keys)):
            raise SpecserveError(f"draft length schedule {self.text()!r}: keys are batch sizes "
                                 "from 1, increasing (e.g. 1:4,8:2,16:0)")
        if any(v < 0 for _, v in self.points):
            raise SpecserveError(f"draft length schedule {self.text()!r}: budgets must be >= 0")

    @classmethod
    def parse(cls, text: str) -> DraftSchedule:
        """``"1:4,8:2,16:0"`` (or a JSON-style ``{"1": 4, "8": 2}`` already split by the
        caller) -> a schedule."""
        pts = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, val = part.partition(":")
            try:
                pts.append((int(key), int(val)))
            except ValueError as e:
                raise SpecserveError(f"draft length schedule {text!r}: '{part}' is not "
                                     "BATCH:BUDGET") from e
            if not sep:
                raise SpecserveError(f"draft length schedule {text!r}: '{part}' is not "
                                     "BATCH:BUDGET")
        return cls(tuple(sorted(pts)))

    def at(self, batch: int) -> int:
        """The budget at ``batch`` running sequences."""
        keys = [k for k, _ in self.points]
        return self.points[max(bisect_right(keys, max(batch, 1)) - 1, 0)][1]

    def text(self) -> str:
        return ",".join(f"{k}:{v}" for k, v in self.points)
