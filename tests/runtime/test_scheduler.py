"""In-flight batching (specserve.runtime.scheduler): every request's tokens equal its tokens run
alone, for every in-flight proposer, with staggered arrivals, mixed prompt and output lengths,
a capacity smaller than the load (requests wait for a slot), greedy and seeded sampling; a
cancelled request frees its slot at the next step; a newcomer starts at the next step; the plan
(specserve.runtime.plan) puts newcomers joining in one step in rows of their own."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.checkpoint import load_medusa_heads
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.proposers import (
    DraftModelProposer,
    MedusaProposer,
    NgramProposer,
    OracleProposer,
    Proposer,
    Restored,
    StepOutcome,
)
from specserve.runtime.proposers.eagle3 import Eagle3Proposer
from specserve.runtime.scheduler import Scheduler
from specserve.spec.tree import MedusaTree
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41],
           [7, 100, 7, 100], [3], [50, 51, 52, 50, 51, 52, 50], [9, 9, 9, 9, 9, 9, 9, 9, 9]]
MAX_TOKENS = [24, 9, 17, 30, 5, 21, 12]
ARRIVE = [0, 0, 0, 1, 1, 2, 6]      # the scheduler step at which request i is submitted
TREE = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0], [1, 1], [1, 0, 0], [0, 1]])
KINDS = ["none", "draft_same", "draft_random", "ngram", "medusa", "eagle3", "eagle3_tree"]


def _proposer(kind: str, m: TinyModels) -> Proposer | None:
    if kind == "none":
        return None
    if kind == "draft_same":
        return DraftModelProposer(m.target_copy, max_draft_len=4)
    if kind == "draft_random":
        return DraftModelProposer(m.draft, max_draft_len=3)
    if kind == "ngram":
        return NgramProposer(max_draft_len=4)
    if kind == "eagle3":
        from tests.runtime.test_eagle3 import random_head
        return Eagle3Proposer(random_head(m.target, seed=4, scale=0.05), max_draft_len=3)
    if kind == "eagle3_tree":  # greedy rows: the static tree; sampled rows: the chain
        from tests.runtime.test_eagle3 import random_head
        return Eagle3Proposer(random_head(m.target, seed=4, scale=0.05), choices=TREE.choices)
    heads = load_medusa_heads(m.ckpt.medusa, 64, m.target.cfg.vocab_size)
    return MedusaProposer(heads, TREE)


def _params(i: int, temperature: float) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS[i], temperature=temperature, seed=100 + i)


def _alone(m: TinyModels, kind: str, temperature: float) -> list[tuple[list[int], object]]:
    """Tokens and acceptance stats of each request run alone (lossless decoding gives the same
    tokens from any proposer state; the stats show the proposer's state was right too)."""
    dec = SpecDecoder(m.target, _proposer(kind, m))
    out = []
    for i, p in enumerate(PROMPTS):
        r = dec.generate([p], _params(i, temperature))[0]
        out.append((r.token_ids, r.stats))
    return out


def _staggered(m: TinyModels, kind: str, temperature: float, capacity: int,
               chunk: int = 256) -> tuple[list[tuple[list[int], object]],
                                          list[list[list[int]]], int]:
    sch = Scheduler(SpecDecoder(m.target, _proposer(kind, m)), capacity, max_len=64,
                    prefill_chunk=chunk)
    streamed: list[list[list[int]]] = [[] for _ in PROMPTS]
    handles, step, peak = {}, 0, 0
    while len(handles) < len(PROMPTS) or not sch.idle:
        for i, t in enumerate(ARRIVE):
            if t == step:
                handles[i] = sch.submit(PROMPTS[i], _params(i, temperature),
                                        on_tokens=streamed[i].append)
        sch.step()
        if sch.waiting:  # slots full: someone waits (a peak of the load; the rows of the
            peak = max(peak, sch.runner.rows)  # step just run, those that finished in it too)
        step += 1
    outs = []
    for i in range(len(PROMPTS)):
        res = handles[i].result
        assert res is not None
        outs.append((res.token_ids, res.stats))
    return outs, streamed, peak


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("chunk", [256, 4])   # 4: prompts of 7, 12 and 9 tokens are chunked
def test_outputs_equal_each_request_alone(tiny_models: TinyModels, kind: str,
                                          temperature: float, chunk: int) -> None:
    want = _alone(tiny_models, kind, temperature)
    got, streamed, peak = _staggered(tiny_models, kind, temperature, capacity=3, chunk=chunk)
    assert [g[0] for g in got] == [w[0] for w in want]       # tokens
    assert [g[1] for g in got] == [w[1] for w in want]       # acceptance, step by step
    assert [[t for chunk in s for t in chunk] for s in streamed] == [w[0] for w in want]
    assert peak == 3            # the load exceeded the slots: requests waited, then joined


def test_a_newcomer_starts_at_the_next_step_and_cancel_frees_the_slot(
        tiny_models: TinyModels) -> None:
    sch = Scheduler(SpecDecoder(tiny_models.target, NgramProposer(4)), 2, max_len=64)
    long_a = sch.submit(PROMPTS[0], SamplingParams(max_tokens=40))
    long_b = sch.submit(PROMPTS[2], SamplingParams(max_tokens=40))
    sch.step()
    sch.step()
    late = sch.submit(PROMPTS[1], SamplingParams(max_tokens=4))
    sch.step()
    assert late.result is None and late.row is None   # no slot: both are running
    sch.cancel(long_a)
    sch.step()                                        # long_a leaves, late gets its slot
    assert long_a.result is not None and long_a.result.finish_reason == "cancelled"
    assert late.row is not None and late.row.out[0]   # prefilled: its first token is out
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target, NgramProposer(4))
    assert late.result is not None and late.result.token_ids == alone.generate(
        [PROMPTS[1]], SamplingParams(max_tokens=4))[0].token_ids
    assert long_b.result is not None and long_b.result.token_ids == alone.generate(
        [PROMPTS[2]], SamplingParams(max_tokens=40))[0].token_ids


