"""The client's recount of ``accepted_prediction_tokens`` (specserve/client/prediction_usage.py)
equals what the engine reports, greedy, at c = 1: plain and n-gram engines (the n-gram
proposer's own drafts replayed where the prediction misses), the engine's draft cap and a
``num_draft_tokens`` cap of 4, predictions that are the output with an edit or garbage."""

from __future__ import annotations

import pytest
import torch

from specserve.client.prediction_usage import accepted_prediction_tokens
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.proposers import NgramProposer
from specserve.runtime.proposers.ngram import ngram_lookup
from tests.runtime.conftest import TinyModels
from tests.runtime.test_scheduler import PROMPTS

MAX = 40
K = 4


def _predictions(out: list[int], vocab: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(5)
    edited = out[:8] + [(out[8] + 1) % vocab] + out[8:20] + out[24:]  # changed, then cut
    return [tuple(edited), tuple(out), tuple(torch.randint(0, vocab, (30,), generator=g).tolist())]


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("engine", ["plain", "ngram"])
def test_recount_equals_the_engines_count(tiny_models: TinyModels, engine: str,
                                          chunk: int | None) -> None:
    target, vocab = tiny_models.target, tiny_models.target.cfg.vocab_size
    dec = SpecDecoder(target, NgramProposer(K) if engine == "ngram" else None)
    cap = 16 if chunk is None else chunk
    checked = 0
    for prompt in PROMPTS:
        out = SpecDecoder(target).generate([prompt], SamplingParams(max_tokens=MAX))[0].token_ids
        for pred in _predictions(out, vocab):
            res = dec.generate([prompt], SamplingParams(max_tokens=MAX, prediction=pred,
                                                        num_draft_tokens=chunk))[0]
            got = list(res.token_ids)
            assert got == out

            def ngram(at: int, got: list[int] = got, prompt: list[int] = prompt) -> list[int]:
                return ngram_lookup(prompt + got[:at], min(K, cap, MAX - at - 1))

            recount = accepted_prediction_tokens(got, pred, MAX, cap,
                                                 ngram if engine == "ngram" else None)
            assert res.accepted_prediction_tokens == recount, (prompt, pred)
            checked += recount > 0
    assert checked >= len(PROMPTS)  # the predictions were drafted from, not only missed
