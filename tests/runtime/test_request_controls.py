"""Per-request speculation control: ``SamplingParams.num_draft_tokens``, the
semantics of tensorrtllm_backend's BLS input of that name (0 = no speculation for this request,
k = at most k drafts per step, None = the engine's).

One in-flight batch mixes capped, uncapped and speculation-off rows, for every method (draft
model, n-gram, Medusa tree, EAGLE-3 chain and tree). Greedy: every row equals plain decoding.
Sampled (T = 0.9, seeded): a row with speculation off equals plain sampling token for token (it
takes exactly the plain path: no draft randomness is drawn for it). Stats count only what was
drafted: nothing for an off row, at most k per step for a capped one. A capped row makes a tree
proposer verify its top-1 chain for that step (``ProposalRequest.chain_only``)."""

from __future__ import annotations

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.params import MAX_RETURN_SEQUENCES, expand_n
from specserve.runtime.scheduler import Scheduler
from tests.runtime.conftest import TinyModels
from tests.runtime.test_scheduler import PROMPTS, _proposer

torch.set_num_threads(1)

KINDS = ["draft_same", "draft_random", "ngram", "medusa", "eagle3", "eagle3_tree"]
CAPS = [None, 0, 1, 2, None, 0, 1]          # per request of PROMPTS
MAX_TOKENS = [20, 9, 15, 24, 5, 18, 12]


def _params(i: int, temperature: float) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS[i], temperature=temperature, seed=7 + i,
                          num_draft_tokens=CAPS[i])


def _batched(m: TinyModels, kind: str, temperature: float) -> list:
    sch = Scheduler(SpecDecoder(m.target, _proposer(kind, m)), capacity=4, max_len=64)
    handles = [sch.submit(p, _params(i, temperature)) for i, p in enumerate(PROMPTS)]
    sch.run_until_idle()
    return [h.result for h in handles]


def _plain(m: TinyModels, temperature: float) -> list[list[int]]:
    dec = SpecDecoder(m.target)
    return [dec.generate([p], _params(i, temperature))[0].token_ids
            for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_rows_equal_plain_decoding_whatever_their_cap(tiny_models: TinyModels,
                                                            kind: str) -> None:
    got = _batched(tiny_models, kind, 0.0)
    assert [r.token_ids for r in got] == _plain(tiny_models, 0.0)
    for r, cap in zip(got, CAPS, strict=True):
        s = r.stats
        if cap == 0:
            assert s.draft_tokens == 0 and s.accepted_tokens == 0
        elif cap is not None:
            assert len(s.per_position_drafted) <= cap      # never drafted past the cap
    uncapped = sum(r.stats.draft_tokens for r, c in zip(got, CAPS, strict=True) if c is None)
    assert uncapped > 0                                    # the others did speculate


@pytest.mark.parametrize("kind", KINDS)
def test_a_sampled_row_with_speculation_off_is_plain_sampling(tiny_models: TinyModels,
                                                             kind: str) -> None:
    got = _batched(tiny_models, kind, 0.9)
    plain = _plain(tiny_models, 0.9)
    for i, cap in enumerate(CAPS):
        if cap == 0:
            assert got[i].token_ids == plain[i]
            assert got[i].stats.draft_tokens == 0


def test_a_capped_row_turns_a_tree_into_its_chain(tiny_models: TinyModels) -> None:
    """Medusa tree (7 nodes, depth 3): alone, an uncapped greedy row verifies the whole tree
    (7 drafted per step); next to a row capped at 1 its steps verify the top-1 chain (at most
    3 per step), and its tokens do not change."""
    dec = SpecDecoder(tiny_models.target, _proposer("medusa", tiny_models))
    free = SamplingParams(max_tokens=12)
    alone = dec.generate([PROMPTS[0]], free)[0]
    assert alone.stats.draft_tokens == 7 * alone.stats.steps
    mixed = dec.generate([PROMPTS[0], PROMPTS[2]],
                         [free, SamplingParams(max_tokens=12, num_draft_tokens=1)])
    assert mixed[0].token_ids == alone.token_ids
    assert mixed[0].stats.draft_tokens <= 3 * mixed[0].stats.steps
    assert len(mixed[1].stats.per_position_drafted) <= 1


def test_bad_values_are_refused() -> None:
    with pytest.raises(SpecserveError, match="num_draft_tokens must be >= 0"):
        SamplingParams(num_draft_tokens=-1).validate()


@pytest.mark.parametrize("kind", ["draft_random", "ngram", "medusa", "eagle3"])
def test_n_sequences_are_independent_requests(tiny_models: TinyModels, kind: str) -> None:
    """n = 4 sampled sequences of one prompt next to another request: sequence i equals the
    prompt run alone with seed + i (its own row, proposer state and generator); each has its
    own finish reason (that of the sequence run alone)."""
    base = SamplingParams(max_tokens=16, temperature=1.0, seed=40, end_id=7,
                          num_draft_tokens=None)
    seqs = expand_n(base, 4)
    assert [p.seed for p in seqs] == [40, 41, 42, 43]
    sch = Scheduler(SpecDecoder(tiny_models.target, _proposer(kind, tiny_models)), 3, 64)
    other = sch.submit(PROMPTS[2], _params(2, 0.9))
    hs = [sch.submit(PROMPTS[0], p) for p in seqs]
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target, _proposer(kind, tiny_models))
    for h, p in zip(hs, seqs, strict=True):
        want = alone.generate([PROMPTS[0]], p)[0]
        assert h.result is not None and h.result.token_ids == want.token_ids
        assert h.result.finish_reason == want.finish_reason
    assert len({tuple(h.result.token_ids) for h in hs if h.result}) > 1  # they differ
    assert other.result is not None


def test_n_above_the_limit_is_refused() -> None:
    with pytest.raises(SpecserveError, match=r"n \(num_return_sequences\) must be in \[1, 16\]"):
        expand_n(SamplingParams(), MAX_RETURN_SEQUENCES + 1)
    with pytest.raises(SpecserveError, match="got 0"):
        expand_n(SamplingParams(), 0)