def test_a_prefill_group_shares_one_admission_time(tiny_models: TinyModels) -> None:
    """Newcomers prefilled together are admitted at one time (Triton's first_scheduled_time_ns
    tells clients which requests shared a batch); a later newcomer gets a later time."""
    sch = Scheduler(SpecDecoder(tiny_models.target, NgramProposer(4)), 4, max_len=64)
    group = [sch.submit(PROMPTS[i], SamplingParams(max_tokens=8)) for i in range(3)]
    sch.step()
    late = sch.submit(PROMPTS[0], SamplingParams(max_tokens=8))
    sch.step()
    times = {h.admitted_ns for h in group}
    assert len(times) == 1 and 0 < times.pop() < late.admitted_ns


def test_refusals(tiny_models: TinyModels) -> None:
    with pytest.raises(SpecserveError, match="oracle proposer keeps per-call state"):
        Scheduler(SpecDecoder(tiny_models.target, OracleProposer([[1, 2]])), 2, 64)
    sch = Scheduler(SpecDecoder(tiny_models.target), 2, max_len=16)
    with pytest.raises(SpecserveError, match="exceeds the engine's 16"):
        sch.submit(PROMPTS[0], SamplingParams(max_tokens=10))
    with pytest.raises(SpecserveError, match="outside the vocab"):
        sch.submit([10 ** 6], SamplingParams(max_tokens=2))


def test_medusa_rows_follow_their_sequences(tiny_models: TinyModels) -> None:
    """Random heads accept next to nothing, so tokens and stats cannot show a wrong row: check
    the state itself. Rows join in order; evicting row 0 moves the last row into it."""
    heads = load_medusa_heads(tiny_models.ckpt.medusa, 64, tiny_models.target.cfg.vocab_size)
    prop = MedusaProposer(heads, TREE)
    prop.reserve(3, 64)
    from specserve.runtime.proposers import StepOutcome

    h = torch.randn(3, 5, 64)  # [B, T, H]
    prop.admit([[1], [2]], StepOutcome(h[:2], [4, 2], [0, 0], [[1], [2]]), [Restored()] * 2)
    prop.admit([[3]], StepOutcome(h[2:], [1], [0], [[3]]), [Restored()])
    assert prop._hidden is not None
    assert torch.equal(prop._hidden, torch.stack([h[0, 4], h[1, 2], h[2, 1]]))
    prop.evict(0)
    assert torch.equal(prop._hidden, torch.stack([h[2, 1], h[1, 2]]))
    prop.evict(1)
    assert torch.equal(prop._hidden, h[2, 1][None])


