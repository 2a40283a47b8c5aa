"""``specserve bench --protocol openai`` against a scripted vLLM-format server: token counts from
``usage`` (never chunk counts), per-chunk counts from continuous usage, per-request and counter
acceptance, the silent-rejection flag, and bad input as one line. The real peer: test_peers_vllm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specserve.client.config import BenchmarkConfig
from specserve.client.run import run_benchmark
from specserve.errors import ServerError
from tests.helpers.openai_server import Script, ScriptedOpenAI, chunk_texts, plan

MAX = 23


def _cfg(tmp_path: Path, url: str, **kw: object) -> BenchmarkConfig:
    base: dict[str, object] = dict(url=url, out=str(tmp_path / "out"), protocol="openai",
                                   model="demo", concurrency=2, requests=5, warmup=1,
                                   max_tokens=MAX, bootstrap=100, temperature=0.0)
    base.update(kw)
    return BenchmarkConfig(**base)  # type: ignore[arg-type]


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_stream_counts_tokens_from_usage_and_reads_vllm_acceptance(tmp_path: Path,
                                                                  endpoint: str) -> None:
    script = Script()
    with ScriptedOpenAI(script) as srv:
        outcome = run_benchmark(_cfg(tmp_path, srv.url, endpoint=endpoint), progress=False,
                                plots=False)
    assert outcome.exit_code == 0
    recs = _records(Path(outcome.out))
    assert len(recs) == 6 and all(r["status"] == "completed" for r in recs)
    want = plan(MAX, script.steps)            # [1, 5, 3, 1, 4, 5, 3, 1]
    for r in recs:
        assert r["chunk_tokens"] == want and r["output_tokens"] == MAX
        assert r["token_count_source"] == "usage"
        assert r["acceptance_source"] == "vllm: response metrics.speculative_decoding"
        assert len(r["itl_token_s"]) == MAX - 1   # one ITL value per token after the first
    acc = outcome.summary["variants"]["spec"]["acceptance"]
    steps, accepted = len(want) - 1, sum(c - 1 for c in want[1:])
    assert acc["tau_stream"] == pytest.approx(sum(want[1:]) / steps)
    assert acc["tau_server"] == pytest.approx(1 + accepted / steps)
    assert acc["acceptance_rate"] == pytest.approx(accepted / (steps * 4))
    assert acc["draft_tokens"] == 5 * steps * 4
    assert acc["per_position_acceptance"] == pytest.approx(
        [sum(c - 1 > j for c in want[1:]) / steps for j in range(4)])
    # the server's counters over the measured phase: the same totals (warmup excluded)
    cnt = outcome.summary["variants"]["spec"]["engine_counters"]
    assert cnt["source"] == "vllm: Prometheus vllm:spec_decode_* delta"
    assert (cnt["steps"], cnt["accepted_draft_tokens"]) == (5 * steps, 5 * accepted)
    assert cnt["per_position_accepted"] == [
        5 * sum(c - 1 > j for c in want[1:]) for j in range(4)]
    assert outcome.summary["flags"] == []
    sent = script.requests[-1]
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert ("messages" in sent) == (endpoint == "chat") and sent["temperature"] == 0.0


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("split, want", [
    ((0,), [6, 3, 1, 4, 5, 3, 1]),        # the prefill token starts a character
    ((2, 6), [1, 5, 4, 4, 5, 4]),         # 3 byte tokens of a 4-byte character, twice
    ((3,), [1, 5, 3, 5, 5, 3, 1]),        # one byte token of a 2-byte character
    ((7,), [1, 5, 3, 1, 4, 5, 4]),        # the stream ends inside a character: the last chunk
])
def test_chunks_without_text_count_with_the_chunk_that_shows_them(
        tmp_path: Path, endpoint: str, split: tuple[int, ...], want: list[int]) -> None:
    """vLLM holds back an incomplete character: a chunk carries tokens (in usage) but no text,
    the next one completes the character. Those tokens count with it, exactly: per-chunk
    tokens, tau_stream and one ITL value per token after the first chunk; the counts are the
    server's (no rescaling to usage)."""
    script = Script(split_chars=split)
    with ScriptedOpenAI(script) as srv:
        outcome = run_benchmark(_cfg(tmp_path, srv.url, endpoint=endpoint), progress=False,
                                plots=False)
    assert outcome.exit_code == 0
    assert plan(MAX, script.steps) == [1, 5, 3, 1, 4, 5, 3, 1]
    text = "".join(chunk_texts(plan(MAX, script.steps), split))
    for r in _records(Path(outcome.out)):
        assert r["chunk_tokens"] == want and r["output_tokens"] == MAX
        assert r["token_count_source"] == "usage"
        assert len(r["chunk_times_s"]) == len(want) == 8 - len(split)
        assert len(r["itl_token_s"]) == MAX - want[0]
        assert r["output_text"] == text and "\ufffd" not in text
    acc = outcome.summary["variants"]["spec"]["acceptance"]
    assert acc["tau_stream"] == pytest.approx((MAX - want[0]) / (len(want) - 1))


