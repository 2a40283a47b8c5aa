"""The client against a real tritonserver on loopback serving the trivial ensemble-shaped model
(``tests.helpers.trivial_repo``): every request accounted for, token counts equal the
server's, acceptance agrees with the perf outputs, rejected requests and a dying server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specserve.client.config import BenchmarkConfig
from specserve.client.run import run_benchmark
from tests.helpers.trivial_repo import write_trivial_repo

pytestmark = pytest.mark.server

SIZES = (1, 3, 2, 4)     # tokens per step of model "trivial"
DRAFT_LEN = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from specserve.triton.server import TritonServer

    repo = write_trivial_repo(tmp_path_factory.mktemp("trivial") / "repo",
                              ",".join(map(str, SIZES)), DRAFT_LEN, step_delay_ms=2,
                              max_tokens_limit=100)
    srv = TritonServer(repo).start(timeout_s=60)
    try:
        yield srv
    finally:
        srv.stop()


def expected_chunks(n: int) -> list[int]:
    """The prefill token alone, then steps cycling through SIZES."""
    out, i = [1], 0
    while sum(out) < n:
        out.append(min(SIZES[i % len(SIZES)], n - sum(out)))
        i += 1
    return out


def _jsonl(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def _cfg(tmp_path: Path, url: str, **kw: object) -> BenchmarkConfig:
    base: dict[str, object] = dict(url=url, out=str(tmp_path / "out"), model="trivial",
                                   baseline_model="trivial_baseline", concurrency=3,
                                   requests=6, warmup=1, max_tokens=11, bootstrap=200)
    base.update(kw)
    return BenchmarkConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("protocol", "stream"), [("grpc", True), ("http", True),
                                                  ("grpc", False), ("http", False)])
def test_every_request_recorded_with_the_servers_counts(server, tmp_path: Path, protocol: str,
                                                        stream: bool) -> None:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    res = run_benchmark(_cfg(tmp_path, url, protocol=protocol, stream=stream), progress=False)
    assert res.exit_code == 0, res.summary
    recs = _jsonl(res.out)
    assert sorted(r["index"] for r in recs) == list(range(14))   # (6 + 1 warmup) x 2 variants
    assert {r["status"] for r in recs} == {"completed"}
    for r in recs:
        # The trivial model emits "t0 t1 ..." -- one word per token, max_tokens of them.
        assert r["output_text"].split() == [f"t{i}" for i in range(11)]
        assert r["output_tokens"] == 11 == r["spec_stats"]["emitted_tokens"] + 1
        assert r["token_count_source"] == "server"
        sizes = (expected_chunks(11) if r["variant"] == "spec" else [1] * 11) if stream else [11]
        assert r["chunk_tokens"] == sizes
        steps = len(expected_chunks(11)) - 1
        if r["variant"] == "spec":  # each step drafts DRAFT_LEN, accepts chunk size - 1
            assert r["server"]["total_draft_tokens"] == DRAFT_LEN * steps
            assert r["server"]["total_accepted_draft_tokens"] == 10 - steps
            assert r["server"]["acceptance_rate"] == pytest.approx(
                r["server"]["total_accepted_draft_tokens"] / r["server"]["total_draft_tokens"])
        assert isinstance(r["server"]["first_token_time_ns"], int)
        assert r["server"]["arrival_time_ns"] <= r["server"]["first_token_time_ns"] <= \
            r["server"]["last_token_time_ns"]
    spec = res.summary["variants"]["spec"]
    acc = spec["acceptance"]
    meas = [r for r in recs if r["variant"] == "spec" and r["phase"] == "measure"]
    assert acc["acceptance_rate"] == pytest.approx(
        sum(r["server"]["total_accepted_draft_tokens"] for r in meas)
        / sum(r["server"]["total_draft_tokens"] for r in meas))
    assert acc["tau_server"] == pytest.approx(10 / (len(expected_chunks(11)) - 1))
    if stream:
        assert acc["tau_stream"] == pytest.approx(acc["tau_server"])
    assert spec["completed"] == 6 and res.summary["variants"]["baseline"]["completed"] == 6
    assert set(res.summary["speedup"]) >= {"e2e_s", "ttft_s"}


def test_rejected_request_is_an_error_and_the_run_continues(server, tmp_path: Path) -> None:
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "a"}\n{"prompt": "b", "max_tokens": 500}\n{"prompt": "c"}\n')
    res = run_benchmark(_cfg(tmp_path, server.grpc_url, dataset=str(ds), baseline_model=None,
                             warmup=0, requests=6, concurrency=2), progress=False)
    recs = _jsonl(res.out)
    assert len(recs) == 6 and res.exit_code == 1
    bad = [r for r in recs if r["status"] == "error"]
    assert [r["prompt_index"] for r in bad] == [1, 4]
    assert all("exceeds the limit 100" in r["error"] for r in bad)
    assert res.summary["variants"]["spec"]["completed"] == 4
    assert res.summary["status"] == "partial"


def test_http_generate_200_with_error_body_is_an_error(server) -> None:
    # /generate on a request that streams several responses: Triton answers HTTP 200 with
    # {"error": ...} in the body; the transport must record it as an error.
    import asyncio

    from specserve.client.transport import RawResult
    from specserve.client.triton_http import HttpTransport

    async def call() -> RawResult:
        tr = HttpTransport(server.http_url)
        raw = RawResult()
        try:
            body = {"text_input": "x", "max_tokens": 5, "stream": True}
            await tr._post(await tr._sess(),
                           f"http://{server.http_url}/v2/models/trivial/generate", body, raw,
                           time.perf_counter())
        finally:
            await tr.close()
        return raw

    raw = asyncio.run(call())
    assert raw.error is not None and "exactly 1 response" in raw.error
    assert raw.end_s is None and raw.chunk_times_s == []


def test_server_dying_mid_run_leaves_a_partial_report(tmp_path: Path) -> None:
    from specserve.triton.server import TritonServer

    repo = write_trivial_repo(tmp_path / "repo", "1,2", 1, step_delay_ms=20)
    srv = TritonServer(repo).start(timeout_s=60)
    out = tmp_path / "out"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specserve.cli.main", "bench", "--url", srv.grpc_url,
             "--model", "trivial", "--requests", "200", "--warmup", "0", "--concurrency", "4",
             "--max-tokens", "30", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = out / "requests.jsonl"
            if p.exists() and len(p.read_text().splitlines()) >= 4:
                break
            time.sleep(0.1)
        srv.stop()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        srv.stop()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    recs = _jsonl(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "partial" and summary["aborted"]
    assert len(recs) == summary["records"]["total"] < 200
    assert sorted(r["index"] for r in recs) == list(range(len(recs)))  # no gaps: none dropped
    assert sum(r["status"] == "completed" for r in recs) >= 4
    assert any(r["status"] == "error" for r in recs)
    assert "Traceback" not in stderr


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ctrl_c_records_in_flight_requests_as_cancelled(server, tmp_path: Path,
                                                        protocol: str) -> None:
    import signal

    out = tmp_path / "out"
    url = server.grpc_url if protocol == "grpc" else server.http_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "specserve.cli.main", "bench", "--url", url, "--protocol",
         protocol, "--model", "trivial", "--requests", "500", "--warmup", "0",
         "--concurrency", "3", "--max-tokens", "60", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = out / "requests.jsonl"
            if p.exists() and len(p.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    recs = _jsonl(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["records"]["total"] == len(recs) < 500
    assert sorted(r["index"] for r in recs) == list(range(len(recs)))
    assert sum(r["status"] == "cancelled" for r in recs) == summary["records"]["cancelled"] >= 1
