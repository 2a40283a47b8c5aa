"""The reference ``tensorrt_llm`` model's issue-31 tensors, through the serving loop (a real
Scheduler with an n-gram proposer over the tiny target, requests checked by ``llm_io.admit``):

- ``return_log_probs`` -> ``output_log_probs`` [1, 1, T] / ``cum_log_probs`` [1, 1] (the shapes
  of TensorRT-LLM's ``[batch, beam, tokens]`` / ``[batch, beam]``, names and types pinned in
  ``data/api_features_io.json`` with their upstream sources); ``num_top_log_probs`` k ->
  ``top_log_probs`` / ``top_log_prob_ids`` [1, 1, T, k], equal to the engine's numbers;
  streamed, each response carries its own tokens' log-probs;
- ``num_draft_tokens`` 0 -> nothing drafted for that request, its neighbour speculates;
- ``prediction`` text -> ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` on
  the final response (streamed or not);
- bad input (``num_top_log_probs`` above 20 or without ``return_log_probs``,
  ``num_draft_tokens`` < 0, streamed log probs with ``draft_input_ids``, a prediction longer
  than max_seq_len or with ``draft_input_ids``) is one error line for that request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import load_model
from specserve.runtime.proposers import NgramProposer
from specserve.serving.request import EngineLimits
from specserve.triton import params as tparams
from specserve.triton.llm_io import admit
from specserve.triton.model_params import ModelParams
from specserve.triton.render import load_template
from tests.helpers.serving import serve_requests
from tests.helpers.tiny import TinyCheckpoint
from tests.serving.test_loop import Recorder

DATA = json.loads((Path(__file__).parent / "data" / "api_features_io.json").read_text())
PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]


@pytest.fixture(scope="module")
def decoder(tiny_ckpt: TinyCheckpoint) -> SpecDecoder:
    return SpecDecoder(load_model(tiny_ckpt.target), NgramProposer(3))


def _limits(d: SpecDecoder) -> EngineLimits:
    return EngineLimits(vocab_size=d.target.cfg.vocab_size, max_draft_len=3, max_seq_len=64,
                        eos=None)


def _arrays(prompt: list[int], n: int, **inputs: Any) -> dict[str, np.ndarray]:
    arrays = {"input_ids": np.array([prompt], dtype=np.int32),
              "request_output_len": np.array([[n]], dtype=np.int32),
              "end_id": np.array([[-1]], dtype=np.int32),
              "exclude_input_in_output": np.array([[True]])}
    arrays.update({k: np.array([[v]], dtype=object if isinstance(v, str) else None)
                   for k, v in inputs.items()})
    return arrays


def _ids(text: str) -> list[int]:
    """The test's tokenizer: ids written as decimal numbers (the model's is a real BPE)."""
    return [int(t) for t in text.split()]


def _run(d: SpecDecoder, reqs: list[dict[str, np.ndarray]]) -> list[Recorder]:
    return serve_requests(d, reqs, _limits(d), lambda ids: "x" * len(ids), encode=_ids)


def test_log_probs_outputs_carry_the_engines_numbers(decoder: SpecDecoder) -> None:
    want = decoder.generate([PROMPT], SamplingParams(max_tokens=9, logprobs=True,
                                                     top_logprobs=3))[0]
    [s] = _run(decoder, [_arrays(PROMPT, 9, return_log_probs=True, num_top_log_probs=3,
                                 return_perf_metrics=True)])
    arrays, error, final = s.got[-1]
    assert error is None and final and arrays is not None
    out = DATA["outputs"]
    assert arrays["output_log_probs"].dtype == np.float32 == arrays["cum_log_probs"].dtype
    assert arrays["output_log_probs"].shape == (1, 1, 9)
    assert arrays["output_log_probs"].ndim == len(out["output_log_probs"][1]) + 1  # + batch
    assert arrays["cum_log_probs"].shape == (1, 1)
    assert arrays["cum_log_probs"].ndim == len(out["cum_log_probs"][1]) + 1
    np.testing.assert_allclose(arrays["output_log_probs"][0, 0], want.logprobs, atol=1e-6)
    np.testing.assert_allclose(arrays["cum_log_probs"][0, 0], want.cum_logprob, atol=1e-5)
    assert arrays["top_log_probs"].shape == arrays["top_log_prob_ids"].shape == (1, 1, 9, 3)
    assert arrays["top_log_prob_ids"].dtype == np.int32
    assert arrays["top_log_prob_ids"][0, 0].tolist() == [[t for t, _ in r]
                                                         for r in want.top_logprobs]
    assert int(arrays["total_draft_tokens"][0, 0]) > 0  # produced under speculation


def test_streamed_log_probs_are_each_chunks_own(decoder: SpecDecoder) -> None:
    """Streaming with ``return_log_probs``: each response carries the log-probs (and top-k) of
    exactly its tokens; joined over the stream they are the non-streamed answer's (and the
    engine's: the draft steps emit several tokens per response)."""
    want = decoder.generate([PROMPT], SamplingParams(max_tokens=9, logprobs=True,
                                                     top_logprobs=2))[0]
    [s] = _run(decoder, [_arrays(PROMPT, 9, return_log_probs=True, num_top_log_probs=2,
                                 streaming=True)])
    chunks = [a for a, e, _ in s.got if a is not None and a["output_ids"].size]
    assert all(e is None for _, e, _ in s.got) and len(chunks) > 1
    for a in chunks:   # every chunk: as many log-probs as tokens
        assert a["output_log_probs"].shape == (1, 1, a["output_ids"].size)
        assert a["top_log_prob_ids"].shape == (1, 1, a["output_ids"].size, 2)
    assert any(a["output_ids"].size > 1 for a in chunks)   # speculation: several per step
    got = np.concatenate([a["output_log_probs"][0, 0] for a in chunks])
    np.testing.assert_allclose(got, want.logprobs, atol=1e-6)
    ids = np.concatenate([a["top_log_prob_ids"][0, 0] for a in chunks]).tolist()
    assert ids == [[t for t, _ in r] for r in want.top_logprobs]


