"""Acceptance that survives the Dynamo frontend (marker ``dynamo``): two workers per name, each
exporting vLLM's spec_decode counters on its own port; ``specserve bench --serve-json`` (the
serve command's JSON) sums the workers' deltas, and the sum equals what the same requests give
through the reference decoder and, for the same engine, through the Triton model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.server import make_tiny_engine

pytestmark = pytest.mark.dynamo

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os",
           "if __name__ == '__main__':", "print(i, i * i)"]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from specserve.frontends.dynamo_serve import (
        DynamoDeployment,
        DynamoServeConfig,
        ServedModel,
    )

    root = Path(tmp_path_factory.mktemp("dynamo-acc"))
    ngram = make_tiny_engine(tiny_ckpt, root / "engine-ngram", "ngram")  # some drafts rejected
    same = make_tiny_engine(tiny_ckpt, root / "engine-draft-all", "draft", True)
    cfg = DynamoServeConfig(engine=ngram, models=(ServedModel("ngram"),
                                                  ServedModel("draft-all", engine=same)),
                            workers=2, log_dir=root / "logs")
    with DynamoDeployment(cfg) as dep:
        serve_json = root / "serve.json"
        serve_json.write_text(json.dumps(dep.describe()))
        yield dep, serve_json, {"ngram": ngram, "draft-all": same}, root


def _bench(args: list[str], out: Path) -> dict[str, Any]:
    from click.testing import CliRunner

    from specserve.cli.main import cli

    res = CliRunner().invoke(cli, ["bench", *args, "--requests", str(len(PROMPTS)),
                                   "--warmup", "0", "--max-tokens", str(MAX_TOKENS),
                                   "--temperature", "0", "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.output))


def _dataset(root: Path) -> Path:
    p = root / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in PROMPTS))
    return p


def _spec(summary: dict[str, Any]) -> dict[str, Any]:
    return dict(summary["variants"]["spec"])


def _reference(engine: Path) -> dict[str, Any]:
    """Steps, drafts, accepted and per-position counts of PROMPTS through the reference
    decoder (speculation on, greedy, one request at a time, no end id: ``--ignore-eos``)."""
    from specserve.runtime.params import SamplingParams
    from specserve.serving.engine import load_decoder

    decoder, tok, _ = load_decoder(str(engine), speculation=True)
    tot = {"steps": 0, "draft_tokens": 0, "accepted_draft_tokens": 0}
    per_pos: list[int] = []
    for prompt in PROMPTS:
        (res,) = decoder.generate([list(tok(prompt)["input_ids"])],
                                  SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
        st = res.stats.to_dict()
        tot["steps"] += st["steps"]
        tot["draft_tokens"] += st["draft_tokens"]
        tot["accepted_draft_tokens"] += st["accepted_tokens"]
        for k, n in enumerate(st["per_position_accepted"]):
            per_pos += [0] * (k + 1 - len(per_pos))
            per_pos[k] += n
    return {**tot, "per_position_accepted": per_pos}


def test_summed_worker_counters_equal_the_reference(served: Any) -> None:
    dep, serve_json, engines, root = served
    summary = _bench(["--serve-json", str(serve_json), "--model", "ngram", "--ignore-eos",
                      "--dataset", str(_dataset(root))], root / "bench-ngram")
    got = _spec(summary)["engine_counters"]
    want = _reference(engines["ngram"])
    assert {k: got[k] for k in want} == want
    assert 0 < want["accepted_draft_tokens"] < want["draft_tokens"]  # a partial acceptance
    # round-robin: both workers served some of the requests, so the sum is a real sum
    from tests.frontends.test_dynamo_e2e import _counter

    per_worker = [_counter(w.metrics_url, "vllm:spec_decode_num_drafts_total")
                  for w in dep.workers if w.model == "ngram"]
    assert len(per_worker) == 2 and all(n > 0 for n in per_worker), per_worker


@pytest.mark.server
def test_counters_equal_what_triton_reports(served: Any, tiny_server: Any) -> None:
    """The same engine (draft = target) benchmarked through Triton's ensemble (per-request
    spec_stats_json) and behind Dynamo (two workers' counters)."""
    _, serve_json, _, root = served
    data = _dataset(root)
    dynamo = _spec(_bench(["--serve-json", str(serve_json), "--model", "draft-all",
                           "--ignore-eos", "--dataset", str(data)], root / "bench-dyn"))
    triton = _spec(_bench(["--url", tiny_server.server.grpc_url, "--end-id", "-1",
                           "--dataset", str(data)], root / "bench-triton"))
    acc = triton["acceptance"]
    got = dynamo["engine_counters"]
    assert got["steps"] > 0
    assert (got["steps"], got["draft_tokens"], got["accepted_draft_tokens"]) == (
        acc["steps"], acc["draft_tokens"], acc["accepted_draft_tokens"]), (got, acc)
