"""Speculation driven from ``tensorrt_llm_bls`` (``num_draft_tokens`` > 0): what ``specserve repo``
writes for it, and, on a real tritonserver, the draft-target and n-gram loops over reference
repositories of tiny checkpoints.

Draft-target server: target = the tiny target, draft = the same model with noise on its lm_head
(about 60% of greedy drafts accepted, so steps both accept and reject). N-gram server: the tiny
target's n-gram engine; the BLS proposes by prompt lookup. Greedy output through the BLS must equal
``ensemble_baseline`` (speculation off) text for text.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.triton.repository import RepoOptions, write_repository
from tests.helpers.server import (
    TEARDOWN_STOP_S,
    StreamError,
    grpc_responses,
    grpc_stream,
    grpc_stream_many,
    make_fake_trtllm_engine,
    make_tiny_engine,
    request,
    scalar,
    text_of,
)
from tests.helpers.tiny import TinyCheckpoint
from tests.reliability.helpers import copy_bls_model, copy_llm_model

K = 4  # num_draft_tokens (the engines' max_draft_len)
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(", "class Point:", "x = 1\nx = 1\nx =",
           "hello world"]


def _params(repo: Path, model: str) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    mc = text_format.Parse((repo / model / "config.pbtxt").read_text(),
                           model_config_pb2.ModelConfig())
    return {k: v.string_value for k, v in mc.parameters.items()}


def _config(repo: Path, model: str) -> Any:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse((repo / model / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())


# --- the repository writer ---

def test_torch_draft_repo_serves_the_draft_checkpoint(tiny_ckpt: TinyCheckpoint,
                                                      tmp_path: Path) -> None:
    engine = make_tiny_engine(tiny_ckpt, tmp_path / "engine", "draft")
    repo = write_repository(engine, tmp_path / "repo", RepoOptions(baseline=True))
    draft = _config(repo, "tensorrt_llm_draft")
    assert draft.backend == "python" and not draft.model_transaction_policy.decoupled
    p = _params(repo, "tensorrt_llm_draft")
    assert p["specserve_checkpoint"] == "draft" and p["specserve_speculation"] == "off"
    assert p["gpt_model_path"] == str(engine.resolve())
    assert "specserve.triton.models.llm" in (repo / "tensorrt_llm_draft/1/model.py").read_text()
    assert "specserve_checkpoint" not in _params(repo, "tensorrt_llm")
    bls = _params(repo, "tensorrt_llm_bls")
    vocab = json.loads((engine / "target" / "config.json").read_text())["vocab_size"]
    assert bls == {**bls, "tensorrt_llm_model_name": "tensorrt_llm",
                   "tensorrt_llm_draft_model_name": "tensorrt_llm_draft",
                   "speculative_mode": "draft", "max_draft_len": str(K),
                   "tensorrt_llm_decoupled": "true", "tensorrt_llm_draft_decoupled": "false",
                   "tensorrt_llm_vocab_size": str(vocab), "ngram_max_size": ""}
    assert _config(repo, "tensorrt_llm").model_transaction_policy.decoupled


def test_bls_lib_is_copied_next_to_model_py(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    from specserve.triton.models import bls_lib

    engine = make_tiny_engine(tiny_ckpt, tmp_path / "engine", "ngram")
    repo = write_repository(engine, tmp_path / "repo")
    from specserve import serving

    src = Path(bls_lib.__file__).parent
    sources = {f.name: f for f in src.glob("*.py")}
    # the serving core's detokenizer goes with them (the BLS's streamed text)
    sources["detok.py"] = Path(serving.__file__).parent / "detok.py"
    expected = sorted(sources)
    assert {"spec_loop.py", "spec_io.py", "ngram.py", "detok.py", "background.py",
            "__init__.py"} <= set(expected)
    lib = repo / "tensorrt_llm_bls" / "1" / "lib"
    assert sorted(f.name for f in lib.iterdir()) == expected
    for name in expected:
        assert (lib / name).read_text() == sources[name].read_text(), name
    assert sorted(f.name for f in lib.parent.iterdir()) == ["lib", "model.py"]
    models = Path(bls_lib.__file__).parent.parent
    assert (lib.parent / "model.py").read_text() == (models / "bls.py").read_text()
    assert "from lib import background, ngram, spec_io, spec_loop" in \
        (lib.parent / "model.py").read_text()


def test_ngram_repo_has_prompt_lookup_and_no_draft_model(tiny_ckpt: TinyCheckpoint,
                                                         tmp_path: Path) -> None:
    engine = make_tiny_engine(tiny_ckpt, tmp_path / "engine", "ngram")
    repo = write_repository(engine, tmp_path / "repo")
    assert not (repo / "tensorrt_llm_draft").exists()
    bls = _params(repo, "tensorrt_llm_bls")
    assert (bls["speculative_mode"], bls["ngram_max_size"], bls["max_draft_len"]) == \
        ("ngram", "3", str(K))
    assert bls["tensorrt_llm_draft_model_name"] == "" and bls["tensorrt_llm_vocab_size"] == ""


@pytest.mark.parametrize("kind", ["draft", "ngram", "medusa"])
def test_bls_knows_how_the_target_is_called(tmp_path: Path, kind: str) -> None:
    """``tensorrt_llm_decoupled`` is the target's own transaction policy, whatever the writer
    decided for it; Medusa engines get no BLS speculation."""
    engine = make_fake_trtllm_engine(tmp_path, "medusa" if kind == "ngram" else kind)
    if kind == "ngram":
        cfg = json.loads((engine / "build_config.json").read_text())
        cfg.update(spec_mode="ngram", medusa_choices=None, max_draft_len=4)
        (engine / "build_config.json").write_text(json.dumps(cfg))
    for decoupled in (True, False):
        repo = write_repository(engine, tmp_path / f"repo-{decoupled}",
                                RepoOptions(decoupled=decoupled))
        target = _config(repo, "tensorrt_llm").model_transaction_policy.decoupled
        bls = _params(repo, "tensorrt_llm_bls")
        assert bls["tensorrt_llm_decoupled"] == ("true" if target else "false")
        assert bls["speculative_mode"] == ("" if kind == "medusa" else kind)
        assert bls["max_draft_len"] == ("" if kind == "medusa" else
                                        str(json.loads((engine / "build_config.json")
                                                       .read_text())["max_draft_len"]))


# --- served ---

BADVOCAB_STUB = '''import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """TEST stub draft: zeros, with generation_logits of a foreign vocabulary."""

    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.vocab = int(params["stub_vocab_size"]["string_value"])

    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "request_output_len")
                    .as_numpy().reshape(-1)[0])
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("output_ids", np.zeros((1, 1, n), np.int32)),
                pb_utils.Tensor("sequence_length", np.array([[n]], np.int32)),
                pb_utils.Tensor("generation_logits", np.zeros((1, 1, n, self.vocab),
                                                              np.float32))]))
        return out
'''
NO_PROPOSALS = ("DEFAULT_MAX_NGRAM = 3\n\n\ndef propose(context, k, max_ngram=3, min_ngram=1):\n"
                "    return []\n")


def noisy_lm_head(src: Path, dst: Path, sigma: float, seed: int = 0) -> Path:
    """A copy of an HF checkpoint with Gaussian noise (sigma x the weights' std) on lm_head."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    w = tensors["lm_head.weight"]
    g = torch.Generator().manual_seed(seed)
    tensors["lm_head.weight"] = w + sigma * w.std() * torch.randn(w.shape, generator=g)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def dt_server(tiny_ckpt: TinyCheckpoint,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import torch

    from specserve.build.builder import build_engine
    from specserve.build.config import BuildConfig
    from specserve.triton.server import TritonServer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bls-dt")
    draft = noisy_lm_head(tiny_ckpt.target, root / "draft", 0.15)
    engine = root / "engine"
    build_engine(BuildConfig(model=str(tiny_ckpt.target), out=str(engine), spec_mode="draft",
                             backend="torch", dtype="float32", max_batch_size=8,
                             draft=str(draft), max_draft_len=K))
    repo = write_repository(engine, root / "repo", RepoOptions(baseline=True), force=True)
    vocab = _params(repo, "tensorrt_llm_bls")["tensorrt_llm_vocab_size"]
    copy_bls_model(repo, "tensorrt_llm_bls_nodraft",
                   {"tensorrt_llm_draft_model_name": "tensorrt_llm_draft_missing"})
    copy_llm_model(repo, "tensorrt_llm_draft_badvocab", model_py=BADVOCAB_STUB,
                   extra_params={"stub_vocab_size": str(int(vocab) + 5)})
    cfg = (repo / "tensorrt_llm_draft_badvocab" / "config.pbtxt").read_text()
    (repo / "tensorrt_llm_draft_badvocab" / "config.pbtxt").write_text(
        cfg.replace("decoupled: true", "decoupled: false"))
    copy_bls_model(repo, "tensorrt_llm_bls_badvocab",
                   {"tensorrt_llm_draft_model_name": "tensorrt_llm_draft_badvocab"})
    server = TritonServer(repo, log_path=root / "server.log").start(180)
    try:
        yield server
    finally:
        server.stop(timeout_s=TEARDOWN_STOP_S)


@pytest.fixture(scope="module")
def ngram_server(tiny_ckpt: TinyCheckpoint,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from specserve.triton.server import TritonServer

    root = tmp_path_factory.mktemp("bls-ngram")
    engine = make_tiny_engine(tiny_ckpt, root / "engine", "ngram")
    repo = write_repository(engine, root / "repo", RepoOptions(baseline=True), force=True)
    copy_bls_model(repo, "tensorrt_llm_bls_libprobe", {}, lib={"ngram.py": NO_PROPOSALS})
    server = TritonServer(repo, log_path=root / "server.log").start(180)
    try:
        yield server
    finally:
        server.stop(timeout_s=TEARDOWN_STOP_S)


@pytest.fixture(params=["dt", "ngram"])
def served(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_server")


def _texts(url: str, model: str, reqs: list[dict[str, Any]]) -> list[str]:
    out, errors = grpc_stream_many(url, model, reqs, timeout_s=120)
    assert not errors, errors
    return [text_of(out[i]) for i in range(len(reqs))]


@pytest.mark.server
@pytest.mark.parametrize("extra", [{}, {"use_draft_logits": True},
                                   {"exclude_input_in_output": True}],
                         ids=["plain", "draft-logits", "exclude-input"])
def test_greedy_text_equals_the_baseline(served: Any, extra: dict[str, Any]) -> None:
    url = served.grpc_url
    common = {k: v for k, v in extra.items() if k != "use_draft_logits"}  # a BLS input only
    base = _texts(url, "ensemble_baseline", [request(p, 24, **common) for p in PROMPTS])
    spec = _texts(url, "tensorrt_llm_bls",
                  [request(p, 24, num_draft_tokens=K, **extra) for p in PROMPTS])
    assert spec == base
    assert all(t for t in base)


@pytest.mark.server
def test_short_outputs_and_small_k_equal_the_baseline(served: Any) -> None:
    """max_tokens 1 and 2 (no room for drafts), K below max_draft_len."""
    url = served.grpc_url
    for n, k in ((1, K), (2, K), (7, 1), (9, 3)):
        base = _texts(url, "ensemble_baseline", [request(p, n) for p in PROMPTS[:2]])
        spec = _texts(url, "tensorrt_llm_bls",
                      [request(p, n, num_draft_tokens=k) for p in PROMPTS[:2]])
        assert spec == base, (n, k)


def _baseline_ids(url: str, ckpt: TinyCheckpoint, prompt: str, n: int) -> list[int]:
    from tokenizers import Tokenizer

    from tests.reliability.helpers import Job, run_jobs

    ids = Tokenizer.from_file(str(ckpt.tokenizer / "tokenizer.json")).encode(prompt).ids
    return run_jobs(url, "tensorrt_llm_baseline", [Job(ids, n, 0.0, 0)])[0]


@pytest.mark.server
def test_end_id_stops_like_the_baseline(served: Any, tiny_ckpt: TinyCheckpoint) -> None:
    """An end id that the greedy output reaches: the target stops on it (not in the text)."""
    url = served.grpc_url
    gen = _baseline_ids(url, tiny_ckpt, PROMPTS[0], 24)
    for pos in (0, 1, 6, 13):
        end = gen[pos]
        reqs = [request(PROMPTS[0], 24, end_id=end, exclude_input_in_output=True,
                        return_num_output_tokens=True)]
        base = grpc_stream(url, "ensemble_baseline", reqs[0])
        spec_req = {**reqs[0], "num_draft_tokens": np.array([[K]], dtype=np.int32)}
        spec = grpc_stream(url, "tensorrt_llm_bls", spec_req)
        assert text_of(spec) == text_of(base), pos
        counts = [scalar(r, "num_output_tokens") for r in spec if "num_output_tokens" in r]
        assert counts == [gen.index(end)], pos


@pytest.mark.server
def test_perf_outputs_report_the_loop(served: Any) -> None:
    url = served.grpc_url
    rs = grpc_stream(url, "tensorrt_llm_bls",
                     request(PROMPTS[0], 32, num_draft_tokens=K, return_perf_metrics=True))
    final = next(r for r in rs if "total_draft_tokens" in r)
    drafted = scalar(final, "total_draft_tokens")
    accepted = scalar(final, "total_accepted_draft_tokens")
    assert 0 < accepted <= drafted
    assert scalar(final, "acceptance_rate") == pytest.approx(accepted / drafted, rel=1e-6)
    times = [scalar(final, k) for k in ("arrival_time_ns", "first_scheduled_time_ns",
                                        "first_token_time_ns", "last_token_time_ns")]
    assert times == sorted(times) and times[0] < times[-1]
    stats = json.loads(scalar(final, "spec_stats_json"))
    assert (stats["draft_tokens"], stats["accepted_tokens"]) == (drafted, accepted)
    assert stats["emitted_tokens"] == 32 and 1 < stats["tau"] <= K + 1
    plain = grpc_stream(url, "tensorrt_llm_bls",
                        request(PROMPTS[0], 32, num_draft_tokens=0, return_perf_metrics=True))
    assert text_of(plain) == text_of(rs)


@pytest.mark.server
def test_draft_target_rejects_some_drafts(dt_server: Any) -> None:
    """The noisy draft: both accepted and rejected drafts (the loop's both branches run)."""
    out, errors = grpc_stream_many(dt_server.grpc_url, "tensorrt_llm_bls", [
        request(p, 32, num_draft_tokens=K, return_perf_metrics=True) for p in PROMPTS])
    assert not errors
    finals = [next(r for r in rs if "total_draft_tokens" in r) for rs in out.values()]
    drafted = sum(scalar(f, "total_draft_tokens") for f in finals)
    accepted = sum(scalar(f, "total_accepted_draft_tokens") for f in finals)
    assert 0.2 < accepted / drafted < 0.95, (accepted, drafted)


@pytest.mark.server
def test_streaming_from_the_bls(served: Any) -> None:
    """One response per loop iteration; the pieces concatenate to the non-streamed text."""
    url = served.grpc_url
    for prompt in PROMPTS:
        whole = text_of(grpc_stream(url, "tensorrt_llm_bls", request(
            prompt, 24, num_draft_tokens=K, exclude_input_in_output=True)))
        rs = grpc_stream(url, "tensorrt_llm_bls", request(
            prompt, 24, num_draft_tokens=K, stream=True, return_perf_metrics=True,
            return_num_output_tokens=True))
        chunks = [r for r in rs if "num_output_tokens" in r and scalar(r, "num_output_tokens")]
        assert len(chunks) > 1 and len(chunks) <= 24  # several chunks, none empty
        assert sum(scalar(r, "num_output_tokens") for r in chunks) == 24
        assert text_of(rs) == whole, prompt
        final = next(r for r in rs if "total_draft_tokens" in r)
        stats = json.loads(scalar(final, "spec_stats_json"))
        assert stats["steps"] == len(chunks)  # every iteration streamed its tokens


@pytest.mark.server
def test_streamed_loops_cancelled_mid_stream_leave_the_bls_serving(served: Any) -> None:
    """Streamed loops whose client leaves after the first chunk (their text and sends run on a
    thread of their own, lib/background.py) end; the stub lives and the next streamed request
    is whole."""
    url = served.grpc_url
    streamed = request(PROMPTS[0], 24, num_draft_tokens=K, stream=True)
    for _ in range(4):
        with closing(grpc_responses(url, "tensorrt_llm_bls", [streamed])) as rs:
            _, first = next(rs)
            assert "error" not in first
    whole = text_of(grpc_stream(url, "tensorrt_llm_bls", request(
        PROMPTS[0], 24, num_draft_tokens=K, exclude_input_in_output=True)))
    assert text_of(grpc_stream(url, "tensorrt_llm_bls", streamed)) == whole


@pytest.mark.server
def test_bad_requests_fail_alone(dt_server: Any) -> None:
    url = dt_server.grpc_url
    good = request(PROMPTS[1], 8, num_draft_tokens=K)
    bad = {
        -1: "num_draft_tokens must be >= 0, got -1",
        K + 1: f"num_draft_tokens {K + 1} exceeds the target's max_draft_len {K} "
               "(parameter max_draft_len)",
    }
    reqs = [good, *[request(PROMPTS[1], 8, num_draft_tokens=k) for k in bad], good]
    out, errors = grpc_stream_many(url, "tensorrt_llm_bls", reqs)
    assert sorted(out) == [0, len(reqs) - 1]
    assert len(errors) == len(bad)
    for msg in bad.values():
        assert sum(msg in e for e in errors) == 1, (msg, errors)
    beam = request(PROMPTS[1], 8, num_draft_tokens=K, beam_width=2)
    with pytest.raises(StreamError, match="beam_width > 1 is not supported with speculative"):
        grpc_stream(url, "tensorrt_llm_bls", beam)
    with pytest.raises(StreamError, match="draft model 'tensorrt_llm_draft_missing' "
                       r"\(parameter tensorrt_llm_draft_model_name\) is not available"):
        grpc_stream(url, "tensorrt_llm_bls_nodraft", good)
    with_logits = request(PROMPTS[1], 8, num_draft_tokens=K, use_draft_logits=True)
    with pytest.raises(StreamError, match="draft model 'tensorrt_llm_draft_badvocab' has a "
                       r"vocabulary of \d+ .*the target's is \d+ \(parameter "
                       "tensorrt_llm_vocab_size\\)"):
        grpc_stream(url, "tensorrt_llm_bls_badvocab", with_logits)
    # without use_draft_logits the draft is asked for no logits (upstream): acceptance by token
    # id serves a draft whose logits are wider (padded embeddings), losslessly
    assert text_of(grpc_stream(url, "tensorrt_llm_bls_badvocab", good)) == \
        text_of(grpc_stream(url, "tensorrt_llm_bls", good))
    # log probs: refused by the loop, and by the reference target (it computes none), never
    # answered without them
    with pytest.raises(StreamError, match="return_log_probs is not supported with speculative"):
        grpc_stream(url, "tensorrt_llm_bls",
                    request(PROMPTS[1], 8, num_draft_tokens=K, return_log_probs=True))
    # without speculation the reference backend serves log probs: no error
    grpc_stream(url, "tensorrt_llm_bls", request(PROMPTS[1], 8, return_log_probs=True))
    # the same models still serve (num_draft_tokens 0 needs no draft model)
    assert text_of(grpc_stream(url, "tensorrt_llm_bls_nodraft", request(PROMPTS[1], 8))) == \
        text_of(grpc_stream(url, "tensorrt_llm_bls", good))


@pytest.mark.server
def test_the_repository_lib_copy_is_what_runs(ngram_server: Any) -> None:
    """Triton puts tensorrt_llm_bls/1/ on sys.path: ``lib.ngram`` is the repository's file (here
    replaced by one that proposes nothing), not the specserve package's."""
    url = ngram_server.grpc_url

    def drafted(model: str) -> tuple[int, str]:
        rs = grpc_stream(url, model, request(PROMPTS[2], 24, num_draft_tokens=K,
                                             return_perf_metrics=True))
        return scalar(next(r for r in rs if "total_draft_tokens" in r),
                      "total_draft_tokens"), text_of(rs)

    (real, text), (probe, probe_text) = drafted("tensorrt_llm_bls"), \
        drafted("tensorrt_llm_bls_libprobe")
    assert real > 0 and probe == 0
    assert probe_text == text


# slow: ~19 s of bursts; a load check rather than a contract (make test-slow)
@pytest.mark.slow
@pytest.mark.server
def test_bls_survives_bursts_of_concurrent_loops(ngram_server: Any) -> None:
    """Waves of 200 concurrent loop requests at T=1 (about four target calls each). On
    tritonserver 2.51 a stub freed numpy arrays without the GIL when a decoupled BLS iterator or
    an unrequested output was dropped on a backend thread: before the BLS worked around it
    (``TritonPythonModel._keep``, exact requested outputs) a stub died within a few waves."""
    url = ngram_server.grpc_url
    for wave in range(6):
        reqs = [{**request(PROMPTS[i % 4], 4, num_draft_tokens=K, temperature=1.0),
                 "seed": np.array([[wave * 1000 + i]], dtype=np.uint64)} for i in range(200)]
        out, errors = grpc_stream_many(url, "tensorrt_llm_bls", reqs, timeout_s=30)
        assert not errors and len(out) == 200, (wave, errors[:1])


def test_bench_sends_num_draft_tokens_only_where_declared() -> None:
    from specserve.client.config import BenchmarkConfig
    from specserve.client.transport import GenParams, build_inputs
    from specserve.errors import SpecserveError

    p = GenParams(max_tokens=8, num_draft_tokens=K)
    bls = frozenset({"text_input", "max_tokens", "num_draft_tokens"})
    assert build_inputs("x", p, bls)["num_draft_tokens"] == K
    assert "num_draft_tokens" not in build_inputs("x", p, frozenset({"text_input", "max_tokens"}))
    assert "num_draft_tokens" not in build_inputs("x", GenParams(max_tokens=8), bls)
    with pytest.raises(SpecserveError, match="--num-draft-tokens must be >= 0"):
        BenchmarkConfig(url="127.0.0.1:1", out="o", num_draft_tokens=-1).validate()