@pytest.mark.parametrize("kind", ["draft_same", "ngram", "medusa"])
def test_load_aware_schedule_keeps_outputs(tiny_models: TinyModels, kind: str) -> None:
    """The budget follows the running batch (3 slots: 4 / 2 / 0 drafts, Medusa 7 / 3 / 0
    nodes), so it changes between steps as requests come and go; greedy tokens stay those of
    each request alone, and the budget is used: less drafting than without the schedule."""
    from specserve.spec.schedule import DraftSchedule

    text = "1:7,2:3,3:0" if kind == "medusa" else "1:4,2:2,3:0"
    want = _alone(tiny_models, kind, 0.0)
    dec = SpecDecoder(tiny_models.target, _proposer(kind, tiny_models),
                      schedule=DraftSchedule.parse(text))
    sch = Scheduler(dec, 3, max_len=64)
    handles, step = {}, 0
    while len(handles) < len(PROMPTS) or not sch.idle:
        for i, t in enumerate(ARRIVE):
            if t == step:
                handles[i] = sch.submit(PROMPTS[i], _params(i, 0.0))
        sch.step()
        step += 1
    got = [handles[i].result for i in range(len(PROMPTS))]
    assert [g.token_ids for g in got if g] == [w[0] for w in want]
    drafted = sum(g.stats.draft_tokens for g in got if g)
    assert 0 < drafted < sum(w[1].draft_tokens for w in want)  # type: ignore[attr-defined]


def test_schedule_parse_and_lookup() -> None:
    from specserve.spec.schedule import DraftSchedule

    s = DraftSchedule.parse("8:2, 1:4, 16:0")
    assert [s.at(b) for b in (1, 7, 8, 15, 16, 64)] == [4, 4, 2, 2, 0, 0]
    assert s.text() == "1:4,8:2,16:0"
    for bad in ("2:4", "1:4,1:2", "1:-1", "1:4,x", "1"):
        with pytest.raises(SpecserveError, match="draft length schedule"):
            DraftSchedule.parse(bad)


def test_a_long_prompt_is_prefilled_a_chunk_per_step_while_the_batch_runs(
        tiny_models: TinyModels) -> None:
    sch = Scheduler(SpecDecoder(tiny_models.target), 2, max_len=64, prefill_chunk=4)
    run = sch.submit([20, 21], SamplingParams(max_tokens=30))
    sch.step()
    long = sch.submit(PROMPTS[2], SamplingParams(max_tokens=5))   # 12 tokens: 3 chunks
    seen = []
    for _ in range(3):
        before = len(run.row.out[0]) if run.row else 0
        sch.step()
        assert run.row is not None and len(run.row.out[0]) == before + 1  # the batch ran
        seen.append(long.row is not None)
    assert seen == [False, False, True]  # two chunks of 4 fed alone, the last one joins
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert long.result is not None and long.result.token_ids == alone.generate(
        [PROMPTS[2]], SamplingParams(max_tokens=5))[0].token_ids


def test_running_rows_wait_at_most_the_token_budget_for_a_burst(
        tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    """prefill_chunk 12, one 4-token forward a step, a request generating: of four 7-, 2-, 9-
    and 4-token prompts arriving together, the first step prefills the 2 and does not decode
    (the 4 fits in the running row's wait of 12 still); the next the 4 and decodes (the 7
    would take the wait to 13); then the 7 with a decode, the 9 with a decode. The running
    request waits at most 12 prompt tokens for a token, and no step only decodes."""
    import specserve.runtime.scheduler as scheduler
    monkeypatch.setattr(scheduler, "GROUP_TOKENS", 4)
    sch = Scheduler(SpecDecoder(tiny_models.target), 6, max_len=64, prefill_chunk=12)
    run = sch.submit([20, 21], SamplingParams(max_tokens=30))
    sch.step()
    assert run.row is not None and len(run.row.out[0]) == 2  # generating: it has decoded
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [9] * 9, [7, 100, 7, 100]]
    burst = [sch.submit(p, SamplingParams(max_tokens=6)) for p in prompts]
    joined, ran = [], []
    for _ in range(4):
        before = len(run.row.out[0])
        sch.step()
        ran.append(len(run.row.out[0]) - before)
        joined.append([h.row is not None for h in burst])
    assert ran == [0, 1, 1, 1]
    assert joined == [[False, True, False, False], [False, True, False, True],
                      [True, True, False, True], [True] * 4]
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert [h.result.token_ids for h in burst if h.result] == [
        alone.generate([p], SamplingParams(max_tokens=6))[0].token_ids for p in prompts]