@pytest.mark.parametrize("trtllm", [False, True], ids=["vllm-counters", "trtllm-perf"])
def test_replicas_counters_are_read_on_each_and_summed(tmp_path: Path, trtllm: bool) -> None:
    """--url A --url B: each replica's counters (or /perf_metrics) are read around the phase
    and summed, so the run's engine acceptance covers every measured request (the warmup one,
    served by A, excluded), wherever the balancer sent it."""
    scripts = [Script(trtllm_perf=trtllm, per_request_metrics=not trtllm) for _ in range(2)]
    with ScriptedOpenAI(scripts[0]) as a, ScriptedOpenAI(scripts[1]) as b:
        outcome = run_benchmark(_cfg(tmp_path, a.url, replicas=(b.url,)), progress=False,
                                plots=False)
    assert outcome.exit_code == 0
    assert [len(s.requests) for s in scripts] == [3, 3]   # warmup and 2 measured on A, 3 on B
    want = plan(MAX, Script().steps)
    steps, accepted = len(want) - 1, sum(c - 1 for c in want[1:])
    cnt = outcome.summary["variants"]["spec"]["engine_counters"]
    assert (cnt["draft_tokens"], cnt["accepted_draft_tokens"]) == (5 * steps * 4, 5 * accepted)
    if trtllm:
        assert cnt["source"] == "trtllm: /perf_metrics speculative_decoding"
        return
    assert cnt["source"] == "vllm: Prometheus vllm:spec_decode_* delta"
    assert cnt["steps"] == 5 * steps
    assert cnt["per_position_accepted"] == [
        5 * sum(c - 1 > j for c in want[1:]) for j in range(4)]


def test_trtllm_perf_metrics_give_the_phase_acceptance(tmp_path: Path) -> None:
    """trtllm-serve: no per-request field, /perf_metrics drained before and read after."""
    with ScriptedOpenAI(Script(trtllm_perf=True, per_request_metrics=False)) as srv:
        outcome = run_benchmark(_cfg(tmp_path, srv.url), progress=False, plots=False)
    want = plan(MAX, Script().steps)
    cnt = outcome.summary["variants"]["spec"]["engine_counters"]
    assert cnt["source"] == "trtllm: /perf_metrics speculative_decoding"
    assert cnt["draft_tokens"] == 5 * 4 * (len(want) - 1)   # the warmup request drained
    assert cnt["accepted_draft_tokens"] == 5 * sum(c - 1 for c in want[1:])


def test_without_continuous_usage_the_total_is_still_usage(tmp_path: Path) -> None:
    """A server that sends usage only at the end: the chunk split is a guess, the total is not."""
    script = Script(continuous_usage=False)
    with ScriptedOpenAI(script) as srv:
        outcome = run_benchmark(_cfg(tmp_path, srv.url, concurrency=1), progress=False,
                                plots=False)
    recs = _records(Path(outcome.out))
    assert all(r["output_tokens"] == MAX for r in recs)
    assert {r["token_count_source"] for r in recs} == {"usage+chunks"}
    assert all(sum(r["chunk_tokens"]) == MAX and min(r["chunk_tokens"]) >= 1 for r in recs)


def test_non_streaming_one_chunk_with_usage(tmp_path: Path) -> None:
    with ScriptedOpenAI(Script()) as srv:
        outcome = run_benchmark(_cfg(tmp_path, srv.url, stream=False, ignore_eos=True),
                                progress=False, plots=False)
    recs = _records(Path(outcome.out))
    assert all(r["chunk_tokens"] == [MAX] and r["ttft_s"] == r["e2e_s"] for r in recs)
    want = plan(MAX, Script().steps)   # the steps behind the one body: its metrics' tau
    assert outcome.summary["variants"]["spec"]["acceptance"]["tau_server"] == pytest.approx(
        1 + sum(c - 1 for c in want[1:]) / (len(want) - 1))


