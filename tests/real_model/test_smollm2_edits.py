"""Predicted Outputs on the real model (SmolLM2-135M-Instruct, ``make real-model``) with the
code-edit set (specserve/client/code_edits.py, standard-library records): greedy with the
unedited code as the prediction equals plain decoding, token for token, on the plain and the
n-gram engine; ``accepted_prediction_tokens`` equals the client's recount
(specserve/client/prediction_usage.py); the answer's edit check runs (its rate is the
benchmark's, benchmarks/predicted_edits.py, not asserted here). ``make test-real`` runs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.real_model

RECORDS = 2
K = 4


def test_prediction_is_lossless_and_counted_as_the_client_recounts() -> None:
    from transformers import AutoTokenizer

    from specserve.client.code_edits import build_code_edits, edit_made
    from specserve.client.prediction_usage import accepted_prediction_tokens
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams
    from specserve.runtime.proposers import NgramProposer

    model = Path(os.environ.get("SPECSERVE_REAL_MODEL", "checkpoints/smollm2"))
    if not (model / "config.json").is_file():
        pytest.fail(f"{model} missing: run `make real-model` first")
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(model))
    plain = build_decoder(model)
    ngram = SpecDecoder(plain.target, NgramProposer(K))
    for rec in build_code_edits(None, RECORDS):
        ids = list(tok.apply_chat_template(rec.messages(), add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"])
        pred = tuple(tok(rec.prediction, add_special_tokens=False)["input_ids"])
        params = SamplingParams(max_tokens=rec.max_tokens, end_id=tok.eos_token_id)
        want = plain.generate([ids], params)[0].token_ids
        edit_made(tok.decode(want, skip_special_tokens=True), rec.edit)
        with_pred = SamplingParams(max_tokens=rec.max_tokens, end_id=tok.eos_token_id,
                                   prediction=pred)
        res = plain.generate([ids], with_pred)[0]
        assert res.token_ids == want
        assert res.accepted_prediction_tokens == accepted_prediction_tokens(
            want, pred, rec.max_tokens)
        assert ngram.generate([ids], with_pred)[0].token_ids == want
