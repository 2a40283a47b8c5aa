"""The BLS speculation loop's request and response building without Triton
(``specserve/triton/models/bls_lib/spec_io.py``): the inputs of the draft and target calls (the
I/O contract with ``tensorrt_llm``, TensorRT-LLM 1.2.1 names), the merge of a decoupled call's
responses, the draft vocabulary and id checks, the accepted-draft count, the streamed and final
text and token counts, and the perf outputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.triton.models.bls_lib import spec_io, spec_text
from specserve.triton.models.bls_lib.spec_io import BlsParams, SpecOptions
from specserve.triton.models.bls_lib.spec_loop import Iteration, LoopResult, Sampling
from specserve.triton.models.bls_lib.spec_text import TextStream


def pre(ids: list[int], n: int | None = None, **extra: Any) -> dict[str, Any]:
    """preprocessing's outputs under the tensorrt_llm names ([1, L] padded ids)."""
    out = {"input_ids": np.array([ids + [0, 0]], dtype=np.int32),
           "input_lengths": np.array([[len(ids) if n is None else n]], dtype=np.int32)}
    out.update(extra)
    return out


def scalars(**values: Any) -> dict[str, Any]:
    return {k: np.array([v]) for k, v in values.items()}


def test_params_from_the_config_and_placeholders() -> None:
    got = BlsParams.from_params({"tensorrt_llm_draft_model_name": "d", "max_draft_len": "4",
                                 "tensorrt_llm_vocab_size": "260", "ngram_max_size": "${x}",
                                 "tensorrt_llm_decoupled": "true", "accumulate_tokens": "1"})
    assert got == BlsParams(draft="d", spec_mode="draft", max_draft_len=4, vocab=260,
                            llm_decoupled=True, accumulate=True)
    assert BlsParams.from_params({}) == BlsParams()


def test_drafting_ahead_only_with_a_draft_model_and_no_fast_logits() -> None:
    """On by default for a draft model; off by parameter, for n-gram (nothing to overlap) and
    with fast logits (the handle would show the target the extra guess)."""
    draft = {"tensorrt_llm_draft_model_name": "d"}
    assert BlsParams.from_params(draft).ahead
    assert not BlsParams.from_params({**draft, "specserve_draft_ahead": "false"}).ahead
    assert not BlsParams.from_params({**draft, "speculative_decoding_fast_logits": "1"}).ahead
    assert not BlsParams.from_params({"speculative_mode": "ngram"}).ahead
    assert not BlsParams.from_params({}).ahead
    # and only under a light load: up to specserve_draft_ahead_max_inflight requests (4)
    on = BlsParams.from_params(draft)
    assert on.ahead_now(1) and on.ahead_now(4) and not on.ahead_now(5)
    two = BlsParams.from_params({**draft, "specserve_draft_ahead_max_inflight": "2"})
    assert two.ahead_now(2) and not two.ahead_now(3)
    assert not BlsParams.from_params({"speculative_mode": "ngram"}).ahead_now(1)


