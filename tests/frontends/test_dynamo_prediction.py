"""Predicted Outputs and ``num_draft_tokens`` through NVIDIA Dynamo's real frontend (marker
``dynamo``): the client puts them in ``nvext.annotations`` (``"prediction:<text>"``,
``"num_draft_tokens:<k>"``), the frontend hands them to the worker intact, and the engine drafts
from the prediction (the worker's draft counter grows on a worker that does not speculate) or
not at all (``num_draft_tokens`` 0 on one that does), the text unchanged. OpenAI's own
top-level ``prediction`` is refused by the frontend itself (400)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.dynamo import post
from tests.helpers.server import make_tiny_engine

pytestmark = pytest.mark.dynamo

DRAFTED = "vllm:spec_decode_num_draft_tokens_total"


@pytest.fixture(scope="module")
def served(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    root = Path(tmp_path_factory.mktemp("dynamo-prediction"))
    engine = make_tiny_engine(tiny_ckpt, root / "engine-draft-all", "draft", True)
    models = (ServedModel("plain", speculation=False, engine=engine),
              ServedModel("spec", engine=engine))
    dep = DynamoDeployment(DynamoServeConfig(engine=engine, models=models, max_batch=2,
                                             log_dir=root / "logs"))
    dep.start(240)
    try:
        yield dep
    finally:
        dep.stop()


def _drafted(dep: Any, model: str) -> float:
    from tests.frontends.test_dynamo_e2e import _counter

    (worker,) = [w for w in dep.workers if w.model == model]
    return _counter(worker.metrics_url, DRAFTED)


def _text(dep: Any, model: str, notes: list[str] | None = None) -> str:
    body: dict[str, Any] = {"model": model, "prompt": "def add(a, b):", "max_tokens": 12,
                            "temperature": 0}
    if notes is not None:
        body["nvext"] = {"annotations": notes}
    status, out = post(dep.url, "/v1/completions", body)
    assert status == 200, out
    return str(out["choices"][0]["text"])


def test_a_prediction_in_nvext_annotations_reaches_the_engine(served: Any) -> None:
    want = _text(served, "plain")
    before = _drafted(served, "plain")
    assert _text(served, "plain", [f"prediction:{want}"]) == want
    assert _drafted(served, "plain") > before  # drafted from the prediction alone


def test_num_draft_tokens_zero_in_nvext_annotations_turns_speculation_off(served: Any
                                                                            ) -> None:
    want = _text(served, "spec")
    before = _drafted(served, "spec")
    assert before > 0
    assert _text(served, "spec", ["num_draft_tokens:0"]) == want
    assert _drafted(served, "spec") == before


def test_openai_s_own_prediction_field_is_refused_by_the_frontend(served: Any) -> None:
    status, err = post(served.url, "/v1/completions", {
        "model": "plain", "prompt": "hi", "max_tokens": 4,
        "prediction": {"type": "content", "content": "hi"}})
    assert status == 400 and "Unsupported parameter(s): `prediction`" in err["message"], err
