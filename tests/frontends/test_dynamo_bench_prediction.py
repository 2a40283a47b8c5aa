"""``specserve bench --protocol openai`` sends Predicted Outputs through NVIDIA Dynamo's real
frontend (marker ``dynamo``): by default in ``nvext.annotations`` (``"prediction:<text>"``), and
the worker's counts come back in ``usage.completion_tokens_details``, recorded per request (no
recount: the door answers text only); OpenAI's top-level field (``--prediction-field openai``)
is refused by this frontend, every request then an error, never a made-up count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.server import make_tiny_engine

pytestmark = pytest.mark.dynamo

PROMPTS = ["def add(a, b):", "import os\nimport", "Hello world"]


@pytest.fixture(scope="module")
def served(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    root = Path(tmp_path_factory.mktemp("dynamo-bench-prediction"))
    engine = make_tiny_engine(tiny_ckpt, root / "engine-draft-all", "draft", True)
    dep = DynamoDeployment(DynamoServeConfig(
        engine=engine, models=(ServedModel("plain", speculation=False, engine=engine),),
        max_batch=2, log_dir=root / "logs"))
    dep.start(240)
    try:
        yield dep
    finally:
        dep.stop()


def _bench(dep: Any, dataset: Path, out: Path, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    from specserve.client.config import BenchmarkConfig, host_port
    from specserve.client.run import run_benchmark

    cfg = BenchmarkConfig(url=host_port(dep.url), protocol="openai", out=str(out),
                          model="plain", requests=len(PROMPTS), warmup=0, dataset=str(dataset),
                          max_tokens=16, temperature=0.0, scrape_metrics=False,
                          abort_after_errors=10, **kw)
    res = run_benchmark(cfg, progress=False, plots=False)
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return res.summary, sorted(recs, key=lambda r: r["prompt_index"])


def test_bench_sends_the_prediction_in_nvext_and_reads_the_counts(served: Any,
                                                                   tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    _, first = _bench(served, plain, tmp_path / "first")
    assert all(r["status"] == "completed" for r in first)
    assert not any(r["prediction_sent"] for r in first)
    pred = tmp_path / "pred.jsonl"
    pred.write_text("".join(json.dumps({"prompt": p, "prediction": r["output_text"]}) + "\n"
                            for p, r in zip(PROMPTS, first, strict=True)))
    summary, recs = _bench(served, pred, tmp_path / "pred")
    for r, before in zip(recs, first, strict=True):
        assert r["status"] == "completed" and r["prediction_sent"]
        assert r["output_text"] == before["output_text"]      # lossless
        assert r["accepted_prediction_tokens"] is not None
        assert r["rejected_prediction_tokens"] is not None
        assert r["prediction_recount"] is None and r["prediction_recount_note"]
    # its own answer as the prediction: drafts accepted
    assert summary["prediction"]["spec"]["accepted_prediction_tokens"] > 0
    _, refused = _bench(served, pred, tmp_path / "openai", prediction_field="openai")
    assert all(r["status"] == "error" and "prediction" in r["error"] for r in refused)
    assert not any(r["accepted_prediction_tokens"] is not None for r in refused)
