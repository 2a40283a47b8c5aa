"""The client's recount of accepted_prediction_tokens (specserve/client/prediction_usage.py):
its lookup is the engine's (random sequences over a small vocabulary, so matches are common),
and the replay of steps counts what hand-worked examples say (a perfect prediction, an edit, a
miss, the n-gram fallback's steps, the draft cap)."""

from __future__ import annotations

import random

import pytest

from specserve.client.prediction_usage import accepted_prediction_tokens, agreed, lookup
from specserve.runtime.proposers.prediction import prediction_drafts


@pytest.mark.parametrize("seed", range(4))
def test_the_lookup_is_the_engines(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        pred = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        out = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        k = rng.randrange(0, 18)
        assert lookup(out, pred, k) == prediction_drafts(out, pred, k)


def test_agreed_counts_the_common_run() -> None:
    assert agreed([5, 6, 7], [1, 5, 6, 9], 1) == 2
    assert agreed([5, 6], [1, 5], 1) == 1  # the output ends
    assert agreed([], [1, 2], 0) == 0


def test_a_perfect_prediction_loses_the_prefill_token_and_one_per_step() -> None:
    pred = list(range(100, 120))  # 20 tokens, the output is the same
    # prefill emits 100; step 1 drafts 16 (101..116), all kept, +117; step 2 drafts 118, 119
    assert accepted_prediction_tokens(pred, pred, max_tokens=64) == 18
    # 4 drafts a step: steps at 1, 6, 11 (4 kept + 1 each), then 116..119 drafted and kept
    assert accepted_prediction_tokens(pred, pred, max_tokens=64, max_draft=4) == 16


def test_an_edit_breaks_the_run_and_the_lookup_resumes() -> None:
    pred = list(range(100, 130))
    out = pred[:10] + [7] + pred[10:]  # one token inserted after 109
    # prefill 100; step drafts 101..116: 9 kept (101..109), the target emits 7; outputs
    # ending "108 109 7", "109 7 110", "7 110 111" miss (no 3-token suffix in the prediction):
    # plain steps emit 110, 111, 112; "110 111 112" matches: 113..128 drafted, all 16 kept.
    assert accepted_prediction_tokens(out, pred, max_tokens=64) == 9 + 16


def test_a_miss_counts_nothing_and_the_fallback_moves_the_steps() -> None:
    pred = list(range(100, 120))
    assert accepted_prediction_tokens([1, 2, 3, 4], pred, max_tokens=64) == 0
    out = [1, 2, 3] + pred  # three tokens off the prediction, then the prediction
    plain = accepted_prediction_tokens(out, pred, max_tokens=64)
    # plain: misses until "100 101 102" (position 6), then 103..118 drafted and kept
    # an engine proposer that drafts 7 tokens at position 1 moves the steps: the prediction
    # takes over at position 9 (7 drafts + the target's 105), with 106..119 left
    fallback = accepted_prediction_tokens(out, pred, max_tokens=64,
                                          fallback=lambda at: out[at:at + 7] if at == 1 else [])
    assert (plain, fallback) == (16, 14)


def test_max_tokens_caps_the_drafts() -> None:
    pred = list(range(100, 140))
    assert accepted_prediction_tokens(pred[:10], pred, max_tokens=10) == 8
    assert accepted_prediction_tokens([], pred, max_tokens=10) == 0
