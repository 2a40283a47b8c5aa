"""Rows whose draft the grammar fills get no proposer drafts, and grammar drafts are not the
proposer's acceptance (:mod:`specserve.runtime.forced_drafts`, ``ForcedDrafts.cover``;
:mod:`specserve.runtime.draft_policy`).

- Real proposers (n-gram, EAGLE-3) that record every call: no call asks drafts of a guided row
  whose grammar chain (forced and jump tokens, :func:`merge_row` without proposer drafts) is at
  least its limit long, while an unguided row in the same batch keeps drafting; with guided
  rows only, steps where every row is covered run no proposer at all; without the skip, the
  same runs ask for those rows. Output equals plain guided decoding token for token.
- EAGLE-3 after skipped steps: its drafts after a context equal those of a run that never
  skipped (the head caught up on the skipped positions through the k = 0 path).
- The draft-length policy measures the proposer's drafts only: its engine-wide counts equal
  the proposer's own verdicts (accepted grammar drafts left out), and a row whose accepted
  drafts were all the grammar's keeps the prior rate.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specserve.runtime.batch import Batch
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.draft_policy import DraftLenPolicy
from specserve.runtime.forced_drafts import ForcedDrafts, merge_row
from specserve.runtime.grammar import CompiledGuide
from specserve.runtime.proposers import ChainProposal, NgramProposer
from specserve.runtime.proposers.eagle3 import Eagle3Proposer
from tests.runtime.conftest import TinyModels, json_guide
from tests.runtime.test_draft_policy import FLAT
from tests.runtime.test_forced_drafts import SCHEMA, _params
from tests.runtime.test_scheduler import PROMPTS

torch.set_num_threads(1)

@pytest.fixture(scope="module")
def grammar(tiny_models: TinyModels, tok: Any) -> CompiledGuide:
    compiled: CompiledGuide = json_guide(tiny_models, tok, SCHEMA)
    return compiled


Call = tuple[list[list[int]], list[int], torch.Tensor]  # seqs, limits, drafts [B, k]


class _Recording:
    """Mixin for a real proposer: every ``propose`` call's sequences, limits and drafts."""

    calls: list[Call]

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        out: ChainProposal = super().propose(seqs, limits, params, generators)  # type: ignore[misc]
        self.calls.append(([list(s) for s in seqs], list(limits), out.tokens.clone()))
        return out


class RecordingNgram(_Recording, NgramProposer):
    def __init__(self, k: int) -> None:
        super().__init__(max_draft_len=k)
        self.calls = []


class RecordingEagle3(_Recording, Eagle3Proposer):
    def __init__(self, m: TinyModels, k: int) -> None:
        from tests.runtime.test_eagle3 import random_head

        super().__init__(random_head(m.target, seed=4, scale=0.05), max_draft_len=k)
        self.calls = []


def _covered(guide: CompiledGuide, stops: list[int], out: list[int], limit: int) -> bool:
    """The grammar's chain after ``out`` alone fills ``limit`` drafts."""
    m = guide.matcher(stops)
    for t in out:
        m.accept(t)
    return len(merge_row(m, [], limit).tokens) >= limit


def _asked_of_covered(calls: list[Call], rows: dict[int, int], guide: CompiledGuide,
                      stops: list[int]) -> tuple[int, int]:
    """(covered, uncovered) guided rows that a call asked drafts of; ``rows``: guided row ->
    its prompt's length."""
    covered = uncovered = 0
    for seqs, limits, _ in calls:
        for b, n in rows.items():
            if limits[b] > 0:
                if _covered(guide, stops, seqs[b][n:], limits[b]):
                    covered += 1
                else:
                    uncovered += 1
    return covered, uncovered


@pytest.mark.parametrize("kind", ["ngram", "eagle3"])
def test_no_drafts_are_asked_of_rows_the_grammar_covers(tiny_models: TinyModels, tok: Any,
                                                        grammar: CompiledGuide,
                                                        kind: str) -> None:
    p, stops = _params(tok, grammar), [tok.eos_token_id]
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[5]]  # two guided rows, one unguided (last)
    params = [p, p, SamplingParams(max_tokens=40)]
    plain = SpecDecoder(tiny_models.target)
    want = [plain.generate([q], r)[0].token_ids for q, r in zip(prompts, params, strict=True)]
    asked: dict[bool, tuple[int, int]] = {}
    for skip in (True, False):
        prop = RecordingNgram(2) if kind == "ngram" else RecordingEagle3(tiny_models, 2)
        dec = SpecDecoder(tiny_models.target, prop, forced=ForcedDrafts(skip_covered=skip))
        got = [r.token_ids for r in dec.generate(prompts, params)]
        assert got == want
        rows = {0: len(prompts[0]), 1: len(prompts[1])}
        asked[skip] = _asked_of_covered(prop.calls, rows, grammar, stops)
        assert asked[skip][1] > 0  # the rows still draft where the grammar does not cover
        assert any(lim[2] > 0 for _, lim, _ in prop.calls)  # the unguided row drafts
    assert asked[True][0] == 0 and asked[False][0] > 0  # without the skip: asked, and wasted


