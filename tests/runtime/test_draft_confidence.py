"""Draft chains that end at an unsure draft (``DraftModelProposer.min_confidence``, HF's
``assistant_confidence_threshold``): still lossless at temperature 0, and the stop rule cuts
exactly the chains it should."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.loader import build_decoder
from specserve.runtime.proposers import DraftModelProposer
from tests.helpers.tiny import TinyCheckpoint
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38], [7, 100]]
GREEDY = SamplingParams(max_tokens=20)  # EOS off


@pytest.fixture(scope="module")
def reference(tiny_models: TinyModels) -> list[list[int]]:
    dec = SpecDecoder(tiny_models.target)
    return [dec.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("threshold", [0.0, 0.01, 1.01])
def test_confidence_stop_stays_exact(tiny_models: TinyModels, reference: list[list[int]],
                                     threshold: float) -> None:
    draft = DraftModelProposer(tiny_models.target_copy, max_draft_len=5)
    draft.min_confidence = threshold
    out = SpecDecoder(tiny_models.target, draft).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == reference
    drafted, steps = sum(o.stats.draft_tokens for o in out), sum(o.stats.steps for o in out)
    if threshold > 1:  # every draft is "unsure": chains of one
        assert drafted <= steps
    elif threshold == 0:  # no stop: K per step except where max_tokens cuts the chain
        assert drafted > 3 * steps


def test_stop_unsure_cuts_only_unsure_rows(tiny_models: TinyModels) -> None:
    draft = DraftModelProposer(tiny_models.target_copy, max_draft_len=4)
    draft.min_confidence = 0.5
    vocab = tiny_models.target.cfg.vocab_size
    logits = torch.zeros(3, vocab)
    logits[0, 7] = 50.0  # row 0: p(7) ~ 1 (sure); row 1: uniform (unsure); row 2: already ended
    tok = logits.argmax(dim=-1)
    counts = [4, 4, 1]
    assert not draft._stop_unsure(logits, tok, 1, counts)
    assert counts == [4, 2, 1]
    assert draft._stop_unsure(logits, tok, 3, counts)  # row 0 reaches its limit: all ended
    assert counts == [4, 2, 1]


def test_build_decoder_draft_dtype_and_confidence_stay_exact(tiny_ckpt: TinyCheckpoint) -> None:
    plain = build_decoder(tiny_ckpt.target)
    ref = [plain.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    dec = build_decoder(tiny_ckpt.target, draft_dir=tiny_ckpt.draft, max_draft_len=6,
                        draft_min_confidence=0.01, draft_dtype="bfloat16")
    assert isinstance(dec.proposer, DraftModelProposer)
    assert dec.proposer.model.dtype == torch.bfloat16 and dec.target.dtype == torch.float32
    assert dec.proposer.min_confidence == 0.01
    assert [o.token_ids for o in dec.generate(PROMPTS, GREEDY)] == ref


@pytest.mark.parametrize("kw", [{"draft_min_confidence": 1.5}, {"draft_dtype": "int8"}])
def test_build_decoder_rejects_bad_draft_options(tiny_ckpt: TinyCheckpoint,
                                                 kw: dict[str, Any]) -> None:
    with pytest.raises(SpecserveError):
        build_decoder(tiny_ckpt.target, draft_dir=tiny_ckpt.draft, **kw)


def test_sampled_rows_do_not_depend_on_the_batch(tiny_models: TinyModels) -> None:
    """Temperature 1, seeded: with chains cut by the confidence stop, a row's output is the same
    alone and in a batch (no randomness is drawn for drafts past its own stop). 0.004 splits
    this tiny model's sampled drafts (probabilities ~0.002-0.007), so rows stop at different
    drafts (drawing past the stop, the batch run differs: checked)."""
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7)

    def run(prompts: list[list[int]]) -> list[list[int]]:
        draft = DraftModelProposer(tiny_models.target_copy, max_draft_len=5)
        draft.min_confidence = 0.004
        dec = SpecDecoder(tiny_models.target, draft)
        return [o.token_ids for o in dec.generate(prompts, [params] * len(prompts))]

    alone = run(PROMPTS[:1])[0]
    assert run(PROMPTS)[0] == alone
