"""The engine's draft-length policy (specserve.runtime.draft_policy) in the decoder: lossless
whatever k it picks (greedy tokens equal plain decoding's, alone and in flight); off where the
step cost says speculation cannot pay, on where it is free, with probe steps while off; seeded
sampled rows keep their configured k (the same text as the fixed decoder's for that seed); the
step-cost curve is measured on the model. Plants: a policy that ignores the curve (always
k_max) fails the compute-bound case; dropping the seed pin fails the seeded case; probes off
fail the probe count."""

from __future__ import annotations

import pytest
import torch

from specserve.runtime.batch import Batch
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.draft_policy import DraftLenPolicy, measure_step_cost, probe_rows
from specserve.runtime.proposers import DraftModelProposer, NgramProposer
from specserve.runtime.scheduler import Scheduler
from specserve.spec.draft_policy import StepCost
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [20, 21, 22, 20, 21], [9, 9, 9, 9], [3, 4, 3, 4, 3]]
FLAT = StepCost((1, 1024), (1.0, 1.0))
LINEAR = StepCost((1, 2, 1024), (1.0, 2.0, 1024.0))
MIXED = StepCost((1, 4, 8, 1024), (1.0, 1.2, 2.4, 300.0))  # k depends on alpha and batch


def _greedy(n: int = 24) -> SamplingParams:
    return SamplingParams(max_tokens=n)


@pytest.mark.parametrize("cost", [FLAT, LINEAR, MIXED], ids=["flat", "linear", "mixed"])
def test_greedy_tokens_equal_plain_decoding_whatever_k(tiny_models: TinyModels,
                                                       cost: StepCost) -> None:
    plain = SpecDecoder(tiny_models.target).generate(PROMPTS, _greedy())
    for prop in (NgramProposer(4), DraftModelProposer(tiny_models.target_copy, 4)):
        dec = SpecDecoder(tiny_models.target, prop, draft_policy=DraftLenPolicy(cost))
        got = dec.generate(PROMPTS, _greedy())
        assert [g.token_ids for g in got] == [p.token_ids for p in plain]


def test_in_flight_tokens_equal_and_rows_keep_their_acceptance(tiny_models: TinyModels) -> None:
    policy = DraftLenPolicy(MIXED)
    sch = Scheduler(SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.target_copy, 4),
                                draft_policy=policy), 3, max_len=64)
    handles = [sch.submit(p, _greedy(20)) for p in PROMPTS]
    sch.run_until_idle()
    plain = SpecDecoder(tiny_models.target).generate(PROMPTS, _greedy(20))
    assert [h.result.token_ids for h in handles if h.result] == [p.token_ids for p in plain]
    assert max(policy.steps_by_k) >= 2 and policy.alpha > 0.8  # the copy accepts everything


def test_a_row_in_flight_keeps_its_own_acceptance() -> None:
    """A step's batch over in-flight rows (Batch.detach) starts with empty stats: the policy
    reads each row's whole request from its history."""
    parts = [Batch([[1, 2]], [SamplingParams()], torch.device("cpu")) for _ in range(2)]
    for _ in range(20):
        parts[0].stats[0].observe(4, 4)
        parts[1].stats[0].observe(4, 0)
    st = Batch.detach(parts, None)
    policy = DraftLenPolicy(FLAT)
    good, bad = policy.row_alphas(st, [0, 1])
    assert good > 0.95 and bad < 0.1 and policy.alpha == 0.5


def test_compute_bound_turns_speculation_off(tiny_models: TinyModels) -> None:
    """Where even a draft sure to be accepted cannot pay, not one step drafts (no probes)."""
    policy = DraftLenPolicy(LINEAR)
    dec = SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.target_copy, 4),
                      draft_policy=policy)
    r = dec.generate(PROMPTS, _greedy(40))
    assert set(policy.steps_by_k) == {0}
    assert all(x.stats.plain_steps == x.stats.steps for x in r)


