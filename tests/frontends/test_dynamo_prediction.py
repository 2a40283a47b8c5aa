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




def test_prediction_counts_reach_the_client_in_usage_and_the_counters(served: Any) -> None:
    """The worker's ``completion_usage`` becomes the response's ``usage``: the accepted and
    rejected prediction tokens (the engine's count: that it equals the client's recount from
    the emitted tokens is checked at the Triton doors, where token ids come back; the tiny
    model's text does not survive a decode and re-encode), prompt and completion tokens equal
    to the frontend's own; and the worker's Prometheus counter by outcome grows by the same."""
    from tests.frontends.test_dynamo_e2e import _counter

    body: dict[str, Any] = {"model": "plain", "prompt": "def add(a, b):", "max_tokens": 12,
                            "temperature": 0}
    status, plain = post(served.url, "/v1/completions", body)
    assert status == 200, plain
    want = str(plain["choices"][0]["text"])
    (worker,) = [w for w in served.workers if w.model == "plain"]
    name = "specserve:prediction_tokens_total"
    before = [_counter(worker.metrics_url, name, outcome=o) for o in ("accepted", "rejected")]
    status, out = post(served.url, "/v1/completions",
                       {**body, "nvext": {"annotations": [f"prediction:{want} tail"]}})
    assert status == 200, out
    usage = out["usage"]
    counts = [usage["completion_tokens_details"][f"{o}_prediction_tokens"]
              for o in ("accepted", "rejected")]
    assert counts[0] >= 1 and counts[1] >= 1, usage  # drafted from the prediction, some kept
    assert counts[0] < usage["completion_tokens"]  # the prefill's token is never a draft
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        plain["usage"]["prompt_tokens"], plain["usage"]["completion_tokens"])
    after = [_counter(worker.metrics_url, name, outcome=o) for o in ("accepted", "rejected")]
    assert [a - b for a, b in zip(after, before, strict=True)] == counts