@pytest.mark.parametrize(("cfg", "inputs", "k", "message"), [
    (BlsParams(spec_mode="ngram"), {}, -1, "num_draft_tokens must be >= 0"),
    (BlsParams(spec_mode="ngram", max_draft_len=3), {}, 4, "exceeds the target's max_draft_len 3"),
    (BlsParams(spec_mode="draft"), {}, 2, "tensorrt_llm_draft_model_name is empty"),
    (BlsParams(), {}, 2, "needs a draft source"),
    (BlsParams(spec_mode="ngram"), scalars(beam_width=2), 2, "beam_width > 1"),
    (BlsParams(spec_mode="ngram"), scalars(prediction=b"x"), 2,
     "input 'prediction' is not supported by the BLS's speculation loop"),
    (BlsParams(spec_mode="ngram"), scalars(num_top_log_probs=2), 2,
     "input 'num_top_log_probs' is not supported by the BLS's speculation loop"),
])
def test_bad_spec_requests_fail_with_one_message(cfg: BlsParams, inputs: dict[str, Any], k: int,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_io.check_spec_request(cfg, inputs, k)
    spec_io.check_spec_request(BlsParams(spec_mode="ngram", max_draft_len=3), {}, 3)


def test_the_spec_request_from_inputs_and_preprocessing() -> None:
    words = np.array([[[7, 8, 9], [1, 3, -1]]], dtype=np.int32)
    req = spec_io.spec_request(scalars(max_tokens=12, temperature=0.5, top_k=3, seed=9,
                                       min_tokens=2),
                               pre([4, 5, 6], 2, end_id=np.array([[2]]), stop_words_list=words), 4)
    assert (req.prompt, req.max_tokens, req.num_draft_tokens, req.end_id, req.min_tokens) == \
        ((4, 5), 12, 4, 2, 2)
    assert req.sampling == Sampling(temperature=0.5, top_k=3, top_p=None, seed=9)
    assert req.stop_words == ((7,), (8, 9))
    assert spec_io.spec_request(scalars(max_tokens=3), pre([4]), 1).end_id == -1


def test_the_draft_call_asks_k_tokens_and_never_stops() -> None:
    s = Sampling(temperature=0.7, top_k=5, top_p=0.9, seed=11, min_tokens=3)
    inputs = scalars(length_penalty=1.0, repetition_penalty=1.2, stream=True)
    arrays, names = spec_io.draft_call(inputs, pre([4, 5], end_id=np.array([[2]]),
                                                   pad_id=np.array([[0]])), [4, 5, 6], 3, s,
                                     SpecOptions(use_logits=True))
    assert names == ["output_ids", "sequence_length", "generation_logits"]
    assert arrays["input_ids"].tolist() == [[4, 5, 6]] and arrays["input_ids"].dtype == np.int32
    assert {k: int(arrays[k][0, 0]) for k in ("input_lengths", "request_output_len", "end_id",
                                              "runtime_top_k", "min_tokens", "pad_id")} == \
        {"input_lengths": 3, "request_output_len": 3, "end_id": -1, "runtime_top_k": 5,
         "min_tokens": 3, "pad_id": 0}
    assert arrays["seed"].dtype == np.uint64 and int(arrays["seed"][0, 0]) == 11
    assert arrays["exclude_input_in_output"].tolist() == [[True]]
    assert arrays["return_generation_logits"].tolist() == [[True]]
    assert float(arrays["repetition_penalty"][0, 0]) == pytest.approx(1.2)
    assert "len_penalty" in arrays and "streaming" not in arrays  # SPEC_PASS only, renamed
    no_logits, names = spec_io.draft_call({}, pre([4]), [4], 1, Sampling(), SpecOptions())
    assert names == ["output_ids", "sequence_length"] and "seed" not in no_logits


# upstream's BLS call tensors (triton_decoder.py, audit rows #3 and #5): data/bls_call_tensors.json
CALLS: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "bls_call_tensors.json")
                                   .read_text())


def test_sampling_inputs_the_client_did_not_set_stay_unset() -> None:
    """Upstream skips every request field that is None: a client that sends no temperature /
    top_k / top_p gets the executor's greedy default in the draft and the target calls, not
    T = 0 (top-p over logits scaled by 1e6). What the client set is sent as set."""
    unset = CALLS["unset_when_not_given"]
    req = spec_io.spec_request(scalars(max_tokens=8), pre([4, 5]), 2)
    assert (req.sampling.temperature, req.sampling.top_k, req.sampling.top_p) == (None,) * 3
    draft, _ = spec_io.draft_call({}, pre([4, 5]), [4, 5], 2, replace(req.sampling, min_tokens=2),
                                  SpecOptions())  # the loop gives the draft min_tokens = k
    target, _ = spec_io.target_call({}, pre([4, 5]), [4, 5], [1, 2], None, req.sampling)
    for call in (draft, target):
        assert not set(unset) & set(call), sorted(call)
    assert "min_tokens" not in target  # none asked (the draft's min_tokens is k, upstream's)
    assert int(draft["min_tokens"][0, 0]) == 2
    given = spec_io.spec_request(scalars(max_tokens=8, temperature=0.0, top_p=0.5), pre([4]), 2)
    sent, _ = spec_io.target_call({}, pre([4]), [4], [], None, given.sampling)
    assert float(sent["temperature"][0, 0]) == 0.0 and "runtime_top_k" not in sent
    assert float(sent["runtime_top_p"][0, 0]) == pytest.approx(0.5)


@pytest.mark.parametrize("use_logits", [False, True])
def test_the_draft_is_asked_for_logits_only_with_use_draft_logits(use_logits: bool) -> None:
    """Upstream: the draft's return_generation_logits is use_draft_logits, on every call (no
    extra request for a vocabulary check); the target's is false when it gets drafts."""
    assert CALLS["draft_return_generation_logits"] == "use_draft_logits"
    opts = spec_io.spec_options(scalars(use_draft_logits=use_logits), decoupled=False)
    arrays, names = spec_io.draft_call({}, pre([4]), [4], 3, Sampling(), opts)
    assert arrays["return_generation_logits"].tolist() == [[use_logits]]
    assert ("generation_logits" in names) is use_logits
    target, names = spec_io.target_call({}, pre([4]), [4], [1], None, Sampling())
    assert bool(target.get("return_generation_logits", False)) is \
        CALLS["target_return_generation_logits_with_drafts"]
    assert "generation_logits" not in names


