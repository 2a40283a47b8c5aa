"""A property of in-flight batching (specserve.runtime.scheduler / plan / runner): whatever the
arrival points, the prompts shared between requests, the stops, the cancels and the chunked
prefills, every request's tokens, finish reason, streamed tokens and acceptance stats equal its
run alone (a cancelled request: a prefix of them), for each proposer kind.

Scenarios are drawn from a seeded ``random.Random`` (seeds in ``SEEDS``; a failure names its
seed, and ``scenario(seed)`` rebuilds it): 8 requests over 3 prompt bases (two share a tail; one
prompt is an exact duplicate, most share a prefix), 1-15 prompt tokens (mostly 1-4), 3-14 new
tokens, arrivals in bursts at steps 0-8, capacity 3-5, ``prefill_chunk`` 4, 6 or 256 (prompts
are chunked, and a chunked prompt's last chunk joins in one step with other newcomers), one
temperature per scenario (0 or 0.9: a batch with a sampled row gets the chain where a greedy
one gets a tree, so the kinds with a tree need one temperature to keep their stats comparable),
a stop token taken from the request's own output for about a third of them, a cancel at a
random step for about one in six.
The default run takes 2 seeds per kind and checks that between them they made the plans the
test is for (``_coverage``: two newcomers in one step, a last chunk with other newcomers, rows
leaving while others run); the ``slow`` variant takes 12 more seeds, and two more kinds.
Planted faults it fails on: newcomers prefilled over the rows of a group joining in
the same step; a newcomer dropped from one step's plan, or its prefill output skipped;
``update()`` applying one row's tokens or stats to another.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from specserve.runtime import scheduler
from specserve.runtime.batch import GenerationResult
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.plan import StepPlan
from specserve.runtime.scheduler import Handle, Scheduler
from tests.runtime.conftest import TinyModels
from tests.runtime.test_scheduler import _proposer

torch.set_num_threads(1)

KINDS = ["none", "draft_same", "ngram", "medusa", "eagle3"]
SEEDS = [46, 32]  # T = 0.9 and T = 0: together they make every plan that _coverage names
SLOW_SEEDS = list(range(100, 112))
BLOCK = 4  # prefix-cache block size: the scenarios' prompts are 1-15 tokens
PREFIX_CACHE = 1 << 24  # bytes: never full here
SMALL_CACHE = 1 << 15  # bytes: a few blocks, evicted and reused under the scenario
# seed -> GROUP_TOKENS for its run (prompt tokens a step takes for one prefill forward): 3
# splits its bursts over steps that only prefill; the others run with the engine's own
GROUPS = {46: 3}


@dataclass(frozen=True)
class Scenario:
    prompts: list[list[int]]
    max_tokens: list[int]
    arrive: list[int]            # the step at which request i is submitted
    cancel_at: list[int | None]  # the step after which request i is cancelled
    stop_at: list[int | None]    # the output index whose token becomes a stop token
    temperature: float
    capacity: int
    chunk: int
    seed: int = 0


def scenario(seed: int) -> Scenario:
    r = random.Random(seed)
    bases = [[r.randrange(3, 250) for _ in range(15)] for _ in range(3)]
    bases[2][5:] = bases[0][5:]  # two bases share a tail: equal n-grams, other contexts
    n = 8
    sizes = [r.randint(1, 15) if r.random() < 0.4 else r.randint(1, 4) for _ in range(n)]
    prompts = [r.choice(bases)[:k] for k in sizes]
    prompts[r.randrange(1, n)] = list(prompts[0])  # an exact duplicate
    arrive = sorted(r.choice([0, 0, 1, 2, 2, 4, 5, 5, 8]) for _ in range(n))  # in bursts
    return Scenario(prompts, [r.randint(3, 14) for _ in range(n)], arrive,
                    [a + r.randint(0, 4) if r.random() < 1 / 6 else None for a in arrive],
                    [r.randint(1, 6) if r.random() < 1 / 3 else None for _ in range(n)],
                    r.choice([0.0, 0.9]), r.randint(3, 5), r.choice([4, 6, 256]), seed)


def _params(s: Scenario, i: int, free: list[int] | None = None) -> SamplingParams:
    stop = s.stop_at[i]
    base = SamplingParams(max_tokens=s.max_tokens[i], temperature=s.temperature, seed=50 + i)
    if stop is None or free is None or stop >= len(free):
        return base
    return SamplingParams(max_tokens=s.max_tokens[i], temperature=s.temperature, seed=50 + i,
                          stop_token_ids=(free[stop],))


def _alone(m: TinyModels, kind: str, s: Scenario) -> tuple[list[SamplingParams],
                                                           list[GenerationResult]]:
    """Each request's params (a stop token from its own free output) and its run alone."""
    dec = SpecDecoder(m.target, _proposer(kind, m))
    params, out = [], []
    for i, p in enumerate(s.prompts):
        q = _params(s, i)
        r = dec.generate([p], q)[0]
        if s.stop_at[i] is not None:
            q = _params(s, i, r.token_ids)
            r = dec.generate([p], q)[0]
        params.append(q)
        out.append(r)
    return params, out