def test_a_long_prompts_next_chunk_counts_as_waiting_prefill(
        tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    """prefill_chunk 4, IDLE_PREFILL_TOKENS 16: a 2-token and a 20-token prompt (over 16:
    chunked) arrive at an idle engine. The 2 joins with the first chunk and does not decode
    while the next chunk fits in its wait of 16 (6, then 10 tokens); the third chunk would
    take it past 16, so that step decodes; from then on the 2 is generating (a wait of 4) and
    every step decodes, the last piece joining at the fifth."""
    import specserve.runtime.scheduler as scheduler
    monkeypatch.setattr(scheduler, "IDLE_PREFILL_TOKENS", 16)
    sch = Scheduler(SpecDecoder(tiny_models.target), 4, max_len=64, prefill_chunk=4)
    short = sch.submit([20, 21], SamplingParams(max_tokens=6))
    long = sch.submit(list(range(30, 50)), SamplingParams(max_tokens=6))  # 20 > 16: chunked
    counts = []
    for _ in range(5):
        sch.step()
        counts.append((len(short.row.out[0]) if short.row else 0, long.row is not None))
    assert counts == [(1, False), (1, False), (2, False), (3, False), (4, True)]
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert long.result is not None and long.result.token_ids == alone.generate(
        [list(range(30, 50))], SamplingParams(max_tokens=6))[0].token_ids


def test_a_prompt_arriving_between_prefill_forwards_goes_ahead_of_longer_ones(
        tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    """One prefill forward a step (GROUP_TOKENS 4 here) and no decode while prompts wait and
    nothing generating waits on them: of a burst of a 7- and a 2-token prompt the 2 joins
    first; a 3-token prompt arriving after that step goes ahead of the 7, which waited;
    the first decode comes after the 7's prefill (until then the rows hold one token)."""
    import specserve.runtime.scheduler as scheduler
    monkeypatch.setattr(scheduler, "GROUP_TOKENS", 4)
    sch = Scheduler(SpecDecoder(tiny_models.target), 6, max_len=64, prefill_chunk=12)
    seven = sch.submit([5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=6))
    two = sch.submit([20, 21], SamplingParams(max_tokens=6))
    sch.step()
    assert (seven.row, two.row is not None) == (None, True)
    three = sch.submit([30, 31, 32], SamplingParams(max_tokens=6))
    sch.step()
    assert (seven.row, three.row is not None) == (None, True)
    assert two.row is not None and len(two.row.out[0]) == 1  # no decode yet
    sch.step()
    assert seven.row is not None
    assert [len(h.state().out[0]) for h in (two, three, seven)] == [2, 2, 2]  # all decoded
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert [h.result.token_ids for h in (seven, two, three) if h.result] == [
        alone.generate([p], SamplingParams(max_tokens=6))[0].token_ids
        for p in ([5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32])]


class _FailingDraft(DraftModelProposer):
    """Its admit raises once, after the draft cache was half switched (a prefill that fails)."""

    fail = True

    def admit(self, prompts: list[list[int]], outcome: StepOutcome,
              restored: Sequence[Restored]) -> None:
        if self.fail:
            self.fail = False
            assert self.cache is not None
            self.cache = self.pool.view(self.cache.batch, self.cache.batch + len(prompts))
            raise RuntimeError("planted admission failure")
        super().admit(prompts, outcome, restored)


def test_a_failed_admission_gives_every_request_back_and_the_pool_recovers(
        tiny_models: TinyModels) -> None:
    prop = _FailingDraft(tiny_models.target_copy, max_draft_len=4)
    prop.fail = False
    sch = Scheduler(SpecDecoder(tiny_models.target, prop), 4, max_len=64, prefill_chunk=4)
    a = sch.submit(PROMPTS[1], SamplingParams(max_tokens=20))
    sch.step()
    prop.fail = True
    b = sch.submit(PROMPTS[4], SamplingParams(max_tokens=5))
    c = sch.submit(PROMPTS[2], SamplingParams(max_tokens=5))   # 12 tokens: chunked
    with pytest.raises(RuntimeError, match="planted"):
        sch.step()
    assert {id(h) for h in sch.drain()} == {id(a), id(b), id(c)}
    assert sch.idle
    d = sch.submit(PROMPTS[0], SamplingParams(max_tokens=12))
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.target_copy, 4))
    assert d.result is not None and d.result.token_ids == alone.generate(
        [PROMPTS[0]], SamplingParams(max_tokens=12))[0].token_ids


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_arrivals_taken_in_at_schedule_join_before_the_running_rows_step(
        tiny_models: TinyModels, kind: str, temperature: float) -> None:
    """Requests that arrive while a step runs are taken in by ``intake`` at the next
    ``schedule()`` (vLLM v1's engine core drains its queue before scheduling): they are
    prefilled first in that step, so their first token comes out before the step's
    speculative tokens, and every request's tokens and stats still equal it run alone."""
    want = _alone(tiny_models, kind, temperature)
    events: list[tuple[str, int]] = []
    streamed: list[list[int]] = [[] for _ in PROMPTS]
    handles: dict[int, object] = {}
    step = [0]

    def on_tokens(i: int):  # noqa: ANN202
        def cb(new: list[int]) -> None:
            events.append(("tokens", i))
            streamed[i].extend(new)
        return cb

    def intake() -> None:  # this step's arrivals, submitted as it is scheduled
        for i, t in enumerate(ARRIVE):
            if t <= step[0] and i not in handles:
                handles[i] = sch.submit(PROMPTS[i], _params(i, temperature),
                                        on_tokens=on_tokens(i))
                events.append(("submit", i))

    sch = Scheduler(SpecDecoder(tiny_models.target, _proposer(kind, tiny_models)), 4,
                    max_len=64, intake=intake)
    while len(handles) < len(PROMPTS) or not sch.idle:
        sch.step()
        events.append(("end", step[0]))
        step[0] += 1
    got = [(h.result.token_ids, h.result.stats) for _, h in sorted(handles.items())  # type: ignore[attr-defined]
           ]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1] for g in got] == [w[1] for w in want]
    assert streamed == [w[0] for w in want]
    # step 1: 3 and 4 arrive (0, 1, 2 running; 4 slots): the shorter prompt, 4's, takes the
    # slot and its first token goes out, then the step's speculative tokens (4's second ones
    # among them); 3 waits for a slot
    step1 = events[events.index(("end", 0)) + 1:events.index(("end", 1))]
    assert step1[:3] == [("submit", 3), ("submit", 4), ("tokens", 4)]
    assert set(step1[3:]) == {("tokens", 0), ("tokens", 1), ("tokens", 2), ("tokens", 4)}


