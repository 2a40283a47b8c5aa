"""``specserve bench`` against the real stack on loopback: tiny reference engine (n-gram
speculation, so drafts do get accepted) behind tritonserver, with the no-speculation baseline
(``ensemble_baseline``) in the same server (``tests.helpers.server.serve_tiny``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from specserve.client.config import BenchmarkConfig
from specserve.client.run import run_benchmark
from tests.helpers.server import TEARDOWN_STOP_S

pytestmark = pytest.mark.server

PROMPTS = ["def add(a, b):\n    return", "for i in range(10):\n", "import os\nimport",
           "class Point:\n    def __init__(self, x, y):\n"]
TOO_LONG = "x = 1\n" * 400     # longer than the tiny model's 512 positions: rejected


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, tiny_ckpt) -> Iterator[object]:
    import torch

    torch.set_num_threads(1)
    from tests.helpers.server import serve_tiny

    dep = serve_tiny(tmp_path_factory.mktemp("bench-real"), spec_mode="ngram", ckpt=tiny_ckpt)
    try:
        yield dep
    finally:
        dep.server.stop(timeout_s=TEARDOWN_STOP_S)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prompts with a too-long one third (prompt index 2)."""
    f = tmp_path_factory.mktemp("ds") / "prompts.jsonl"
    rows = [{"prompt": p} for p in PROMPTS[:2]] + [{"prompt": TOO_LONG}] + \
        [{"prompt": p} for p in PROMPTS[2:]]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


@pytest.fixture(scope="module")
def good_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("ds") / "good.jsonl"
    f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return f


def _run(dep, dataset: Path, out: Path, protocol: str, stream: bool,
         concurrency: int = 1) -> tuple[dict, list[dict]]:
    # Concurrency 1 where a request is rejected: the reference tensorrt_llm model batches
    # concurrent requests, and a failure of one fails its whole batch.
    url = dep.server.grpc_url if protocol == "grpc" else dep.server.http_url
    cfg = BenchmarkConfig(url=url, protocol=protocol, out=str(out), model="ensemble",
                          baseline_model="ensemble_baseline", concurrency=concurrency,
                          requests=5,
                          warmup=0, dataset=str(dataset), max_tokens=20, temperature=0.0,
                          stream=stream, bootstrap=200)
    res = run_benchmark(cfg, progress=False)
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return res.summary, recs


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bench_against_the_real_server(deployment, dataset: Path, tmp_path: Path,
                                       protocol: str) -> None:
    summary, recs = _run(deployment, dataset, tmp_path / "s", protocol, stream=True)
    # every request accounted for: 5 prompts x 2 variants, the too-long one rejected twice
    assert sorted(r["index"] for r in recs) == list(range(10))
    assert summary["records"] == {"total": 10, "warmup": 0, "completed": 8, "error": 2,
                                  "cancelled": 0}
    bad = [r for r in recs if r["status"] == "error"]
    assert {r["prompt_index"] for r in bad} == {2}
    assert all(re.search(r"max_input_len|max_position_embeddings", r["error"]) for r in bad)
    assert summary["status"] == "partial"

    for r in (r for r in recs if r["status"] == "completed"):
        st, sv = r["spec_stats"], r["server"]
        assert r["token_count_source"] == "server"
        # token counts equal the server's: the first token comes from the prefill, then every
        # verify step emits accepted + 1 tokens, streamed as one chunk (a step that ends inside
        # a multi-byte character is held back and goes with the next: at most one per step)
        sizes = [k for k in r["chunk_tokens"] if k > 0]
        assert r["output_tokens"] == sum(sizes) == st["emitted_tokens"] + 1
        assert len(sizes) <= st["steps"] + 1
        # acceptance agrees with the perf outputs
        assert sv["total_accepted_draft_tokens"] == st["accepted_tokens"]
        assert sv["total_draft_tokens"] == st["draft_tokens"]
        if r["variant"] == "baseline":
            assert sv["total_draft_tokens"] == 0 and st["steps"] == st["emitted_tokens"]
    spec = [r for r in recs if r["variant"] == "spec" and r["status"] == "completed"]
    acc = summary["variants"]["spec"]["acceptance"]
    drafted = sum(r["server"]["total_draft_tokens"] for r in spec)
    accepted = sum(r["server"]["total_accepted_draft_tokens"] for r in spec)
    assert drafted > 0 and acc["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert acc["steps"] == sum(r["spec_stats"]["steps"] for r in spec)
    assert accepted > 0, "n-gram drafts on the tiny model's repetitive output are accepted"
    assert acc["tau_server"] == pytest.approx(
        sum(r["spec_stats"]["emitted_tokens"] for r in spec) / acc["steps"])
    # at most one chunk per verify step: the stream's estimate is never below the server's
    assert acc["tau_stream"] >= acc["tau_server"] - 1e-9
    assert set(summary["speedup"]) >= {"e2e_s", "tpot_s"}


def test_non_streaming_counts_match_streaming(deployment, good_dataset: Path,
                                              tmp_path: Path) -> None:
    _, streamed = _run(deployment, good_dataset, tmp_path / "s", "grpc", True, concurrency=3)
    _, whole = _run(deployment, good_dataset, tmp_path / "w", "http", False, concurrency=3)
    key = lambda r: (r["variant"], r["prompt_index"])  # noqa: E731
    a = {key(r): r for r in streamed if r["status"] == "completed"}
    b = {key(r): r for r in whole if r["status"] == "completed"}
    assert a.keys() == b.keys() and len(a) == 10
    for k in a:
        assert len([c for c in b[k]["chunk_tokens"] if c > 0]) == 1
        assert b[k]["output_tokens"] == a[k]["output_tokens"]
        # (streamed text is decoded chunk by chunk, so partial UTF-8 pieces differ: not compared)
        assert b[k]["ttft_s"] == pytest.approx(b[k]["e2e_s"], abs=0.05)
    # greedy speculation is lossless: whole-text answers of spec and baseline agree
    for pi in range(len(PROMPTS)):
        assert b[("spec", pi)]["output_text"] == b[("baseline", pi)]["output_text"]


def test_no_perf_outputs_sends_a_plain_request(deployment, good_dataset: Path,
                                               tmp_path: Path) -> None:
    """``--no-perf-outputs`` (what genai-perf sends): no perf outputs, no per-response counts,
    so the server reports no acceptance and tokens are counted by re-tokenizing."""
    cfg = BenchmarkConfig(url=deployment.server.grpc_url, out=str(tmp_path / "p"),
                          concurrency=1, requests=4, warmup=0, dataset=str(good_dataset),
                          max_tokens=12, temperature=0.0, bootstrap=50, perf_outputs=False,
                          tokenizer=str(deployment.ckpt.tokenizer))
    summary = run_benchmark(cfg, progress=False).summary
    recs = [json.loads(x) for x in (tmp_path / "p" / "requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recs] == ["completed"] * 4
    for r in recs:
        assert r["server"] == {} and r["spec_stats"] is None
        assert r["token_count_source"] == "tokenizer"
    assert summary["config"]["perf_outputs"] is False
    assert summary["variants"]["spec"]["acceptance"].get("acceptance_rate") is None
