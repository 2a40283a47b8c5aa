"""``specserve bench`` sends Predicted Outputs through tritonserver to the tiny reference engine
(the run-wide ``tiny_server``): at the ``tensorrt_llm`` door (token ids both ways) the server's
``accepted_prediction_tokens`` equal the client's recount; the ``ensemble`` and BLS doors return
the counts too, the same as the ids door of the same engine; the baseline variant (the same
model, no prediction) answers the same text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specserve.client.config import BenchmarkConfig
from specserve.client.prediction import TEXT_ONLY, load_codec
from specserve.client.run import run_benchmark

pytestmark = pytest.mark.server

PROMPTS = ["import os\nimport", "Hello world", "The quick brown fox", "for i in range(10):\n"]
MAX_TOKENS = 24


def _bench(dep: Any, protocol: str, model: str, dataset: Path, out: Path,
           baseline: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    url = dep.server.grpc_url if protocol == "grpc" else dep.server.http_url
    cfg = BenchmarkConfig(url=url, protocol=protocol, out=str(out), model=model,
                          baseline_model=model if baseline else None, requests=len(PROMPTS),
                          warmup=0, dataset=str(dataset), max_tokens=MAX_TOKENS,
                          temperature=0.0, tokenizer=str(dep.ckpt.tokenizer), bootstrap=50)
    res = run_benchmark(cfg, progress=False, plots=False)
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert res.exit_code == 0, [r["error"] for r in recs]
    return res.summary, recs


def _by_prompt(recs: list[dict[str, Any]], variant: str = "spec") -> dict[int, dict[str, Any]]:
    return {r["prompt_index"]: r for r in recs if r["variant"] == variant}


@pytest.fixture(scope="module")
def predicted(tiny_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each prompt with the plain engine's own answer as its prediction (so parts of it are
    accepted), from a first bench run without predictions."""
    root = tmp_path_factory.mktemp("pred")
    plain = root / "plain.jsonl"
    plain.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    _, recs = _bench(tiny_server, "grpc", "tensorrt_llm_baseline", plain, root / "first",
                     baseline=False)
    out = _by_prompt(recs)
    f = root / "predicted.jsonl"
    f.write_text("".join(json.dumps({"prompt": p, "prediction": out[i]["output_text"]}) + "\n"
                         for i, p in enumerate(PROMPTS)))
    return f


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_prediction_sent_by_bench_reaches_the_engine_at_every_door(
        tiny_server: Any, predicted: Path, tmp_path: Path, protocol: str) -> None:
    codec = load_codec(str(tiny_server.ckpt.tokenizer))
    assert codec is not None
    preds = [json.loads(x)["prediction"] for x in predicted.read_text().splitlines()]
    summary, recs = _bench(tiny_server, protocol, "tensorrt_llm_baseline", predicted,
                           tmp_path / "ids")
    spec = _by_prompt(recs)
    for i, r in spec.items():
        assert r["prediction_sent"] and r["prediction_recount_note"] is None
        # the whole prediction reached the engine: its counts add up to its tokens
        n_pred = len(codec.encode(preds[i], special=False))
        assert r["accepted_prediction_tokens"] + r["rejected_prediction_tokens"] == n_pred
        assert r["accepted_prediction_tokens"] == r["prediction_recount"], i
    assert sum(r["accepted_prediction_tokens"] for r in spec.values()) > 0
    assert not any(r["prediction_sent"] for r in recs if r["variant"] == "baseline")
    p = summary["prediction"]
    assert p["spec"]["mismatches"] == 0 and p["spec"]["compared"] == len(PROMPTS)
    assert p["vs_baseline"]["outputs_equal"] == p["vs_baseline"]["pairs"] == len(PROMPTS)
    # the text doors of the same plain engine: the same counts; no recount (text only)
    _, text = _bench(tiny_server, protocol, "ensemble_baseline", predicted, tmp_path / "ens")
    for i, r in _by_prompt(text).items():
        assert (r["accepted_prediction_tokens"], r["rejected_prediction_tokens"]) == (
            spec[i]["accepted_prediction_tokens"], spec[i]["rejected_prediction_tokens"])
        assert r["output_text"] == spec[i]["output_text"]
        assert r["prediction_recount"] is None and r["prediction_recount_note"] == TEXT_ONLY
    # the BLS forwards it to the speculative tensorrt_llm model: counts returned, adding up
    _, bls = _bench(tiny_server, protocol, "tensorrt_llm_bls", predicted, tmp_path / "bls",
                    baseline=False)
    for i, r in _by_prompt(bls).items():
        n_pred = len(codec.encode(preds[i], special=False))
        assert r["accepted_prediction_tokens"] + r["rejected_prediction_tokens"] == n_pred
        assert r["output_text"] == spec[i]["output_text"]   # lossless
