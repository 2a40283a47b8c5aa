"""A real tritonserver serving a tiny reference engine (draft = target, so greedy speculation
accepts every draft): gRPC streaming, HTTP generate/generate_stream, equality with
``specserve generate --engine``, perf outputs, 8 concurrent streams, baseline and BLS.
One server for the whole module (fixture ``tiny_server``)."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
from typing import Any

import numpy as np
import pytest

from tests.helpers.server import StreamError, grpc_stream, request, scalar, text_of

pytestmark = pytest.mark.server

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os",
           "if __name__ == '__main__':", "print(i, i * i)", "self.x = x", "return a + b"]
def test_streaming_grpc_returns_text_several_tokens_per_step(tiny_server: Any) -> None:
    res = grpc_stream(tiny_server.server.grpc_url, "ensemble",
                      request(PROMPTS[0], 16, stream=True, return_num_output_tokens=True,
                              return_perf_metrics=True))
    assert res[-1]["final"] and not any(r["final"] for r in res[:-1])
    chunks = [scalar(r, "num_output_tokens") for r in res]
    assert sum(chunks) == 16  # per chunk (the final one carries tokens held back, if any)
    stats = json.loads(scalar(res[-1], "spec_stats_json"))
    # draft = target: the prefill token, then K + 1 = 5 tokens per verify step. A step that
    # ends inside a multi-byte character is held back and sent with the next one, so every
    # chunk boundary is a step boundary and there is at most one chunk per step.
    assert stats["steps"] == 3 and max(chunks) >= 5
    bounds = list(itertools.accumulate(c for c in chunks if c))
    assert set(bounds) <= {1, 6, 11, 16} and bounds[-1] == 16, chunks
    assert text_of(res)


def test_http_generate_and_generate_stream(tiny_server: Any) -> None:
    srv = tiny_server.server
    conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=60)
    body = {"text_input": PROMPTS[1], "max_tokens": 10, "end_id": -1,
            "exclude_input_in_output": True}
    conn.request("POST", "/v2/models/ensemble/generate", json.dumps(body))
    one = json.loads(conn.getresponse().read())
    assert "error" not in one and one["text_output"]
    conn.request("POST", "/v2/models/ensemble/generate_stream",
                 json.dumps({**body, "stream": True, "return_num_output_tokens": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    events = [json.loads(line[5:]) for line in resp.read().decode().splitlines()
              if line.startswith("data:")]
    assert sum(e["num_output_tokens"] for e in events) == 10 and len(events) >= 2
    conn.close()


def test_greedy_output_equals_generate_cli(tiny_server: Any) -> None:
    from click.testing import CliRunner

    from specserve.cli.main import cli

    res = CliRunner().invoke(cli, ["generate", "--engine", str(tiny_server.engine), "--prompt",
                                   PROMPTS[2], "--max-tokens", "12", "--ignore-eos",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    local = json.loads(res.output)
    served = grpc_stream(tiny_server.server.grpc_url, "ensemble",
                         request(PROMPTS[2], 12, exclude_input_in_output=True))
    assert text_of(served) == local["text"]
    # token for token, through tensorrt_llm directly (prompt ids from the engine's tokenizer)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_server.engine / "tokenizer"))
    ids = list(tok(PROMPTS[2])["input_ids"])
    direct = grpc_stream(tiny_server.server.grpc_url, "tensorrt_llm", {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[12]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]], dtype=bool)})
    assert direct[0]["output_ids"].reshape(-1).tolist() == local["token_ids"]


def test_perf_outputs_present_and_consistent(tiny_server: Any) -> None:
    for stream in (False, True):
        res = grpc_stream(tiny_server.server.grpc_url, "ensemble",
                          request(PROMPTS[3], 12, stream=stream, return_perf_metrics=True))
        last = res[-1]
        drafted, accepted = (scalar(last, "total_draft_tokens"),
                             scalar(last, "total_accepted_draft_tokens"))
        assert 0 < accepted <= drafted
        assert scalar(last, "acceptance_rate") == pytest.approx(accepted / drafted)
        t = [scalar(last, k) for k in ("arrival_time_ns", "first_scheduled_time_ns",
                                       "first_token_time_ns", "last_token_time_ns")]
        assert t == sorted(t) and t[0] > 0
        stats = json.loads(scalar(last, "spec_stats_json"))
        assert (stats["draft_tokens"], stats["accepted_tokens"]) == (drafted, accepted)
    plain = grpc_stream(tiny_server.server.grpc_url, "ensemble", request(PROMPTS[3], 4))
    assert "acceptance_rate" not in plain[-1] and "spec_stats_json" not in plain[-1]


def test_eight_concurrent_streams_match_single_requests(tiny_server: Any) -> None:
    url = tiny_server.server.grpc_url
    go = threading.Barrier(len(PROMPTS))

    def run(p: str, wait: bool = False) -> list[dict[str, Any]]:
        if wait:
            go.wait(timeout=60)
        return grpc_stream(url, "ensemble", request(p, 12, stream=True,
                                                    return_perf_metrics=True))

    single = {p: text_of(run(p)) for p in PROMPTS}
    results: dict[str, list[dict[str, Any]]] = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(p, run(p, True)))
               for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(results) == set(PROMPTS)
    for p in PROMPTS:
        assert text_of(results[p]) == single[p], p
    # in-flight batching: newcomers join at different steps, so "shared a batch" means that
    # some request was scheduled before another one had sent its last token
    spans = sorted((scalar(results[p][-1], "first_scheduled_time_ns"),
                    scalar(results[p][-1], "last_token_time_ns")) for p in PROMPTS)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans)), spans


def test_baseline_pipeline_is_lossless_without_drafts(tiny_server: Any) -> None:
    url = tiny_server.server.grpc_url
    spec = grpc_stream(url, "ensemble", request(PROMPTS[4], 12, return_perf_metrics=True))
    base = grpc_stream(url, "ensemble_baseline",
                       request(PROMPTS[4], 12, return_perf_metrics=True))
    assert text_of(base) == text_of(spec)
    assert scalar(base[-1], "total_draft_tokens") == 0
    assert scalar(spec[-1], "total_draft_tokens") > 0


def test_bls_streams_the_same_text(tiny_server: Any) -> None:
    url = tiny_server.server.grpc_url
    ens = grpc_stream(url, "ensemble", request(PROMPTS[5], 10, stream=True))
    bls = grpc_stream(url, "tensorrt_llm_bls",
                      request(PROMPTS[5], 10, stream=True, return_num_output_tokens=True))
    assert text_of(bls) == text_of(ens)
    assert sum(scalar(r, "num_output_tokens") for r in bls if "num_output_tokens" in r) == 10


def test_unsupported_input_is_reported_on_the_stream(tiny_server: Any) -> None:
    with pytest.raises(StreamError, match="input 'beam_width' is not supported"):
        grpc_stream(tiny_server.server.grpc_url, "ensemble",
                    request(PROMPTS[6], 4, beam_width=2))


def test_bad_requests_fail_alone(tiny_server: Any) -> None:
    url = tiny_server.server.grpc_url
    good: dict[str, Any] = {}
    t = threading.Thread(target=lambda: good.setdefault(
        "r", grpc_stream(url, "ensemble", request(PROMPTS[7], 12, stream=True))))
    t.start()
    with pytest.raises(StreamError, match=r"top_p must be in \(0, 1\]"):
        grpc_stream(url, "ensemble", request(PROMPTS[7], 4, top_p=0.0))
    with pytest.raises(StreamError,
                       match="request_output_len 100000 exceeds the engine's max_seq_len"):
        grpc_stream(url, "ensemble", request(PROMPTS[7], 100000))
    t.join(timeout=120)
    assert text_of(good["r"])


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_prediction_top_logprobs_and_num_draft_tokens_through_each_pipeline(
        tiny_server: Any, model: str) -> None:
    """The reference model's own inputs reach it through the ensemble and the BLS: a prediction
    (its accepted / rejected token counts come back on the final response, the text
    unchanged: the tiny model's text does not tokenize back to its tokens, so the counts, not
    their split, are checked), top log-probs (k per token), and num_draft_tokens 0 (nothing
    drafted)."""
    url = tiny_server.server.grpc_url
    want = text_of(grpc_stream(url, model, request(PROMPTS[2], 12, stream=True)))
    asked = request(PROMPTS[2], 12, stream=True, return_log_probs=True, num_top_log_probs=2)
    asked["prediction"] = np.array([[want.encode()]], dtype=object)
    got = grpc_stream(url, model, asked)
    assert text_of(got) == want
    counts = [(scalar(r, "accepted_prediction_tokens"), scalar(r, "rejected_prediction_tokens"))
              for r in got if "accepted_prediction_tokens" in r]
    assert len(counts) == 1 and sum(counts[0]) > 0, counts  # the engine drafted from it
    tops = [r["top_log_probs"] for r in got if "top_log_probs" in r]
    assert tops and all(t.shape[-1] == 2 for t in tops)
    off = grpc_stream(url, model, request(PROMPTS[2], 12, stream=True, num_draft_tokens=0,
                                          return_perf_metrics=True))
    drafted = [scalar(r, "total_draft_tokens") for r in off if "total_draft_tokens" in r]
    assert text_of(off) == want and drafted and drafted[-1] == 0