def test_without_return_log_probs_no_log_prob_outputs(decoder: SpecDecoder) -> None:
    [s] = _run(decoder, [_arrays(PROMPT, 4)])
    arrays = s.got[-1][0]
    assert arrays is not None and "output_log_probs" not in arrays


def test_num_draft_tokens_zero_turns_speculation_off_for_that_request(
        decoder: SpecDecoder) -> None:
    off, on = _run(decoder, [_arrays(PROMPT, 12, num_draft_tokens=0, return_perf_metrics=True),
                             _arrays(PROMPT, 12, return_perf_metrics=True)])
    a_off, a_on = off.got[-1][0], on.got[-1][0]
    assert a_off is not None and a_on is not None
    assert int(a_off["total_draft_tokens"][0, 0]) == 0
    assert int(a_on["total_draft_tokens"][0, 0]) > 0
    assert a_off["output_ids"].tolist() == a_on["output_ids"].tolist()


@pytest.mark.parametrize(("inputs", "message"), [
    ({"return_log_probs": True, "num_top_log_probs": 21}, "top_logprobs must be in [0, 20]"),
    ({"num_top_log_probs": 2}, "top_logprobs needs logprobs"),
    ({"num_draft_tokens": -1}, "num_draft_tokens must be >= 0"),
    ({"return_log_probs": True, "streaming": True, "draft_input_ids": 5},
     "input 'return_log_probs' is not supported with streaming and 'draft_input_ids'"),
    ({"prediction": " ".join(["5"] * 65)},
     "input 'prediction' has 65 tokens, more than the engine's max_seq_len 64"),
    ({"prediction": "5 6", "draft_input_ids": 5},
     "input 'prediction' cannot be combined with 'draft_input_ids'"),
])
def test_bad_input_fails_that_request_only(decoder: SpecDecoder, inputs: dict[str, Any],
                                           message: str) -> None:
    bad, good = _run(decoder, [_arrays(PROMPT, 4, **inputs), _arrays(PROMPT, 4)])
    assert len(bad.got) == 1 and bad.got[0][1] is not None and message in bad.got[0][1]
    assert "\n" not in bad.got[0][1]
    assert good.got[-1][1] is None and good.got[-1][0] is not None


def test_reference_repositories_declare_the_tensors() -> None:
    """Upstream's names and types for the log-prob tensors (tensorrt_llm template), our own
    inputs and outputs on reference repositories only."""
    text = load_template("tensorrt_llm/config.pbtxt")
    for name, (dtype, dims) in DATA["outputs"].items():
        assert f'{{ name: "{name}" data_type: {dtype} dims: {dims} }}'.replace(
            "[-1]", "[ -1 ]").replace("[-1, -1]", "[ -1, -1 ]") in text
    dtype, _ = DATA["inputs"]["return_log_probs"]
    assert f'name: "return_log_probs" data_type: {dtype}' in text
    for name in DATA["specserve_inputs"]:
        assert f'name: "{name}"' in tparams.REFERENCE_INPUTS
        assert f'name: "{name}"' not in text  # not on TensorRT-LLM repositories
    for name in DATA["specserve_outputs"]:
        assert f'name: "{name}"' in tparams.REFERENCE_OUTPUTS


@pytest.mark.parametrize("name", ["return_context_logits"])
def test_what_the_reference_model_does_not_serve_stays_refused(decoder: SpecDecoder,
                                                               name: str) -> None:
    assert name in DATA["refused_by_reference"]
    value: Any = True
    arrays = _arrays(PROMPT, 4)
    arrays[name] = np.array([[value]])
    with pytest.raises(ValueError, match=f"input '{name}' is not supported"):
        admit(arrays, ModelParams(engine_dir="unused"), True, _limits(decoder))


def test_prediction_counts_come_back_on_the_final_response(decoder: SpecDecoder) -> None:
    plain = decoder.generate([PROMPT], SamplingParams(max_tokens=12))[0].token_ids
    good = " ".join(str(t) for t in plain)
    a, b = _run(decoder, [
        _arrays(PROMPT, 12, prediction=good, return_perf_metrics=True),
        _arrays(PROMPT, 12, streaming=True, prediction=good)])
    final = a.got[-1][0]
    assert final is not None and final["output_ids"].reshape(-1).tolist() == plain
    acc = int(final["accepted_prediction_tokens"][0, 0])
    assert acc + int(final["rejected_prediction_tokens"][0, 0]) == len(plain)
    assert acc >= len(plain) // 2 and acc <= int(final["total_accepted_draft_tokens"][0, 0])
    streamed = b.got[-1][0]  # a streamed request gets them on its final response too
    assert streamed is not None and int(streamed["accepted_prediction_tokens"][0, 0]) == acc
