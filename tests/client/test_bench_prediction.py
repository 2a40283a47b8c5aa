"""Predicted Outputs in ``specserve bench``: the dataset field, the request at every door
(Triton gRPC / HTTP: ensemble, BLS, tensorrt_llm; OpenAI: Dynamo's nvext or OpenAI's own
field), the counts read back, and the report's totals, mismatches and speedup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.client.benchmark import Job, Runner, Target, check_targets
from specserve.client.config import BenchmarkConfig
from specserve.client.datasets import dump_jsonl, load_dataset, parse_record
from specserve.client.metrics import make_record
from specserve.client.openai import _Stream, _whole_body, openai_body, prediction_counts
from specserve.client.prediction import (
    NOT_RETURNED,
    TEXT_ONLY,
    chunk_texts,
    prediction_summary,
    recount,
    summarize_predictions,
)
from specserve.client.prompt import Prompt
from specserve.client.report import build_summary, csv_rows, prediction_lines, readme
from specserve.client.transport import GenParams, RawResult, build_inputs
from specserve.client.triton_grpc import GrpcTransport
from specserve.client.triton_http import http_body
from specserve.errors import SpecserveError

PRED = "def add(a, b):\n    return a + b\n"
ENSEMBLE = frozenset({"text_input", "max_tokens", "stream", "end_id", "prediction",
                      "return_perf_metrics", "return_num_output_tokens"})
UPSTREAM = ENSEMBLE - {"prediction"}   # TensorRT-LLM's own ensemble: no such input
LLM = frozenset({"input_ids", "input_lengths", "request_output_len", "streaming", "end_id",
                 "temperature", "runtime_top_k", "prediction", "exclude_input_in_output",
                 "return_perf_metrics", "return_num_output_tokens"})


# --- the dataset record ------------------------------------------------------------------

@pytest.mark.parametrize("prompt", [
    Prompt("write add", 32, "code", prediction=PRED),
    Prompt("User: hi\n\nAssistant:", None, messages=(("user", "hi"),), prediction="hello"),
    Prompt("no prediction"),
])
def test_a_prediction_survives_dump_and_load(tmp_path: Path, prompt: Prompt) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(dump_jsonl([prompt]))
    assert load_dataset(f) == [prompt]
    assert ("prediction" in json.loads(f.read_text())) == (prompt.prediction is not None)


def test_openai_request_form_of_a_prediction_is_read() -> None:
    parts = {"type": "content", "content": [{"type": "text", "text": "def f"},
                                            {"type": "text", "text": "(): pass"}]}
    assert parse_record({"prompt": "p", "prediction": parts}, "f:1").prediction == "def f(): pass"
    whole = {"type": "content", "content": PRED}
    assert parse_record({"prompt": "p", "prediction": whole}, "f:1").prediction == PRED


@pytest.mark.parametrize("obj, words", [
    ({"prompt": "p", "prediction": 3}, "f:7: 'prediction' must be a non-empty string"),
    ({"prompt": "p", "prediction": ""}, "f:7: 'prediction' must be a non-empty string"),
    ({"prompt": "p", "prediction": {"type": "content"}}, "'prediction' must be"),
    ({"turns": ["a", "b"], "prediction": "x"}, "f:7: 'prediction' is one request's"),
])
def test_bad_predictions_are_one_line_naming_the_line(obj: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecserveError) as e:
        parse_record(obj, "f:7")
    assert words in str(e.value) and "\n" not in str(e.value)


def test_code_edit_records_load_with_their_prediction() -> None:
    from specserve.client.code_edits import code_edits, stdlib_functions

    (rec,) = code_edits(stdlib_functions(("colorsys",)), n=1)
    p = parse_record(json.loads(json.dumps(rec.to_dict())), "edits.jsonl:1")
    assert p.prediction == rec.prediction and p.prediction.startswith("```python\n")
    assert p.messages == (("user", rec.instruction),) and p.max_tokens == rec.max_tokens


# --- the request at each door -------------------------------------------------------------

def test_triton_text_doors_get_the_prediction_input_where_declared() -> None:
    p = GenParams(max_tokens=8, prediction=PRED)
    assert build_inputs("q", p, ENSEMBLE)["prediction"] == PRED
    assert "prediction" not in build_inputs("q", p, UPSTREAM)
    assert "prediction" not in build_inputs("q", GenParams(max_tokens=8), ENSEMBLE)
    assert http_body("q", p, ENSEMBLE)["prediction"] == PRED


def test_the_tensorrt_llm_door_gets_ids_and_the_prediction() -> None:
    p = GenParams(max_tokens=8, temperature=0.0, top_k=1, prediction=PRED, input_ids=(5, 6, 7))
    values = build_inputs("ignored", p, LLM)
    assert values == {"input_ids": (5, 6, 7), "input_lengths": 3, "request_output_len": 8,
                      "streaming": True, "temperature": 0.0, "runtime_top_k": 1,
                      "prediction": PRED, "exclude_input_in_output": True,
                      "return_perf_metrics": True, "return_num_output_tokens": True}
    assert http_body("ignored", p, LLM)["input_ids"] == [5, 6, 7]
    inputs = {i.name(): i for i in GrpcTransport._make_inputs(values)}
    assert inputs["input_ids"].shape() == [1, 3] and inputs["input_ids"].datatype() == "INT32"
    assert inputs["prediction"].shape() == [1, 1] and inputs["prediction"].datatype() == "BYTES"
    with pytest.raises(ValueError, match="--tokenizer"):
        build_inputs("q", GenParams(max_tokens=8), LLM)


def test_openai_sends_dynamo_annotation_by_default_or_openai_field() -> None:
    body = openai_body("m", "q", GenParams(max_tokens=8, prediction=PRED), "completions")
    assert body["nvext"] == {"annotations": [f"prediction:{PRED}"]} and "prediction" not in body
    body = openai_body("m", "q", GenParams(max_tokens=8, prediction=PRED,
                                           prediction_field="openai"), "chat")
    assert body["prediction"] == {"type": "content", "content": PRED} and "nvext" not in body
    plain = openai_body("m", "q", GenParams(max_tokens=8), "completions")
    assert "prediction" not in plain and "nvext" not in plain


def _runner(cfg: BenchmarkConfig, declared: frozenset[str] = ENSEMBLE) -> Runner:
    targets = {v: Target(None, "m", declared) for v in ("spec", "baseline")}  # type: ignore[arg-type]
    return Runner(cfg, targets, lambda rec: None, None)


def test_only_the_spec_variant_carries_the_prediction() -> None:
    cfg = BenchmarkConfig(url="h:1", out="o", baseline_model="m")
    prompt = Prompt("q", prediction=PRED)
    r = _runner(cfg)
    assert r._params(Job(0, "spec", "measure", 0, prompt)).prediction == PRED
    assert r._params(Job(1, "baseline", "measure", 0, prompt)).prediction is None
    off = _runner(BenchmarkConfig(url="h:1", out="o", send_prediction=False))
    assert off._params(Job(0, "spec", "measure", 0, prompt)).prediction is None
    field = _runner(BenchmarkConfig(url="h:1", out="o", protocol="openai",
                                    prediction_field="openai"))
    assert field._params(Job(0, "spec", "measure", 0, prompt)).prediction_field == "openai"


def test_runs_the_models_cannot_serve_are_refused_in_one_line() -> None:
    jobs = [Job(0, "spec", "measure", 0, Prompt("q", prediction=PRED))]
    upstream = {"spec": Target(None, "ensemble", UPSTREAM)}  # type: ignore[arg-type]
    with pytest.raises(SpecserveError, match="takes no 'prediction' input.*--no-prediction"):
        check_targets(BenchmarkConfig(url="h:1", out="o"), jobs, upstream, None)
    check_targets(BenchmarkConfig(url="h:1", out="o", send_prediction=False), jobs, upstream,
                  None)
    ids = {"spec": Target(None, "tensorrt_llm", LLM)}  # type: ignore[arg-type]
    with pytest.raises(SpecserveError, match="takes token ids.*--tokenizer"):
        check_targets(BenchmarkConfig(url="h:1", out="o"), jobs, ids, None)
    with pytest.raises(SpecserveError, match="--prediction-field"):
        BenchmarkConfig(url="h:1", out="o", prediction_field="top").validate()


# --- the counts read back ------------------------------------------------------------------

def test_triton_counts_and_ids_are_read_from_responses() -> None:
    raw = RawResult()
    raw.add_response(0.1, {"output_ids": np.array([[[4, 5]]], dtype=np.int32),
                           "num_output_tokens": 2})
    raw.add_response(0.2, {"output_ids": [[[6]]]})      # HTTP JSON; no count: the ids'
    raw.add_response(0.3, {"accepted_prediction_tokens": 2,
                           "rejected_prediction_tokens": [[7]]})
    assert raw.output_ids == [4, 5, 6] and raw.chunk_num_tokens == [2, 1]
    assert (raw.accepted_prediction_tokens, raw.rejected_prediction_tokens) == (2, 7)
    assert RawResult().output_ids is None


def test_openai_counts_come_from_completion_tokens_details() -> None:
    usage = {"completion_tokens": 9, "completion_tokens_details": {
        "accepted_prediction_tokens": 6, "rejected_prediction_tokens": 3}}
    st = _Stream(RawResult())
    st.event(json.dumps({"choices": [{"text": "ab"}], "usage": usage}), 0.1)
    assert (st.raw.accepted_prediction_tokens, st.raw.rejected_prediction_tokens) == (6, 3)
    raw = RawResult()
    _whole_body({"choices": [{"text": "ab"}], "usage": usage}, 0.2, raw)
    assert (raw.accepted_prediction_tokens, raw.rejected_prediction_tokens) == (6, 3)
    assert prediction_counts({"usage": {"completion_tokens": 9}}) is None
    assert prediction_counts({"usage": {"completion_tokens_details": {
        "reasoning_tokens": 0}}}) is None


def test_chunk_texts_decode_the_growth_of_the_answer() -> None:
    vocab = {1: "a", 2: "b", 3: "\u00e9"}
    assert chunk_texts([1, 2, 3, 1], [1, 2, 1], lambda ids: "".join(vocab[i] for i in ids)) \
        == ["a", "b\u00e9", "a"]


def test_recount_caps_drafts_at_num_draft_tokens() -> None:
    pred = list(range(10, 30))
    assert recount(pred, pred, 64, None) == 16 + 2  # 16 drafts, a token of its own, 2 more
    assert recount(pred, pred, 64, 4) == 4 * 4      # 4 drafts a step, then its own token
    assert recount([9, 9, 9], pred, 64, None) == 0


# --- the report --------------------------------------------------------------------------

def _rec(i: int, variant: str, out: str, e2e: float, **kw: Any) -> Any:
    return make_record(index=i, variant=variant, phase="measure", model="m", url="u",
                       prompt_index=i // 2, send_time_unix_s=0.0, streaming=True,
                       chunk_times_s=[0.01, e2e], chunk_tokens=[1, 9], end_s=e2e,
                       token_count_source="server", output_text=out, **kw)


def test_summary_totals_mismatches_and_speedup_against_the_same_requests() -> None:
    recs = [_rec(0, "spec", "x", 0.5, prediction_sent=True, accepted_prediction_tokens=8,
                 rejected_prediction_tokens=2, prediction_recount=8),
            _rec(1, "baseline", "x", 1.0),
            _rec(2, "spec", "y", 0.25, prediction_sent=True, accepted_prediction_tokens=5,
                 rejected_prediction_tokens=1, prediction_recount=4),
            _rec(3, "baseline", "z", 1.0)]
    s = summarize_predictions(recs)
    assert s is not None
    assert (s["accepted_prediction_tokens"], s["rejected_prediction_tokens"]) == (13, 3)
    assert (s["recount_accepted"], s["compared"], s["mismatches"]) == (12, 2, 1)
    vb = prediction_summary(recs)["vs_baseline"]  # type: ignore[index]
    assert vb["pairs"] == 2 and vb["outputs_equal"] == 1
    assert vb["per_user_tok_s_ratio_median"] == pytest.approx(3.0)    # 2x and 4x
    assert vb["e2e_ratio_median"] == pytest.approx(3.0)
    summary = build_summary(recs, 1.0, None, {}, {"config": {}})
    assert summary["prediction"]["spec"]["mismatches"] == 1
    assert any("server != recount in 1 of 2" in line for line in prediction_lines(summary))
    assert "## Predicted Outputs" in readme(summary, [])
    rows = {r["metric"]: r for r in csv_rows(summary)}
    assert rows["prediction_recount_mismatches"]["value"] == 1
    assert rows["prediction_per_user_tok_s_ratio_median"]["value"] == pytest.approx(3.0)


def test_a_server_that_returns_no_counts_reads_not_returned_never_zero() -> None:
    recs = [_rec(0, "spec", "x", 0.5, prediction_sent=True, prediction_recount_note=TEXT_ONLY)]
    s = summarize_predictions(recs)
    assert s is not None
    assert s["accepted_prediction_tokens"] == NOT_RETURNED == s["rejected_prediction_tokens"]
    assert s["not_returned"] == 1 and s["recount_accepted"] is None
    assert s["recount_notes"] == [TEXT_ONLY]
    lines = prediction_lines({"prediction": prediction_summary(recs)})
    assert "accepted not returned, rejected not returned" in lines[0]


def test_runs_without_predictions_keep_their_summary() -> None:
    recs = [_rec(0, "spec", "x", 0.5), _rec(1, "baseline", "x", 1.0)]
    assert prediction_summary(recs) is None
    assert "prediction" not in build_summary(recs, 1.0, None, {}, {"config": {}})
    assert "send_prediction" not in BenchmarkConfig(url="h:1", out="o").to_dict()


def test_a_sweep_sends_no_prediction_in_the_baseline_phase(tmp_path: Path) -> None:
    from specserve.client.sweep import phase_config

    cfg = BenchmarkConfig(url="h:1", out="o", baseline_model="ensemble")
    assert phase_config(cfg, 1, "spec", tmp_path).send_prediction
    assert not phase_config(cfg, 1, "baseline", tmp_path).send_prediction