class _Recording(Scheduler):
    """The real scheduler; its plans are kept (to show what a scenario exercised)."""

    plans: list[StepPlan]

    def schedule(self) -> StepPlan:
        plan = super().schedule()
        self.plans.append(plan)
        return plan


def _in_flight(m: TinyModels, kind: str, s: Scenario, params: list[SamplingParams],
               prefix_cache: int = 0) -> tuple[list[Handle], list[list[int]], list[StepPlan]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler, "GROUP_TOKENS", GROUPS.get(s.seed, scheduler.GROUP_TOKENS))
        return _run_in_flight(m, kind, s, params, prefix_cache)


def _run_in_flight(m: TinyModels, kind: str, s: Scenario, params: list[SamplingParams],
                   prefix_cache: int) -> tuple[list[Handle], list[list[int]], list[StepPlan]]:
    sch = _Recording(SpecDecoder(m.target, _proposer(kind, m)), s.capacity, max_len=64,
                     prefill_chunk=s.chunk, prefix_cache_bytes=prefix_cache,
                     block_size=BLOCK)
    sch.plans = []
    streamed: list[list[int]] = [[] for _ in s.prompts]
    handles: dict[int, Handle] = {}
    step = 0
    while len(handles) < len(s.prompts) or not sch.idle:
        for i, t in enumerate(s.arrive):
            if t == step:
                handles[i] = sch.submit(s.prompts[i], params[i], on_tokens=streamed[i].extend)
        sch.step()
        for i, t in enumerate(s.cancel_at):
            if t == step:
                sch.cancel(handles[i])
        step += 1
        assert step < 500, "the scheduler stopped making progress"
    return [handles[i] for i in range(len(s.prompts))], streamed, sch.plans


def _check(m: TinyModels, kind: str, seed: int, prefix_cache: int = 0) -> list[StepPlan]:
    """Every request of scenario ``seed`` against its run alone; the plans the run made
    (``prefix_cache`` bytes: with a prefix cache of 4-token blocks)."""
    s = scenario(seed)
    params, want = _alone(m, kind, s)
    handles, streamed, plans = _in_flight(m, kind, s, params, prefix_cache)
    for i, (h, w) in enumerate(zip(handles, want, strict=True)):
        got = h.result
        assert got is not None, f"seed {seed}: request {i} never finished"
        assert streamed[i] == got.token_ids, f"seed {seed}: request {i} streamed"
        if got.finish_reason == "cancelled":
            assert got.token_ids == w.token_ids[:len(got.token_ids)], f"seed {seed}: {i}"
            continue
        assert (got.token_ids, got.finish_reason) == (w.token_ids, w.finish_reason), \
            f"seed {seed}: request {i} tokens"
        assert got.stats == w.stats, f"seed {seed}: request {i} acceptance stats"
    return plans


def _coverage(plans: list[StepPlan]) -> dict[str, bool]:
    """What the plans exercised: newcomers joining together, a chunked prompt's last chunk
    joining with other newcomers, chunks, rows leaving while others run, newcomers joining
    in a step that does not decode (prefill first)."""
    return {"burst": any(sum(j.fed == 0 for j in p.join) >= 2 for p in plans),
            "prefill only": any(p.join and not p.decodes for p in plans),
            "chunk+burst": any(len(p.join) >= 2 and any(j.fed for j in p.join) for p in plans),
            "chunk": any(p.chunk is not None for p in plans),
            "evict": any(p.evict and p.decode for p in plans)}


@pytest.mark.parametrize("kind", KINDS)
def test_every_request_equals_its_run_alone(tiny_models: TinyModels, kind: str) -> None:
    plans = [p for seed in SEEDS for p in _check(tiny_models, kind, seed)]
    assert all(_coverage(plans).values()), _coverage(plans)


@pytest.mark.parametrize("kind", KINDS)
def test_with_a_prefix_cache_every_request_equals_its_run_alone(tiny_models: TinyModels,
                                                                kind: str) -> None:
    """The same scenarios with the prefix cache on: newcomers restore cached full blocks of
    their prompts (stored by earlier rows as they filled) and prefill only the rest."""
    plans = [p for seed in SEEDS for p in _check(tiny_models, kind, seed, PREFIX_CACHE)]
    assert any(j.blocks for p in plans for j in p.join), "no newcomer reused a block"
    assert any(p.store for p in plans)


@pytest.mark.slow
@pytest.mark.parametrize("kind", [*KINDS, "draft_random", "eagle3_tree"])
@pytest.mark.parametrize("seed", SLOW_SEEDS)
@pytest.mark.parametrize("prefix_cache", [0, PREFIX_CACHE, SMALL_CACHE])
def test_every_request_equals_its_run_alone_many_seeds(tiny_models: TinyModels, kind: str,
                                                       seed: int, prefix_cache: int) -> None:
    _check(tiny_models, kind, seed, prefix_cache)


def test_the_scenarios_draw_shared_prompts_stops_and_cancels() -> None:
    drawn = [scenario(seed) for seed in SEEDS]
    assert all(len({tuple(p) for p in s.prompts}) < len(s.prompts) for s in drawn)
    assert any(x is not None for s in drawn for x in s.stop_at)
    assert any(x is not None for s in drawn for x in s.cancel_at)