@pytest.mark.parametrize("kind", ["none", "draft_same", "medusa", "eagle3"])
def test_newcomers_and_a_chunked_prompt_join_one_step_in_rows_of_their_own(
        tiny_models: TinyModels, kind: str) -> None:
    """Two groups join in one step: two short newcomers (one shares a running request's
    prompt) and a chunked prompt's last chunk; the plan puts them in the rows after the running
    one, each in a row of its own, and every request's tokens and stats equal it run alone."""
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[4], PROMPTS[1]]  # running, long, short, shared
    params = [SamplingParams(max_tokens=n, seed=7 + i) for i, n in enumerate([20, 9, 8, 12])]
    dec = SpecDecoder(tiny_models.target, _proposer(kind, tiny_models))
    want = [dec.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]
    sch = Scheduler(SpecDecoder(tiny_models.target, _proposer(kind, tiny_models)), 4,
                    max_len=64, prefill_chunk=4)
    plans = []
    handles = [sch.submit(prompts[0], params[0])]
    sch.step()
    handles.append(sch.submit(prompts[1], params[1]))  # 12 tokens: chunks of 4, 4, then 4
    sch.step()
    sch.step()
    handles += [sch.submit(p, q) for p, q in zip(prompts[2:], params[2:], strict=True)]
    plans.append(sch.schedule())
    plan = plans[0]
    assert [(handles.index(j.handle), j.row, j.fed) for j in plan.join] == [
        (2, 1, 0), (3, 2, 0), (1, 3, 8)]
    sch.update(plan, sch.runner.prefill(plan))
    sch.update(plan, sch.runner.decode(plan))
    sch.run_until_idle()
    got = [h.result for h in handles]
    assert [g.token_ids for g in got if g] == [w.token_ids for w in want]
    assert [g.stats for g in got if g] == [w.stats for w in want]


def test_stop_tokens_end_requests_in_flight_with_reason_stop(tiny_models: TinyModels) -> None:
    """end_id and stop_token_ids (taken from each request's own greedy output, so each stops
    mid-run) end a request at that token, not included, with finish reason "stop"; the others
    still end at max_tokens ("length"); every request's tokens equal it run alone."""
    dec = SpecDecoder(tiny_models.target, NgramProposer(4))
    free = [dec.generate([p], _params(i, 0.0))[0].token_ids for i, p in enumerate(PROMPTS)]

    def params(i: int) -> SamplingParams:
        out = free[i]
        if i % 3 == 0:   # end_id: the first token not in the first three
            return SamplingParams(max_tokens=MAX_TOKENS[i], end_id=next(
                t for t in out[3:] if t not in out[:3]))
        if i % 3 == 1:   # a stop token, after min_tokens 2 (its earlier occurrences pass)
            return SamplingParams(max_tokens=MAX_TOKENS[i], stop_token_ids=(out[-2],),
                                  min_tokens=2)
        return _params(i, 0.0)

    want = []
    for i, p in enumerate(PROMPTS):
        r = dec.generate([p], params(i))[0]
        want.append((r.token_ids, r.finish_reason))
    sch = Scheduler(SpecDecoder(tiny_models.target, NgramProposer(4)), 3, max_len=64)
    handles, step = {}, 0
    while len(handles) < len(PROMPTS) or not sch.idle:
        for i, t in enumerate(ARRIVE):
            if t == step:
                handles[i] = sch.submit(PROMPTS[i], params(i))
        sch.step()
        step += 1
    got = [(h.result.token_ids, h.result.finish_reason)  # type: ignore[union-attr]
           for _, h in sorted(handles.items())]
    assert got == want
    for i, (ids, reason) in enumerate(got):
        stop = params(i).stop_ids
        if stop:
            assert reason == "stop" and len(ids) < len(free[i])
            assert ids == free[i][:len(ids)] and free[i][len(ids)] in stop
        else:
            assert reason == "length" and ids == free[i]


