"""Medusa sparse-tree construction from per-head top-k accuracies (pure).

Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", §3.3.1 (optimized tree construction): with ``a[h][r]`` the probability that head ``h``'s
rank-``r`` token is the target's token at depth ``h + 1`` (heads assumed independent), a node
``(r_0, ..., r_d)`` is accepted with probability ``prod_i a[i][r_i]``. The expected accepted length
of a tree is the sum of these products over its nodes, so tau = 1 + that sum (the bonus token).
Greedily adding the node with the largest product, among children of nodes already in the tree,
yields a prefix-closed tree; since every accuracy is <= 1 a child never beats its parent, so the
greedy tree holds the ``N`` largest products and is optimal for every budget ``N``.

Accuracies come from a per-head accuracy table, or are estimated from the accepted tree nodes a
benchmark recorded (``AcceptanceStats.accepted_nodes``, ``"head,rank" -> count`` over ``steps``
verify steps) under the same independence model (see :func:`accuracies_from_accepted_nodes`).
:func:`acceptance_block`, :func:`verify_steps` and :func:`head_accuracies_from_json` take those
inputs from already-parsed JSON; :mod:`specserve.tune_tree` reads and writes the files.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specserve.errors import SpecserveError

Path = tuple[int, ...]


@dataclass(frozen=True)
class HeadAccuracies:
    """``acc[h][r]``: P(head ``h``'s rank-``r`` token is correct); rows are heads."""

    acc: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, rows: Sequence[Sequence[float]], where: str = "accuracies") -> HeadAccuracies:
        if not rows or not all(len(r) for r in rows):
            raise SpecserveError(f"{where}: need at least one head with one rank")
        out = []
        for h, row in enumerate(rows):
            vals = tuple(float(v) for v in row)
            for r, v in enumerate(vals):
                if not 0.0 <= v <= 1.0:
                    raise SpecserveError(f"{where}: head {h} rank {r} accuracy {v} not in [0, 1]")
            if sum(vals) > 1.0 + 1e-6:
                raise SpecserveError(
                    f"{where}: head {h} rank accuracies sum to {sum(vals):.4f} > 1 "
                    "(cumulative top-k? give per-rank values)"
                )
            out.append(vals)
        return cls(tuple(out))

    @classmethod
    def from_cumulative(cls, rows: Sequence[Sequence[float]],
                        where: str = "accuracies") -> HeadAccuracies:
        """From cumulative top-k accuracies (top-1, top-2, ...) by differencing."""
        diffs = []
        for h, row in enumerate(rows):
            prev, d = 0.0, []
            for r, v in enumerate(row):
                if v < prev - 1e-9:
                    raise SpecserveError(f"{where}: head {h} top-{r + 1} accuracy decreases")
                d.append(max(0.0, float(v) - prev))
                prev = float(v)
            diffs.append(d)
        return cls.of(diffs, where)

    @property
    def num_heads(self) -> int:
        return len(self.acc)

    def value(self, path: Path) -> float:
        """Acceptance probability of a node: product of accuracies along its path."""
        v = 1.0
        for depth, rank in enumerate(path):
            row = self.acc[depth] if depth < len(self.acc) else ()
            v *= row[rank] if rank < len(row) else 0.0
        return v


def expected_tau(choices: Sequence[Sequence[int]], acc: HeadAccuracies) -> float:
    """tau = 1 + sum over tree nodes of the product of accuracies along the node's path."""
    return 1.0 + sum(acc.value(tuple(p)) for p in choices)


@dataclass(frozen=True)
class TunedTree:
    """Greedy tree: ``choices`` in insertion order (best first), and tau after each insertion
    (``tau_by_nodes[i]`` = tau of the first ``i + 1`` choices; every prefix is a valid tree)."""

    choices: tuple[Path, ...]
    tau_by_nodes: tuple[float, ...]

    @property
    def tau(self) -> float:
        return self.tau_by_nodes[-1] if self.tau_by_nodes else 1.0