def test_the_target_call_verifies_the_drafts() -> None:
    words = np.array([[[7], [1]]], dtype=np.int32)
    logits = np.zeros((2, 6), dtype=np.float64)
    arrays, names = spec_io.target_call({}, pre([4], end_id=np.array([[2]]),
                                                stop_words_list=words),
                                        [4, 9], [1, 3], logits, Sampling(min_tokens=1))
    assert names == ["output_ids", "sequence_length"]
    assert int(arrays["request_output_len"][0, 0]) == 3  # drafts + 1
    assert int(arrays["end_id"][0, 0]) == 2
    assert arrays["draft_input_ids"].tolist() == [[1, 3]]
    assert arrays["draft_logits"].shape == (1, 2, 6) and arrays["draft_logits"].dtype == np.float32
    assert arrays["stop_words_list"] is words
    plain, _ = spec_io.target_call({}, pre([4]), [4], [], None, Sampling())
    assert int(plain["request_output_len"][0, 0]) == 1 and "draft_input_ids" not in plain
    assert int(plain["end_id"][0, 0]) == -1


def test_accepted_drafts_are_the_matching_prefix() -> None:
    assert spec_io.target_counts([1, 2, 3], [1, 2, 9]) == ([1, 2, 9], 2, 3)
    assert spec_io.target_counts([1, 2, 3], [1, 2, 3, 4]) == ([1, 2, 3, 4], 3, 3)
    assert spec_io.target_counts([1, 2, 3], [1, 9, 3]) == ([1, 9, 3], 1, 3)  # not a count of
    assert spec_io.target_counts([], [5]) == ([5], 0, 0)                    # equal positions


def test_a_decoupled_call_s_responses_are_merged() -> None:
    r1 = {"output_ids": np.array([[[1, 2, 0]]], dtype=np.int32),
          "sequence_length": np.array([[2]], dtype=np.int32),
          "generation_logits": np.ones((1, 1, 2, 4), dtype=np.float32), "x": np.array([[1]])}
    r2 = {"output_ids": np.array([[[3]]], dtype=np.int32),
          "generation_logits": np.zeros((1, 1, 1, 4), dtype=np.float32), "x": np.array([[2]])}
    out = spec_io.merge_outputs([r1, {}, r2])
    assert out["output_ids"] == [1, 2, 3]
    assert out["generation_logits"].shape == (3, 4) and out["generation_logits"][2].sum() == 0
    assert out["x"].tolist() == [[2]]
    assert spec_io.merge_outputs([{}]) == {"output_ids": []}


def test_call_errors_name_the_model_and_its_parameter() -> None:
    assert spec_io.call_error("draft", "d", "Request for unknown model 'd'") == (
        "draft model 'd' (parameter tensorrt_llm_draft_model_name) is not available in the "
        "repository: Request for unknown model 'd'")
    assert spec_io.call_error("target", "t", "bad input") == \
        "target model 't' (parameter tensorrt_llm_model_name): bad input"


def test_the_draft_vocabulary_and_ids_are_checked() -> None:
    cfg = BlsParams(draft="d", vocab=8)
    assert spec_io.check_draft(cfg, [1, 7], np.zeros((2, 8))) is True
    assert spec_io.check_draft(cfg, [1, 7], None) is False  # ids checked, vocab not yet
    assert spec_io.check_draft(cfg, [], np.zeros((0, 9))) is False
    with pytest.raises(ValueError, match=r"draft model 'd' has a vocabulary of 9 .*target's is "
                                         r"8 \(parameter tensorrt_llm_vocab_size\)"):
        spec_io.check_draft(cfg, [1], np.zeros((1, 9)))
    with pytest.raises(ValueError, match=r"proposed token id 8, outside the target's "
                                         r"vocabulary \(8\)"):
        spec_io.check_draft(cfg, [1, 8], None)
    with pytest.raises(ValueError, match="token id -1"):
        spec_io.check_draft(cfg, [-1], None)
    assert spec_io.check_draft(BlsParams(), [10**6], np.zeros((1, 3))) is False


def letters(ids: list[int]) -> str:
    return "".join(chr(97 + t % 26) for t in ids)


def it(index: int, new: list[int], drafted: int = 0, accepted: int = 0) -> Iteration:
    return Iteration(index=index, drafts=[], target_tokens=new, new_tokens=new,
                     drafted=drafted, accepted=accepted, time_ns=0)