def test_prefill_runs_on_its_own_threads_and_decode_on_the_models(
        tiny_models: TinyModels) -> None:
    """``prefill_threads`` 2: every target forward of phase 1 (newcomers' prompts, a chunk)
    runs on 2 torch threads, every decode step's on the 1 the process has, and the tokens are
    each request's own (chunk 4: a prompt of 12 is chunked)."""
    want = _alone(tiny_models, "draft_same", 0.0)
    dec = SpecDecoder(tiny_models.target, _proposer("draft_same", tiny_models))
    sch = Scheduler(dec, 3, max_len=64, prefill_chunk=4, prefill_threads=2)
    seen: dict[str, set[int]] = {"prefill": set(), "decode": set()}
    phase = ["prefill"]
    run, decode = dec.target.run, sch.runner.decode

    def counted_run(*a: object, **kw: object) -> object:
        seen[phase[0]].add(torch.get_num_threads())
        return run(*a, **kw)  # type: ignore[arg-type]

    def in_decode(plan: object) -> object:
        phase[0] = "decode"
        try:
            return decode(plan)  # type: ignore[arg-type]
        finally:
            phase[0] = "prefill"

    dec.target.run = counted_run  # type: ignore[method-assign]
    sch.runner.decode = in_decode  # type: ignore[method-assign]
    try:
        handles = [sch.submit(p, _params(i, 0.0)) for i, p in enumerate(PROMPTS)]
        sch.run_until_idle()
    finally:
        del dec.target.run
    assert seen == {"prefill": {2}, "decode": {1}}
    assert torch.get_num_threads() == 1
    assert [h.result.token_ids for h in handles if h.result] == [w[0] for w in want]


def test_a_burst_of_uneven_prompts_is_not_padded_to_its_longest(
        tiny_models: TinyModels) -> None:
    """Prompts of 3, 2, 3 and 30 tokens join in one step (budget 64): the short ones share a
    forward and the long one runs in its own, so the step's prefill forwards run at most 1.25x
    the 38 prompt tokens (one padded forward ran 4 x 30 = 120); each answer is its own."""
    prompts = [[5, 6, 7], [20, 21], [30, 31, 32], [(9 * i) % 200 + 3 for i in range(30)]]
    dec = SpecDecoder(tiny_models.target)
    sch = Scheduler(dec, 4, max_len=64, prefill_chunk=64)
    shapes: list[tuple[int, int]] = []
    run = dec.target.run

    def counted_run(tokens: torch.Tensor, *a: object, **kw: object) -> object:
        shapes.append((tokens.shape[0], tokens.shape[1]))  # [B, T] of every target forward
        return run(tokens, *a, **kw)  # type: ignore[arg-type]

    dec.target.run = counted_run  # type: ignore[method-assign]
    try:
        handles = [sch.submit(p, SamplingParams(max_tokens=4)) for p in prompts]
        sch.step()
    finally:
        del dec.target.run
    prefill = [b * t for b, t in shapes if t > 1]
    assert len(prefill) == 2 and sum(prefill) <= 1.25 * sum(map(len, prompts)), shapes
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert [h.result.token_ids for h in handles if h.result] == [
        alone.generate([p], SamplingParams(max_tokens=4))[0].token_ids for p in prompts]


def test_a_steps_shortest_prompts_get_their_first_tokens_first(tiny_models: TinyModels) -> None:
    """A 30-token prompt submitted before two 3-token ones, all joining in one step (budget
    64): the short ones are prefilled first and their first tokens go out before the long
    prompt's forward runs; the answers are each request's own."""
    dec = SpecDecoder(tiny_models.target)
    sch = Scheduler(dec, 4, max_len=64, prefill_chunk=64)
    events: list[str] = []
    run = dec.target.run

    def counted_run(tokens: torch.Tensor, *a: object, **kw: object) -> object:
        events.append(f"forward {tokens.shape[1]}")
        return run(tokens, *a, **kw)  # type: ignore[arg-type]

    prompts = [[(9 * i) % 200 + 3 for i in range(30)], [5, 6, 7], [20, 21, 22]]
    p = SamplingParams(max_tokens=4)
    dec.target.run = counted_run  # type: ignore[method-assign]
    try:
        handles = [sch.submit(x, p, on_tokens=lambda t, i=i: events.append(f"tokens {i}"))
                   for i, x in enumerate(prompts)]
        sch.step()
    finally:
        del dec.target.run
    assert events[:5] == ["forward 3", "tokens 1", "tokens 2", "forward 30", "tokens 0"], events
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert [h.result.token_ids for h in handles if h.result] == [
        alone.generate([x], p)[0].token_ids for x in prompts]