def test_a_poor_draft_is_turned_off_with_probes(tiny_models: TinyModels) -> None:
    """A random draft where drafting is free: off, but probed now and then."""
    policy = DraftLenPolicy(FLAT)
    dec = SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.draft, 4),
                      draft_policy=policy)
    dec.generate(PROMPTS, _greedy(60))
    assert policy.plain_share() > 0.6
    assert 0 < policy.steps_by_k[1] < policy.steps_by_k[0]  # probes


def test_memory_bound_drafts_the_most(tiny_models: TinyModels) -> None:
    policy = DraftLenPolicy(FLAT)
    dec = SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.target_copy, 4),
                      draft_policy=policy)
    dec.generate(PROMPTS, _greedy(40))
    assert policy.plain_share() == 0.0 and max(policy.steps_by_k) == 4


def test_seeded_sampled_rows_keep_the_configured_k(tiny_models: TinyModels) -> None:
    p = SamplingParams(max_tokens=30, temperature=0.9, seed=11)
    fixed = SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.draft, 4))
    adaptive = SpecDecoder(tiny_models.target, DraftModelProposer(tiny_models.draft, 4),
                           draft_policy=DraftLenPolicy(LINEAR))
    want = fixed.generate(PROMPTS, p)
    got = adaptive.generate(PROMPTS, p)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_the_step_cost_is_measured_on_the_model(tiny_models: TinyModels) -> None:
    rows = probe_rows(10)
    assert rows[0] == 1 and rows[-1] >= 10 and rows == sorted(rows)
    cost = measure_step_cost(tiny_models.target, rows, reps=1)
    assert cost.rows == tuple(rows) and all(s > 0 for s in cost.seconds)
    policy = DraftLenPolicy()
    dec = SpecDecoder(tiny_models.target, NgramProposer(3), draft_policy=policy)
    dec.generate(PROMPTS[:2], _greedy(8))
    assert policy.cost is not None and policy.cost.rows[-1] >= 2 * 4


def test_verify_checks_the_callers_drafts_as_given(tiny_models: TinyModels) -> None:
    """SpecDecoder.verify (TensorRT-LLM's draft_input_ids, the BLS loop): the caller chose the
    drafts, so the policy cuts none (here it would choose k = 0)."""
    from specserve.runtime.proposers import ExternalDraftProposer

    prompt = PROMPTS[0]
    plain = SpecDecoder(tiny_models.target).generate([prompt], _greedy(6))[0].token_ids
    dec = SpecDecoder(tiny_models.target, NgramProposer(4),
                      draft_policy=DraftLenPolicy(LINEAR))
    r = dec.verify([prompt], _greedy(6), ExternalDraftProposer([plain[:5]]))[0]
    assert r.token_ids == plain and r.stats.accepted_tokens == 5


def test_only_greedy_rows_are_cut_after_the_proposal() -> None:
    """Cutting a sampled row's chain by what its drafts turned out to be would bias rejection
    sampling; a greedy row may be cut to anything."""
    st = Batch([[1, 2], [3, 4]], [SamplingParams(), SamplingParams(temperature=0.8)],
               torch.device("cpu"))
    policy = DraftLenPolicy(LINEAR)
    assert policy.trim(st, [4, 0], [4, 4]) == [0, 4]


def test_overhead_is_per_width_and_never_smaller_for_a_wider_step() -> None:
    policy = DraftLenPolicy(FLAT)
    policy.overhead = {0: 0.1, 2: 0.5, 3: 0.2}
    assert policy.overheads(4) == [0.1, 0.1, 0.5, 0.5, 0.5]


def test_caution_grows_with_what_a_draft_costs() -> None:
    policy = DraftLenPolicy(StepCost((1, 2, 8, 16), (1.0, 1.05, 1.3, 2.6)))
    assert policy.caution(1) == pytest.approx(0.2)  # T(2)/T(1) = 1.05: a twentieth of a step
    assert policy.caution(8) == 1.0  # T(16)/T(8) = 2: fully one standard error low