def test_the_proposer_is_not_run_on_steps_the_grammar_covers(
        tiny_models: TinyModels, tok: Any, grammar: CompiledGuide) -> None:
    p = _params(tok, grammar)
    want = SpecDecoder(tiny_models.target).generate([PROMPTS[0]], p)[0].token_ids
    prop = RecordingNgram(2)
    dec = SpecDecoder(tiny_models.target, prop, forced=ForcedDrafts())
    (res,) = dec.generate([PROMPTS[0]], p)
    assert res.token_ids == want
    assert 0 < len(prop.calls) <= res.stats.steps - 3  # steps with the grammar's drafts only


def test_eagle3_catches_up_on_the_steps_it_skipped(tiny_models: TinyModels, tok: Any,
                                                   grammar: CompiledGuide) -> None:
    """The head's drafts after a context do not depend on the steps it skipped before."""
    p = _params(tok, grammar)
    drafts: dict[bool, dict[tuple[int, ...], list[int]]] = {}
    for skip in (True, False):
        prop = RecordingEagle3(tiny_models, 3)
        dec = SpecDecoder(tiny_models.target, prop, forced=ForcedDrafts(skip_covered=skip))
        dec.generate([PROMPTS[0]], p)
        drafts[skip] = {tuple(seqs[0]): d[0, :lim[0]].tolist() for seqs, lim, d in prop.calls
                        if lim[0] == 3}
    both = drafts[True].keys() & drafts[False].keys()
    assert len(drafts[True]) < len(drafts[False])
    assert any(_after_a_skip(c, drafts[True], drafts[False]) for c in both)
    assert all(drafts[True][c] == drafts[False][c] for c in both)


def _after_a_skip(c: tuple[int, ...], skipping: Any, running: Any) -> bool:
    """Context ``c``'s proposal in the skipping run came after a step that the other run
    proposed for and it skipped (the head caught up on that step's positions)."""
    def prev(calls: Any) -> int:
        return max((len(x) for x in calls if len(x) < len(c)), default=-1)

    return prev(skipping) < prev(running)


class _Undecayed(DraftLenPolicy):
    DECAY = 1.0  # the engine-wide counts are plain sums


def test_the_policy_counts_the_proposers_drafts_only(tiny_models: TinyModels, tok: Any,
                                                     grammar: CompiledGuide) -> None:
    policy = _Undecayed(FLAT)
    dec = SpecDecoder(tiny_models.target, NgramProposer(max_draft_len=4), draft_policy=policy,
                      forced=ForcedDrafts())
    res = dec.generate([PROMPTS[0], PROMPTS[2]], _params(tok, grammar))
    own = [r.stats.own_verdicts() for r in res]
    assert sum(r.accepted_forced_tokens for r in res) > 20  # grammar drafts were verified
    assert sum(r.stats.accepted_tokens for r in res) > sum(a for a, _ in own) + 20
    assert (policy.acc, policy.rej) == (2.0 + sum(a for a, _ in own),
                                        2.0 + sum(r for _, r in own))


def test_a_row_whose_accepted_drafts_were_the_grammars_keeps_the_prior() -> None:
    """In flight (Batch.detach: the row's request in its history): 20 steps that accepted 4
    grammar drafts each, none of the proposer's, are no evidence for the proposer."""
    part = Batch([[1, 2]], [SamplingParams()], torch.device("cpu"))
    for _ in range(20):
        part.stats[0].observe(4, 4)
        part.stats[0].observe_foreign(range(4), 4, 4)
    st = Batch.detach([part], None)
    (alpha,) = DraftLenPolicy(FLAT).row_alphas(st, [0])
    assert alpha == pytest.approx(0.5)  # the prior (FLAT: no caution)