def test_with_no_row_running_a_burst_joins_at_once(tiny_models: TinyModels) -> None:
    """prefill_chunk 12, nothing running: the 7-, 2-, 9- and 4-token prompts of a burst all
    join in the first step (no running row waits on that prefill); the same burst beside a
    running request is spread over five steps (the test above)."""
    sch = Scheduler(SpecDecoder(tiny_models.target), 6, max_len=64, prefill_chunk=12)
    burst = [sch.submit(p, SamplingParams(max_tokens=6))
             for p in ([5, 6, 7, 8, 9, 10, 11], [20, 21], [9] * 9, [7, 100, 7, 100])]
    sch.step()
    assert [h.row is not None for h in burst] == [True] * 4


def test_a_burst_on_an_idle_engine_is_prefilled_before_any_decode(
        tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    """prefill_chunk 4 and one 4-token forward a step: three 3-token prompts arriving at an
    idle engine join one a step, and the first decode comes with the last of them (the rows
    that joined hold their first token only, so nothing generating waits: the wait bound is
    IDLE_PREFILL_TOKENS, not the 4 a generating row would allow)."""
    import specserve.runtime.scheduler as scheduler
    monkeypatch.setattr(scheduler, "GROUP_TOKENS", 4)
    sch = Scheduler(SpecDecoder(tiny_models.target), 6, max_len=64, prefill_chunk=4)
    prompts = [[5, 6, 7], [20, 21, 22], [30, 31, 32]]
    hs = [sch.submit(p, SamplingParams(max_tokens=6)) for p in prompts]
    counts = []
    for _ in range(3):
        sch.step()
        counts.append([len(h.row.out[0]) if h.row else 0 for h in hs])
    assert counts == [[1, 0, 0], [1, 1, 0], [2, 2, 2]]
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert [h.result.token_ids for h in hs if h.result] == [
        alone.generate([p], SamplingParams(max_tokens=6))[0].token_ids for p in prompts]


def test_a_prompt_passed_over_pass_limit_times_goes_first(tiny_models: TinyModels) -> None:
    """Shortest first has a bound: a 10-token prompt waiting while two 6-token ones arrive
    every step (filling the budget of 12 between them) is passed over at each step, and joins
    at the step after the PASS_LIMIT-th, ahead of the shorter ones; its answer is its own."""
    from specserve.runtime.scheduler import PASS_LIMIT
    sch = Scheduler(SpecDecoder(tiny_models.target), 8, max_len=64, prefill_chunk=12)
    run = sch.submit([20, 21], SamplingParams(max_tokens=60))
    sch.step()
    long = sch.submit([9] * 10, SamplingParams(max_tokens=3))
    joined_at = None
    for step in range(1, PASS_LIMIT + 3):
        for base in (30, 40):  # two short prompts, one token each: they leave at once
            sch.submit([base + step % 7] * 6, SamplingParams(max_tokens=1))
        sch.step()
        if long.row is not None and joined_at is None:
            joined_at = step
    assert joined_at == PASS_LIMIT + 1 and long.passed == PASS_LIMIT
    assert run.result is None  # still running: every step had a running row (budget 12)
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert long.result is not None and long.result.token_ids == alone.generate(
        [[9] * 10], SamplingParams(max_tokens=3))[0].token_ids


def test_a_steps_newcomers_are_prefilled_before_its_chunk(tiny_models: TinyModels) -> None:
    """A step with a long prompt's chunk and a newcomer: the newcomer's forward runs and its
    first token goes out before the chunk's forward (which gives no token), so a short
    prompt's first token does not wait on a long one's prefill."""
    dec = SpecDecoder(tiny_models.target)
    sch = Scheduler(dec, 4, max_len=64, prefill_chunk=4)
    run = dec.target.run
    events: list[str] = []

    def counted_run(tokens: torch.Tensor, *a: object, **kw: object) -> object:
        events.append(f"forward {tokens.shape[1]}")
        return run(tokens, *a, **kw)  # type: ignore[arg-type]

    sch.submit([20, 21], SamplingParams(max_tokens=20))
    sch.step()
    sch.submit(PROMPTS[2], SamplingParams(max_tokens=3))  # 12 tokens: chunks of 4
    sch.submit([5, 6, 7], SamplingParams(max_tokens=3),
               on_tokens=lambda t: events.append("tokens short"))
    dec.target.run = counted_run  # type: ignore[method-assign]
    try:
        sch.step()
    finally:
        del dec.target.run
    assert events[:3] == ["forward 3", "tokens short", "forward 4"], events


def test_looking_at_waiting_prompts_leaves_the_prefix_cache_hit_rate_alone(
        tiny_models: TinyModels) -> None:
    """Ordering the waiting requests looks up their cached prefixes at every step; only the
    lookups of requests that join count in the prefix cache's hit rate: a prompt of 3 blocks
    waiting two steps for a slot is counted once (2 blocks looked up: its last is prefilled)."""
    sch = Scheduler(SpecDecoder(tiny_models.target), 1, max_len=64,
                    prefix_cache_bytes=1 << 20, block_size=4)
    sch.submit([20, 21], SamplingParams(max_tokens=3))
    sch.step()
    sch.submit(list(range(30, 42)), SamplingParams(max_tokens=2))
    sch.run_until_idle()
    assert sch.kv is not None
    assert sch.kv.stats.queried == 2  # the first prompt has no full block before its last


def test_a_long_prompt_passed_over_by_later_long_ones_goes_first(
        tiny_models: TinyModels) -> None:
    """The bound holds among chunked prompts too: a 14-token prompt waits while 6-token ones
    (also over the limit of 4, so chunked) arrive and each starts its chunked prefill ahead of
    it, shortest first; each start passes it over, and after PASS_LIMIT of them it starts."""
    from specserve.runtime.scheduler import PASS_LIMIT
    sch = Scheduler(SpecDecoder(tiny_models.target), 8, max_len=64, prefill_chunk=4)
    sch.submit([20, 21], SamplingParams(max_tokens=60))
    sch.step()
    long = sch.submit([9] * 14, SamplingParams(max_tokens=2))
    started_at = None
    for step in range(1, 4 * PASS_LIMIT):
        sch.submit([30 + step % 50] * 6, SamplingParams(max_tokens=1))
        sch.step()
        if long.admitted_ns and started_at is None:
            started_at = step
    assert started_at is not None and long.passed == PASS_LIMIT, (started_at, long.passed)
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target)
    assert long.result is not None and long.result.token_ids == alone.generate(
        [[9] * 14], SamplingParams(max_tokens=2))[0].token_ids