def greedy_tree(acc: HeadAccuracies, max_nodes: int, max_depth: int | None = None,
                min_value: float = 0.0) -> TunedTree:
    """Medusa's greedy construction: repeatedly add the child with the largest path product.

    Stops at ``max_nodes`` or when the best candidate's value is ``<= min_value`` (nodes that can
    never be accepted are not worth verifying). Ties break on the smaller path, so the result is
    deterministic. ``max_depth`` defaults to the number of heads.
    """
    if max_nodes < 1:
        raise SpecserveError(f"node budget {max_nodes}: must be >= 1")
    depth_cap = acc.num_heads if max_depth is None else min(max_depth, acc.num_heads)
    heap: list[tuple[float, Path]] = []

    def push_children(parent: Path, parent_value: float) -> None:
        if len(parent) >= depth_cap:
            return
        for rank, a in enumerate(acc.acc[len(parent)]):
            heapq.heappush(heap, (-(parent_value * a), (*parent, rank)))

    push_children((), 1.0)
    choices: list[Path] = []
    taus: list[float] = []
    tau = 1.0
    while heap and len(choices) < max_nodes:
        neg, path = heapq.heappop(heap)
        if -neg <= min_value:
            break
        choices.append(path)
        tau += -neg
        taus.append(tau)
        push_children(path, -neg)
    return TunedTree(tuple(choices), tuple(taus))


def parse_accepted_nodes(nodes: Mapping[str, object], where: str) -> dict[Path, int]:
    """``{"head,rank": count}`` -> ``{(head, rank): count}`` with checks."""
    if not isinstance(nodes, Mapping):
        raise SpecserveError(f"{where}: accepted_nodes must be an object "
                             f'{{"head,rank": count}}, not {type(nodes).__name__}')
    out: dict[Path, int] = {}
    for key, count in nodes.items():
        parts = str(key).split(",")
        try:
            head, rank = (int(p) for p in parts)
        except ValueError as e:
            raise SpecserveError(f"{where}: accepted_nodes key {key!r} is not 'head,rank'") from e
        if (head < 0 or rank < 0 or not isinstance(count, int) or isinstance(count, bool)
                or count < 0):
            raise SpecserveError(f"{where}: accepted_nodes[{key!r}] = {count!r} is invalid")
        out[(head, rank)] = out.get((head, rank), 0) + count
    return out


def accuracies_from_accepted_nodes(
    counts: Mapping[Path, int], steps: int, measured_tree: Sequence[Sequence[int]] | None = None,
    where: str = "summary",
) -> HeadAccuracies:
    """Estimate ``a[h][r]`` from how often node ``(head h, rank r)`` was accepted in ``steps``.

    Under the independence model, E[count(h, r)] = steps * a[h][r] * sum of P(parent accepted)
    over the depth-``h`` parents that had a rank-``r`` child in the measured tree, with
    P(parent) = product of accuracies along it; solved depth by depth. Without the measured tree,
    every accepted parent is assumed to have had every rank as a child, so the denominator is the
    number of steps that reached depth ``h``. Ranks never in the measured tree estimate 0.
    """
    if steps <= 0:
        raise SpecserveError(f"{where}: steps = {steps}; need verify steps > 0")
    heads = 1 + max((h for h, _ in counts), default=-1)
    if measured_tree is not None:
        heads = max(heads, max((len(p) for p in measured_tree), default=0))
    if heads == 0:
        raise SpecserveError(f"{where}: no accepted tree nodes recorded (accepted_nodes empty)")
    topk = 1 + max([r for _, r in counts] + [max(p) for p in measured_tree or [] if p])
    rows: list[list[float]] = []
    for h in range(heads):
        partial = HeadAccuracies(tuple(tuple(r) for r in rows)) if rows else None
        row = []
        for r in range(topk):
            c = counts.get((h, r), 0)
            if measured_tree is not None:
                parents = [tuple(p[:-1]) for p in measured_tree if len(p) == h + 1 and p[-1] == r]
                reach = steps * sum(partial.value(p) if partial else 1.0 for p in parents)
            else:
                reach = steps if h == 0 else sum(v for (hh, _), v in counts.items() if hh == h - 1)
            if c > 0 and reach <= 0:
                raise SpecserveError(f"{where}: node ({h},{r}) accepted {c} times but unreachable "
                                     "in the measured tree")
            row.append(min(1.0, c / reach) if reach > 0 else 0.0)
        rows.append(row)
    return HeadAccuracies(tuple(tuple(r) for r in rows))


