"""The engine's draft-length policy: k per step (0 included) from the acceptance it measures
online and the step-cost curve it measures at load (:mod:`specserve.spec.draft_policy` has the
objective; this module feeds it and keeps its state).

- T(rows), the target's forward + LM head over ``rows`` token rows, is timed on first use at a
  few row counts up to that step's verify forward, and further when a wider one comes (best of
  3, after a warm-up; more rows never cost less); what a real verify step takes beyond it (the
  step's bookkeeping, attention over long contexts) is added, measured online per draft width.
- Acceptance: each row's own accepted drafts and rejecting steps (its whole request, through
  :attr:`Batch.history`), shrunk towards an engine-wide rate that forgets at 3% per step; and
  engine-wide, how acceptance changes with a draft's depth (the rate at which draft i is
  accepted once drafts 1..i-1 were, over the mean rate), which scales every row's. The
  proposer's drafts only: grammar-forced drafts (:mod:`specserve.runtime.forced_drafts`) and a
  request's prediction (Predicted Outputs), nearly always accepted, would make a poor proposer
  look good.
- The proposer's cost per drafted position is timed online; a catch-up on positions seen
  while not drafting (EAGLE-3's head after a run of k = 0, a newcomer's prompt) is a one-off,
  timed apart per position caught up (its backlog), not a cost of every draft.
- Each step: before proposing, the k that maximises expected tokens per second (proposal cost
  included); after proposing, greedy rows' drafts cut again by the same choice over what was
  proposed (n-gram rows without a match), the proposal now paid for. While k = 0 is chosen, a
  probe step at k = 1 now and then (every 4th such step, backing off to every 64th) keeps the
  estimates fresh, unless even an accepted draft would not pay at that load, its catch-up
  included.
- Times are the step's own CPU time where it runs on one CPU thread (:func:`step_clock`).
- Rows the policy leaves alone: sampled rows with a ``seed`` keep their configured length, so a
  seed gives the same text whatever the load (rejection sampling's draws depend on k).

Lossless at any k: verification never depends on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import torch

from specserve.runtime.batch import Batch
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Transformer
from specserve.runtime.timing import step_clock
from specserve.spec.draft_policy import DraftLenChoice, StepCost, choose_draft_len, row_alpha

__all__ = ["DraftLenPolicy", "measure_step_cost"]

PROBE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_rows(rows_needed: int) -> list[int]:
    """The probe points up to the first at or above ``rows_needed`` (at least two)."""
    out = []
    for r in PROBE_ROWS:
        out.append(r)
        if r >= max(rows_needed, 2):
            break
    return out


def measure_step_cost(target: Transformer, rows: Sequence[int], reps: int = 3) -> StepCost:
    """T(r) at ``rows`` (increasing, at least two)."""
    return StepCost(tuple(rows), tuple(time_rows(target, rows, reps)))


def time_rows(target: Transformer, rows: Sequence[int], reps: int = 3) -> list[float]:
    """For each of ``rows`` (increasing): the best of ``reps`` timings of one forward of
    [1, r] new tokens + their logits, in seconds."""
    cache = KVCache(target.cfg, 1, rows[-1] + 1, target.dtype, target.device)
    tokens = torch.zeros(1, rows[-1], dtype=torch.long, device=target.device)  # [1, R]
    clock = step_clock(target.device)
    secs = []
    with torch.inference_mode():
        for i, r in enumerate(rows):
            best = float("inf")
            for _ in range(reps + (i == 0)):  # one warm-up run first
                cache.lengths = [0]
                _sync(target.device)
                t0 = clock()
                target.logits(target.run(tokens[:, :r], cache).hidden)  # [1, r, V]
                _sync(target.device)
                best = min(best, clock() - t0)
            secs.append(best)
    for i in range(len(secs) - 2, -1, -1):  # more rows never cost less: a point above its
        secs[i] = min(secs[i], secs[i + 1])  # right-hand neighbour was slowed by other load
    return secs


class DraftLenPolicy:
    """Per-step draft length for chain proposers (state over the decoder's lifetime)."""

    DECAY = 0.97  # the engine-wide rate forgets 3% per step
    EWMA = 0.1  # timing averages: weight of the newest step
    DRAFT_EWMA = 0.5  # the proposer's cost per draft follows its last proposals fast
    PROBE_GAPS = (4, 8, 16, 32, 64)
    MARGIN = 0.05  # speculate where the estimate says it pays by more than its own error
    # each row's acceptance taken up to one standard error low: fully where one draft per row
    # costs a quarter of a step or more (a wrong guess is dear), less where drafting is cheap
    Z, STAKE = 1.0, 0.25

    def __init__(self, cost: StepCost | None = None) -> None:
        self.cost = cost  # None: measured on first use
        self.acc, self.rej = 2.0, 2.0  # engine-wide pseudo-counts: alpha 0.5 to start
        # engine-wide per depth i (draft i + 1): chains that verified it, and accepted it
        self.reach: list[float] = []
        self.hit: list[float] = []
        self.draft_s = 0.0  # proposer seconds per drafted position
        self.catch_s = 0.0  # proposer seconds per position of backlog caught up
        # per draft width: seconds a verify step takes beyond the curve's forward
        self.overhead: dict[int, float] = {}
        self._gap, self._zeros, self._probing, self._backlog = 0, 0, 0, 0
        self.steps_by_k: Counter[int] = Counter()

    @property
    def alpha(self) -> float:
        """The engine-wide acceptance rate now."""
        return self.acc / (self.acc + self.rej)

    def ensure_cost(self, target: Transformer, rows_needed: int) -> StepCost:
        """The curve, measured now where it does not reach ``rows_needed`` yet."""
        if self.cost is not None and self.cost.rows[-1] >= rows_needed:
            return self.cost
        have = {} if self.cost is None else dict(zip(self.cost.rows, self.cost.seconds,
                                                      strict=True))
        top = max(have, default=0)
        todo = [r for r in probe_rows(rows_needed) if r > top]
        if todo:
            have.update(zip(todo, time_rows(target, todo), strict=True))
            self.cost = StepCost(tuple(sorted(have)), tuple(have[r] for r in sorted(have)))
        assert self.cost is not None
        return self.cost

    def row_alphas(self, st: Batch, rows: Sequence[int]) -> list[float]:
        """Each of ``rows``'s acceptance rate: its request's counts, shrunk to the engine's
        and taken low by :meth:`caution` standard errors."""
        z, out = self.caution(len(st.seqs)), []
        for b in rows:
            (ha, hr), (sa, sr) = st.history[b].own_verdicts(), st.stats[b].own_verdicts()
            out.append(row_alpha(ha + sa, hr + sr, self.alpha, z=z))
        return out

    def caution(self, batch: int) -> float:
        """Standard errors off each row's acceptance: Z scaled by what one draft per row adds
        to a step of ``batch`` rows, T(2 batch) / T(batch) - 1, over STAKE."""
        if self.cost is None:
            return self.Z
        return self.Z * min(1.0, (self.cost.ratio(2 * batch, batch) - 1) / self.STAKE)

    def _choose(self, st: Batch, caps: list[int], k_max: int, draft_cost: float,
                fixed: Callable[[Batch, int], bool], perfect: bool = False) -> DraftLenChoice:
        """The best k for the rows ``fixed`` does not hold at their cap (``perfect``: as if
        every draft were accepted)."""
        assert self.cost is not None
        act = [b for b in st.active() if caps[b] > 0]
        free, held = [b for b in act if not fixed(st, b)], [b for b in act if fixed(st, b)]
        pins = list(zip(self.row_alphas(st, held), [caps[b] for b in held], strict=True))
        alphas = [1.0] * len(free) if perfect else self.row_alphas(st, free)
        return choose_draft_len(alphas, [caps[b] for b in free], pins,
                                len(st.seqs), self.cost, draft_cost, k_max,
                                self.overheads(k_max), self.MARGIN, self.depth_scale())

    DEPTH_WEIGHT = 8.0  # pseudo-trials at the mean rate per depth: rare depths stay at 1

    def depth_scale(self) -> list[float]:
        """Per depth: the engine's acceptance rate there (given the drafts before it were
        accepted) over its mean rate, each shrunk towards the mean."""
        a = self.alpha
        if a <= 0:
            return []
        w = self.DEPTH_WEIGHT
        return [(h + w * a) / (r + w) / a for r, h in zip(self.reach, self.hit, strict=True)]

    def overheads(self, k_max: int) -> list[float]:
        """Per width 0..k_max: the measured overhead, else the largest measured at a smaller
        width (a wider step is never assumed to cost less)."""
        out, last = [], 0.0
        for w in range(k_max + 1):
            last = max(last, self.overhead.get(w, last))
            out.append(last)
        return out

    def plan(self, st: Batch, limits: list[int], backlog: int = 0) -> list[int]:
        """Before proposing: each free row's limit cut to the chosen k (a choice from past
        steps only, so sampled rows stay exact). ``backlog``: positions the proposer would
        catch up on first (:meth:`ChainProposer.backlog`)."""
        k_max = max(limits, default=0)
        self._probing = 0
        self._backlog = backlog
        if k_max == 0:
            return limits
        k = self._choose(st, limits, k_max, self.draft_s, _pinned).k
        # no probe where even a draft sure to be accepted would not pay at this load, its
        # catch-up paid in the same step
        probe_cost = self.draft_s + backlog * self.catch_s
        if k > 0 or self._choose(st, limits, 1, probe_cost, _pinned, perfect=True).k > 0:
            k = self._probe(k)
        return [lim if _pinned(st, b) else min(lim, k) for b, lim in enumerate(limits)]

    def trim(self, st: Batch, counts: list[int], limits: list[int]) -> list[int]:
        """After proposing: the choice again over the drafts proposed (their cost is paid),
        for greedy rows only: cutting a sampled row's chain by what its drafts turned out to
        be would bias rejection sampling (its proof takes the drafts as sampled from q)."""
        caps = [min(c, lim) for c, lim in zip(counts, limits, strict=True)]
        k_max = max(caps, default=0)
        if k_max == 0:
            return limits
        k = max(self._choose(st, caps, k_max, 0.0, _sampled).k, self._probing)
        return [lim if _sampled(st, b) else min(lim, k) for b, lim in enumerate(limits)]

    def _probe(self, k: int) -> int:
        """k = 0 chosen again and again: every so often k = 1, to measure acceptance."""
        self._probing = 0
        if k > 0:
            self._gap, self._zeros = 0, 0
            return k
        self._zeros += 1
        if self._zeros < self.PROBE_GAPS[self._gap]:
            return 0
        self._zeros, self._gap = 0, min(self._gap + 1, len(self.PROBE_GAPS) - 1)
        self._probing = 1
        return 1

    def observe(self, st: Batch, before: Sequence[tuple[int, int]], rows: int,
                width: int, drafted: int, propose_s: float, verify_s: float,
                catch_up_s: float = 0.0, chains: Sequence[int] = ()) -> None:
        """After a step: acceptance deltas per row (``before``: each row's (accepted, rejected
        steps) before it), the forward's ``rows`` and draft ``width``, the proposal's drafted
        positions and the two timings, ``catch_up_s`` of the proposal's on its backlog
        (:meth:`plan`'s), each row's verified chain length (``chains``; none: depths not
        counted)."""
        now = self.snapshot(st)
        acc = sum(a for a, _ in now) - sum(a for a, _ in before)
        rej = sum(r for _, r in now) - sum(r for _, r in before)
        self.acc = self.acc * self.DECAY + acc
        self.rej = self.rej * self.DECAY + rej
        if chains:  # a step that drafted: per-row acceptance by depth
            self._count_depths([n[0] - b[0] for n, b in zip(now, before, strict=True)], chains)
        if drafted:
            draft = max(propose_s - catch_up_s, 0.0) / drafted
            self.draft_s += self.DRAFT_EWMA * (draft - self.draft_s)
        if drafted and catch_up_s > 0 and self._backlog:
            self.catch_s += self.DRAFT_EWMA * (catch_up_s / self._backlog - self.catch_s)
        if self.cost is not None and verify_s > 0:
            extra = max(verify_s - self.cost.at(rows * (width + 1)), 0.0)
            # a width's first step (a cold code path, a busy moment) moves its estimate as
            # any other step does, from the narrower widths' (seeded by it, one slow first
            # step blocked width 4 of an n-gram engine for good: 12 ms against 2-3 at 1-3)
            old = self.overhead.get(width, self.overheads(width - 1)[-1] if width else extra)
            self.overhead[width] = old + self.EWMA * (extra - old)
        self.steps_by_k[width] += 1

    def _count_depths(self, accepted: Sequence[int], chains: Sequence[int]) -> None:
        """Per depth: chains that reached it (drafts before it accepted) and accepted it."""
        need = max(chains, default=0) - len(self.reach)
        self.reach += [0.0] * need
        self.hit += [0.0] * need
        self.reach = [x * self.DECAY for x in self.reach]
        self.hit = [x * self.DECAY for x in self.hit]
        for a, c in zip(accepted, chains, strict=True):
            for i in range(min(a + 1, c)):
                self.reach[i] += 1
                self.hit[i] += i < a

    @staticmethod
    def snapshot(st: Batch) -> list[tuple[int, int]]:
        """Each row's (accepted, rejected steps) of the proposer's own drafts in this batch's
        stats now (grammar-forced drafts left out)."""
        return [s.own_verdicts() for s in st.stats]

    def plain_share(self) -> float:
        """The share of steps it ran at k = 0."""
        n = sum(self.steps_by_k.values())
        return self.steps_by_k[0] / n if n else 0.0


def _sampled(st: Batch, b: int) -> bool:
    return st.params[b].temperature > 0


def _pinned(st: Batch, b: int) -> bool:
    """A sampled row with its own seed keeps its configured draft length."""
    p = st.params[b]
    return p.temperature > 0 and p.seed is not None