def test_with_every_slot_taken_the_waiting_prompts_are_not_looked_up(
        tiny_models: TinyModels) -> None:
    """Ordering costs nothing while no slot is free: three waiting prompts, one slot held by a
    running request, no prefix-cache lookup in the steps until it leaves; then they join."""
    sch = Scheduler(SpecDecoder(tiny_models.target), 1, max_len=64,
                    prefix_cache_bytes=1 << 20, block_size=4)
    run = sch.submit([20, 21], SamplingParams(max_tokens=4))
    sch.step()
    waiting = [sch.submit(list(range(30 + i, 42 + i)), SamplingParams(max_tokens=2))
               for i in range(3)]
    assert sch.kv is not None
    looks, match = [], sch.kv.match
    sch.kv.match = lambda *a, **kw: looks.append(1) or match(*a, **kw)  # type: ignore[method-assign]
    while run.result is None:
        sch.step()
    assert looks == []  # every step so far was scheduled while the slot was held
    del sch.kv.match
    sch.run_until_idle()
    assert all(h.result is not None for h in waiting)


def test_a_leavers_blocks_are_stored_before_the_scheduler_is_idle(
        tiny_models: TinyModels) -> None:
    """With a prefix cache (blocks of 4): a request that finished leaves its generated blocks
    to store and its row to evict; the scheduler is not idle until a step has done that, so a
    serving loop does it before waiting for the next request, not in that request's first
    step (its time to first token)."""
    sch = Scheduler(SpecDecoder(tiny_models.target), 2, max_len=64,
                    prefix_cache_bytes=1 << 24, block_size=4)
    h = sch.submit([5, 6, 7, 8, 9, 10, 11, 12, 13], SamplingParams(max_tokens=12))
    while h.result is None:
        sch.step()
    assert sch.kv is not None and sch.kv.cached == 2  # the prompt's blocks only, so far
    assert not sch.idle
    assert sch.step()  # stores the generated blocks, evicts the row
    assert sch.kv.cached == 4 and sch.kv.in_use == 0
    assert sch.idle and not sch.step()