# ---------------------------------------------------- tune-tree inputs (parsed JSON, no files)


def acceptance_block(data: Any) -> dict[str, Any] | None:
    """``variants.spec.acceptance`` of a bench summary, ``acceptance``, or a bare stats dict:
    the first of these that has ``accepted_nodes``; None when none has."""
    if not isinstance(data, dict):
        return None
    spec = (data.get("variants") or {}).get("spec") if isinstance(data.get("variants"),
                                                                   dict) else None
    for block in (spec.get("acceptance") if isinstance(spec, dict) else None,
                  data.get("acceptance"), data):
        if isinstance(block, dict) and "accepted_nodes" in block:
            return block
    return None


def verify_steps(block: Mapping[str, Any], counts: Mapping[Path, int], where: str) -> int:
    """Verify steps of an acceptance block: ``steps``, else head-0 accepted nodes /
    ``per_position_acceptance[0]``."""
    steps = block.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        return steps
    rates = _numbers(block.get("per_position_acceptance") or [], where,
                     "per_position_acceptance")
    head0 = sum(c for (h, _), c in counts.items() if h == 0)
    if rates and rates[0] > 0 and head0 > 0:
        return round(head0 / rates[0])
    raise SpecserveError(f"{where}: acceptance has no 'steps' (verify steps) to normalize by")


def head_accuracies_from_json(data: Any, where: str) -> HeadAccuracies:
    """Per-head accuracies from parsed JSON: a list of per-rank rows, ``rank_accuracy`` (same),
    ``topk_accuracy`` (cumulative top-k per head) or a demo ``eval.json``'s
    ``medusa.top1_accuracy``."""
    if isinstance(data, list):
        return HeadAccuracies.of(_number_rows(data, where, "accuracies"), where)
    if isinstance(data, dict):
        if isinstance(data.get("rank_accuracy"), list):
            return HeadAccuracies.of(_number_rows(data["rank_accuracy"], where, "rank_accuracy"),
                                     where)
        if isinstance(data.get("topk_accuracy"), list):
            return HeadAccuracies.from_cumulative(
                _number_rows(data["topk_accuracy"], where, "topk_accuracy"), where)
        top1 = (data.get("medusa") or {}).get("top1_accuracy") if isinstance(
            data.get("medusa"), dict) else None
        if isinstance(top1, list):
            return HeadAccuracies.of(
                [[a] for a in _numbers(top1, where, "medusa.top1_accuracy")], where)
    raise SpecserveError(f"{where}: expected a bench summary with accepted_nodes, or per-head "
                         "accuracies (list of lists, rank_accuracy, topk_accuracy, "
                         "medusa.top1_accuracy)")


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _numbers(value: object, where: str, what: str) -> list[float]:
    """A JSON list of numbers, or ``<where>: <what>: expected a list of numbers``."""
    if isinstance(value, list) and all(_is_number(v) for v in value):
        return [float(v) for v in value]
    raise SpecserveError(f"{where}: {what}: expected a list of numbers, got {value!r:.60}")


def _number_rows(value: object, where: str, what: str) -> list[list[float]]:
    """A JSON list (one per head) of lists of numbers (one per rank)."""
    if isinstance(value, list) and all(isinstance(row, list) for row in value):
        return [_numbers(row, where, f"{what}[{h}]") for h, row in enumerate(value)]
    raise SpecserveError(f"{where}: {what}: expected one list of numbers per head, "
                         f"got {value!r:.60}")