def result(tokens: list[int], iterations: list[Iteration], first: int = 0) -> LoopResult:
    return LoopResult(tokens=tokens, finish_reason="length", iterations=iterations,
                      drafted=sum(i.drafted for i in iterations),
                      accepted=sum(i.accepted for i in iterations),
                      first_token_ns=first, last_token_ns=first)


@pytest.mark.parametrize("accumulate", [False, True])
def test_streamed_text_and_counts_per_iteration(accumulate: bool) -> None:
    opts = SpecOptions(streaming=True, counts_in=True, counts_out=True)
    text = TextStream(opts, accumulate, (0, 1, 2), letters)
    got = [text.iteration(it(0, [3, 4])), text.iteration(it(1, [])), text.iteration(it(2, [5]))]
    assert got[1] is None
    assert [g["text_output"] for g in got if g] == (["de", "def"] if accumulate else ["de", "f"])
    assert [g["num_output_tokens"] for g in got if g] == [2, 1]
    assert all(g["num_input_tokens"] == 3 for g in got if g)
    final = text.final(result([3, 4, 5], []), 1, 2)
    assert final == {"text_output": "def" if accumulate else "", "num_output_tokens": 0,
                     "num_input_tokens": 3}


def test_not_streamed_nothing_per_iteration_and_the_whole_text_at_the_end() -> None:
    text = TextStream(SpecOptions(counts_out=True), False, (0, 1), letters)
    assert text.iteration(it(0, [3])) is None
    assert text.final(result([3, 4], []), 1, 2) == {"text_output": "abde",
                                                    "num_output_tokens": 4}
    excl = TextStream(SpecOptions(exclude=True, counts_out=True), False, (0, 1), letters)
    assert excl.final(result([3, 4], []), 1, 2) == {"text_output": "de", "num_output_tokens": 2}


def test_the_final_perf_outputs() -> None:
    its = [it(0, [3, 4, 5], drafted=4, accepted=2), it(1, [6], drafted=4, accepted=0),
           it(2, [7, 8], drafted=1, accepted=1)]
    res = result([3, 4, 5, 6, 7, 8], its, first=0)
    res.last_token_ns = 0
    values = TextStream(SpecOptions(perf=True), False, (0,), letters).final(res, 100, 250)
    assert int(values["total_draft_tokens"][0, 0]) == 9
    assert int(values["total_accepted_draft_tokens"][0, 0]) == 3
    assert float(values["acceptance_rate"][0, 0]) == pytest.approx(3 / 9)
    assert [int(values[k][0, 0]) for k in ("arrival_time_ns", "first_scheduled_time_ns",
                                            "first_token_time_ns", "last_token_time_ns")] == \
        [100, 250, 250, 250]  # no token times: the scheduled time
    stats = json.loads(values["spec_stats_json"])
    assert (stats["steps"], stats["draft_tokens"], stats["accepted_tokens"]) == (3, 9, 3)
    arrays = spec_text.response_arrays(values, ["text_output", "total_draft_tokens",
                                              "spec_stats_json"])
    assert sorted(arrays) == ["spec_stats_json", "text_output", "total_draft_tokens"]
    assert arrays["text_output"].dtype == np.object_ and \
        arrays["text_output"][0, 0] == b"adefghi"
    assert arrays["spec_stats_json"][0, 0].decode() == values["spec_stats_json"]


def test_response_arrays_keep_the_declared_outputs_as_triton_types() -> None:
    out = spec_text.response_arrays({"text_output": "é", "num_output_tokens": 3, "x": 1},
                                  ["text_output", "num_output_tokens"])
    assert out["text_output"].tolist() == [["é".encode()]]
    assert out["num_output_tokens"].dtype == np.int32 and out["num_output_tokens"].shape == (1, 1)
    assert "x" not in out


def test_without_speculation_a_reference_target_gets_the_client_s_own_inputs() -> None:
    """num_draft_tokens 0 (no speculation there too), top log-probs and the prediction go to a
    reference target (parameter specserve_reference_target); a TensorRT-LLM target, which
    declares no num_draft_tokens, never gets the BLS's own input."""
    from specserve.triton.models.bls_lib import request as rq

    inputs = scalars(num_draft_tokens=0, num_top_log_probs=2, prediction=b"x")
    assert BlsParams.from_params({"specserve_reference_target": "true"}).reference_target
    ref = rq.target_inputs(inputs, {}, True, reference=True)
    assert {k: v.tolist() for k, v in ref.items()} == {
        "num_draft_tokens": [[0]], "num_top_log_probs": [[2]], "prediction": [[b"x"]]}
    assert "num_draft_tokens" not in rq.target_inputs(inputs, {}, True)