def test_baseline_server_interleaved_and_speedup(tmp_path: Path) -> None:
    with ScriptedOpenAI(Script(gap_s=0.002)) as spec, \
            ScriptedOpenAI(Script(steps=(1,), gap_s=0.004, per_request_metrics=False,
                                  drafts_counted=False)) as base:
        outcome = run_benchmark(_cfg(tmp_path, spec.url, baseline_url=base.url),
                                progress=False, plots=True)
    s = outcome.summary
    assert s["variants"]["baseline"]["acceptance"]["tau_stream"] == 1.0
    assert s["variants"]["baseline"]["flags"] == []
    assert s["speedup"]["per_user_tok_s"]["speedup"] > 1.5   # 4.6 tokens per gap vs 1 at 2x gap
    assert "acceptance from" in (Path(outcome.out) / "README.md").read_text()


@pytest.mark.parametrize("kw, flag", [
    (dict(steps=(1,)), "rejects (nearly) every draft"),
    (dict(per_request_metrics=False, drafts_counted=False), "reports no drafted tokens"),
])
def test_speculation_that_does_nothing_is_flagged(tmp_path: Path, kw: dict, flag: str) -> None:
    with ScriptedOpenAI(Script(**kw)) as srv:  # type: ignore[arg-type]
        outcome = run_benchmark(_cfg(tmp_path, srv.url), progress=False, plots=False)
    assert any(flag in f for f in outcome.summary["flags"]), outcome.summary["flags"]
    assert flag in (Path(outcome.out) / "README.md").read_text()


@pytest.mark.parametrize("kw, error", [
    (dict(fail_status=429), "HTTP 429: Server busy, retry later"),
    (dict(fail_status=503), "HTTP 503: Server busy, retry later"),
    (dict(cut_after=3), "stream cut: the server closed it before [DONE] after 3 chunks"),
])
def test_failed_requests_are_errors_in_a_partial_report(tmp_path: Path, kw: dict,
                                                       error: str) -> None:
    with ScriptedOpenAI(Script(**kw)) as srv:  # type: ignore[arg-type]
        outcome = run_benchmark(_cfg(tmp_path, srv.url, warmup=0), progress=False, plots=False)
    recs = _records(Path(outcome.out))
    assert outcome.exit_code == 1 and outcome.summary["status"] == "partial"
    assert recs and {r["error"] for r in recs} == {error}
    assert (Path(outcome.out) / "summary.json").exists()


def test_server_overloaded_mid_run_keeps_what_completed(tmp_path: Path) -> None:
    """503s after 4 answers: those 4 stay in the report, the run stops after 5 failures."""
    with ScriptedOpenAI(Script(fail_status=503, fail_after=4)) as srv:
        outcome = run_benchmark(_cfg(tmp_path, srv.url, requests=20, concurrency=1),
                                progress=False, plots=True)
    recs = _records(Path(outcome.out))
    assert [r["status"] for r in recs] == ["completed"] * 4 + ["error"] * 5
    assert outcome.exit_code == 1 and "5 failed requests in a row" in outcome.summary["aborted"]
    assert outcome.summary["variants"]["spec"]["completed"] == 3   # + 1 warmup
    assert (Path(outcome.out) / "README.md").exists()


def test_unserved_model_and_non_openai_server_fail_before_any_request(tmp_path: Path) -> None:
    with ScriptedOpenAI(Script()) as srv:
        with pytest.raises(ServerError, match=r"model 'nope' is not served here \(it serves: "
                                              r"demo\)"):
            run_benchmark(_cfg(tmp_path, srv.url, model="nope"), progress=False, plots=False)
    script = Script(not_openai=True)
    with ScriptedOpenAI(script) as srv:
        with pytest.raises(ServerError, match="does not answer as an OpenAI-compatible server "
                                              r"\(GET /v1/models: HTTP 404"):
            run_benchmark(_cfg(tmp_path, srv.url), progress=False, plots=False)
    assert script.requests == []


def test_cli_unreachable_url_is_one_line_exit_3(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "specserve.cli.main", "bench", "--protocol", "openai",
         "--url", "http://127.0.0.1:9/v1", "--model", "demo", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:9: cannot connect" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()