def test_a_probe_ends_with_its_step() -> None:
    """The step after a probe, where no probe is due, drafts nothing (trim does not force k)."""
    st = Batch([[1, 2]], [SamplingParams()], torch.device("cpu"))
    policy = DraftLenPolicy(LINEAR)
    policy._probing = 1  # the previous step was a probe
    assert policy.plan(st, [4]) == [0]
    assert policy.trim(st, [4], [4]) == [0]


def test_a_catch_up_is_not_a_cost_of_every_draft_and_it_gates_probes() -> None:
    """A proposal that first caught up on 100 positions of backlog (EAGLE-3's head after a run
    of k = 0): its catch-up seconds are learnt per position, not charged to its one draft; a
    probe that would pay such a catch-up again where even an accepted draft could not repay
    it is not made, while one with a small backlog is. Plant: charging the catch-up to
    draft_s fails the first assert; ignoring the backlog in plan fails the last."""
    cost = StepCost((1, 2, 1024), (1.0, 1.05, 1024.0))  # a draft's verify costs 5% more
    st = Batch([[1, 2]], [SamplingParams()], torch.device("cpu"))
    policy = DraftLenPolicy(cost)
    policy.plan(st, [4], backlog=100)
    policy.observe(st, [(0, 0)], 1, 1, 1, propose_s=0.51, verify_s=1.05, catch_up_s=0.5)
    assert policy.draft_s == pytest.approx(0.005)  # (0.51 - 0.5) / 1 draft, EWMA from 0
    assert policy.catch_s == pytest.approx(0.0025)  # 0.5 / 100 positions, EWMA from 0
    gap = DraftLenPolicy.PROBE_GAPS[0]

    def probes(backlog: int) -> int:
        policy._zeros, policy._gap = gap - 1, 0  # a probe is due this step
        policy.acc, policy.rej = 0.0, 50.0  # drafts never accepted: k = 0 by the estimates
        return policy.plan(st, [4], backlog)[0]

    assert probes(10) == 1  # 0.025 s of catch-up: a sure draft still pays
    assert probes(400) == 0  # 1.0 s of catch-up: not even a sure draft repays it


def test_acceptance_is_counted_by_depth() -> None:
    """A chain of 4 with 1 accepted reached depths 1 and 2 and accepted depth 1; a chain of 2
    with 2 accepted reached and accepted both. Depth 1's rate (2 / 2) is above the mean, depth
    2's (1 / 2) below it, each shrunk towards the mean. Plant: counting every drafted depth as
    reached (not only those after accepted drafts) fails the counts."""
    st = Batch([[1, 2], [3, 4]], [SamplingParams(), SamplingParams()], torch.device("cpu"))
    policy = DraftLenPolicy(FLAT)
    st.stats[0].observe(4, 1)
    st.stats[1].observe(2, 2)
    policy.observe(st, [(0, 0), (0, 0)], 2, 4, 4, 0.0, 1.0, chains=[4, 2])
    assert policy.reach == [2.0, 2.0, 0.0, 0.0] and policy.hit == [2.0, 1.0, 0.0, 0.0]
    a, w = policy.alpha, policy.DEPTH_WEIGHT
    assert policy.depth_scale() == pytest.approx(
        [(2 + w * a) / (2 + w) / a, (1 + w * a) / (2 + w) / a, 1.0, 1.0])


def test_one_slow_first_step_at_a_width_moves_its_overhead_as_any_step_does() -> None:
    """A width's first step starts from the narrower widths' overhead: one slow first step
    (a cold code path) does not set it (seeded by it, width 4 of an n-gram engine stayed at
    12 ms against 2-3 at widths 1-3 and was never chosen again). Plant: seeding from the
    first step fails."""
    st = Batch([[1, 2]], [SamplingParams()], torch.device("cpu"))
    policy = DraftLenPolicy(FLAT)
    policy.overhead = {0: 0.0, 3: 0.002}
    policy.observe(st, [(0, 0)], 1, 4, 4, 0.0, 1.0 + 0.1)  # 0.1 s beyond T
    assert policy.overhead[4] == pytest.approx(0.002 + DraftLenPolicy.EWMA * (0.1 - 0.002))
