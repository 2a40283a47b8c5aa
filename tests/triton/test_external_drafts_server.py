"""``draft_input_ids`` / ``draft_logits`` sent straight to the reference ``tensorrt_llm`` of a
tiny repository, as TensorRT-LLM's BLS draft-target loop sends them, through a real
tritonserver: the decoupled ``tensorrt_llm`` (streamed and not) and a non-decoupled copy
``tensorrt_llm_nd`` (unary gRPC, as the BLS calls it with ``exec(decoupled=False)``).

- T=0: drafts right for j tokens then wrong (j = 0..K) answer the context + the baseline's first
  j + 1 tokens, with perf outputs K / j / j/K, in one batch with a plain neighbour.
- Bad drafts (too many for the engine's max_draft_len, ids outside the vocabulary, draft_logits
  not [K, V]) fail alone with one message naming the input; the neighbour and the server go on.
- ``generation_logits`` of speculation-off models: ``tensorrt_llm_baseline`` (the target) and
  ``tensorrt_llm_draft`` (non-decoupled, serving the engine's draft checkpoint,
  ``specserve_checkpoint: draft``; rendered by the writer, or copied here when it is not) equal
  the checkpoints' own logits; argmax = emitted token.
- A client-side draft-target loop (draft K tokens + logits, verify them) reproduces the
  baseline's greedy text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.server import (
    TEARDOWN_STOP_S,
    StreamError,
    grpc_stream,
    grpc_stream_many,
    infer_inputs,
)
from tests.reliability.helpers import copy_llm_model

pytestmark = pytest.mark.server

K = 4  # the tiny draft engine's max_draft_len
CTX = [5, 6, 7, 8, 9, 10, 11]
N_BASE = 12


@dataclass(frozen=True)
class Served:
    url: str
    vocab: int
    target: Path
    draft: Path
    greedy: list[int]  # the baseline's greedy continuation of CTX (N_BASE tokens)


def _set_param(cfg: str, key: str, value: str) -> str:
    pat = rf'(parameters: \{{ key: "{key}" value: \{{ string_value: )"[^"]*"'
    if re.search(pat, cfg):
        return re.sub(pat, rf'\1"{value}"', cfg)
    return cfg + f'\nparameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


def _non_decoupled(repo: Path, name: str, **params: str) -> None:
    copy_llm_model(repo, name)
    cfg_path = repo / name / "config.pbtxt"
    cfg = cfg_path.read_text().replace("decoupled: true", "decoupled: false", 1)
    for k, v in params.items():
        cfg = _set_param(cfg, k, v)
    cfg_path.write_text(cfg)


def inputs(ctx: list[int], max_tokens: int, drafts: list[int] | None = None,
           logits: np.ndarray[Any, Any] | None = None, **flags: Any
           ) -> dict[str, np.ndarray[Any, Any]]:
    """``tensorrt_llm`` inputs, greedy, never stopping on a token, context echoed."""
    a: dict[str, np.ndarray[Any, Any]] = {
        "input_ids": np.array([ctx], dtype=np.int32),
        "input_lengths": np.array([[len(ctx)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32),
    }
    if drafts is not None:
        a["draft_input_ids"] = np.array([drafts], dtype=np.int32)
    if logits is not None:
        a["draft_logits"] = logits.astype(np.float32).reshape(1, *logits.shape[-2:])
    for k, v in flags.items():
        dtype = np.uint64 if k == "seed" else {bool: bool, int: np.int32,
                                                float: np.float32}[type(v)]
        a[k] = np.array([[v]], dtype=dtype)
    return a


def infer(url: str, model: str, arrays: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    """One unary gRPC request (a non-decoupled model): its outputs; errors raise
    ``tritonclient.utils.InferenceServerException``."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        res = client.infer(model, infer_inputs(arrays), client_timeout=60)
        return {o.name: res.as_numpy(o.name) for o in res.get_response().outputs}
    finally:
        client.close()


def ids(r: dict[str, Any]) -> list[int]:
    return [int(t) for t in r["output_ids"].reshape(-1)]


def perf(r: dict[str, Any]) -> tuple[int, int, float]:
    return (int(r["total_draft_tokens"].reshape(-1)[0]),
            int(r["total_accepted_draft_tokens"].reshape(-1)[0]),
            round(float(r["acceptance_rate"].reshape(-1)[0]), 4))


@pytest.fixture(scope="module")
def served(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from specserve.runtime.model import load_model
    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import TritonServer
    from tests.helpers.server import make_tiny_engine

    root = tmp_path_factory.mktemp("external")
    # an independent draft: the draft copy's logits must be the draft's, not the target's
    engine = make_tiny_engine(tiny_ckpt, root / "engine", "draft", draft_is_target=False)
    repo = write_repository(engine, root / "repo", RepoOptions(baseline=True), force=True)
    _non_decoupled(repo, "tensorrt_llm_nd")
    if not (repo / "tensorrt_llm_draft").exists():  # the writer renders it for reference
        _non_decoupled(repo, "tensorrt_llm_draft", specserve_speculation="off",  # repos now
                       specserve_checkpoint="draft")
    draft_cfg = (repo / "tensorrt_llm_draft" / "config.pbtxt").read_text()
    assert "decoupled: false" in draft_cfg and re.search(
        r'key: "specserve_checkpoint" value: \{ string_value: "draft" \}', draft_cfg)
    server = TritonServer(repo, log_path=root / "server.log").start(180)
    try:
        base = grpc_stream(server.grpc_url, "tensorrt_llm_baseline",
                           inputs(CTX, N_BASE, exclude_input_in_output=True))
        greedy = [t for r in base if "output_ids" in r for t in ids(r)]
        assert len(greedy) == N_BASE
        yield Served(server.grpc_url, load_model(tiny_ckpt.target).cfg.vocab_size,
                     tiny_ckpt.target, tiny_ckpt.draft, greedy)
    finally:
        server.stop(timeout_s=TEARDOWN_STOP_S)


def wrong_at(g: list[int], j: int, vocab: int) -> list[int]:
    """K drafts right except draft j (j < K); the drafts after it are right again."""
    d = list(g[:K])
    if j < K:
        d[j] = (g[j] + 1) % vocab
    return d


def test_decoupled_verify_matches_the_baseline(served: Served) -> None:
    g = served.greedy
    reqs = [inputs(CTX, K + 1, wrong_at(g, j, served.vocab), return_perf_metrics=True)
            for j in range(K + 1)]
    reqs.append(inputs(CTX, 6, exclude_input_in_output=True))  # a plain neighbour
    out, errors = grpc_stream_many(served.url, "tensorrt_llm", reqs)
    assert errors == []
    for j in range(K + 1):
        (final,) = out[j]  # non-streaming: one response
        assert ids(final) == CTX + g[:j + 1], j
        assert perf(final) == (K, j, round(j / K, 4)), j
    assert [t for r in out[K + 1] for t in ids(r)] == g[:6]


def test_streamed_verify_is_one_chunk_then_the_final_response(served: Served) -> None:
    g = served.greedy
    for j in range(K + 1):
        rs = grpc_stream(served.url, "tensorrt_llm",
                         inputs(CTX, K + 1, wrong_at(g, j, served.vocab), streaming=True,
                                return_perf_metrics=True))
        # one response with the step's tokens, then the final one; tokens that end inside a
        # UTF-8 character are held back to the final response (llm.py's streaming hold-back)
        assert [t for r in rs for t in ids(r)] == g[:j + 1], j
        assert [r["final"] for r in rs] in ([False, True], [True]), j
        assert len(rs) == 1 or ids(rs[0]), j
        assert perf(rs[-1]) == (K, j, round(j / K, 4))


def test_non_decoupled_verify_matches_the_baseline(served: Served) -> None:
    g = served.greedy
    for j in range(K + 1):
        r = infer(served.url, "tensorrt_llm_nd",
                  inputs(CTX, K + 1, wrong_at(g, j, served.vocab), return_perf_metrics=True))
        assert ids(r) == CTX + g[:j + 1], j
        assert perf(r) == (K, j, round(j / K, 4)), j
    # request_output_len below K + 1: drafts past it are not verified
    r = infer(served.url, "tensorrt_llm_nd", inputs(CTX, 2, g[:K], return_perf_metrics=True))
    assert ids(r) == CTX + g[:2] and perf(r) == (1, 1, 1.0)
    # above K + 1: still one verify step (at most K + 1 tokens)
    for j in (1, K):
        r = infer(served.url, "tensorrt_llm_nd", inputs(CTX, 10, wrong_at(g, j, served.vocab)))
        assert ids(r) == CTX + g[:j + 1], j


def _bad_cases(vocab: int, g: list[int]) -> list[tuple[dict[str, np.ndarray[Any, Any]], str]]:
    return [
        (inputs(CTX, K + 2, g[:K + 1]),
         rf"input 'draft_input_ids' has {K + 1} tokens, more than the engine's max_draft_len "
         rf"{K}"),
        (inputs(CTX, K + 1, [g[0], vocab, 3, 4]),
         rf"input 'draft_input_ids': token id {vocab} outside the vocab \({vocab}\)"),
        (inputs(CTX, K + 1, g[:K], np.zeros((K, vocab - 1))),
         rf"input 'draft_logits' must be \[K, V\] = \[{K}, {vocab}\] \(the target's vocab\)"),
        (inputs(CTX, K + 1, g[:K], np.zeros((K - 1, vocab))),
         rf"input 'draft_logits' must be \[K, V\] with K = {K}"),
    ]


def test_bad_drafts_fail_alone_decoupled(served: Served) -> None:
    g = served.greedy
    for bad, message in _bad_cases(served.vocab, g):
        good = inputs(CTX, K + 1, wrong_at(g, 1, served.vocab))
        out, errors = grpc_stream_many(served.url, "tensorrt_llm", [bad, good])
        assert len(errors) == 1 and re.search(message, errors[0]), (message, errors)
        assert errors[0].count("tensorrt_llm: ") == 1
        assert [ids(r) for r in out[1]] == [CTX + g[:2]]  # the neighbour is served


def test_bad_drafts_fail_alone_non_decoupled(served: Served) -> None:
    from tritonclient.utils import InferenceServerException

    g = served.greedy
    for bad, message in _bad_cases(served.vocab, g):
        with pytest.raises(InferenceServerException, match=message):
            infer(served.url, "tensorrt_llm_nd", bad)
        assert ids(infer(served.url, "tensorrt_llm_nd", inputs(CTX, 3, g[:2]))) == CTX + g[:3]


def _local_logits(model_dir: Path, ctx: list[int], tokens: list[int]) -> np.ndarray[Any, Any]:
    """[T, V] logits of a checkpoint predicting each of ``tokens`` after ``ctx``."""
    import torch

    from specserve.runtime.model import load_model

    m = load_model(model_dir)
    seq = ctx + tokens[:-1]
    with torch.inference_mode():
        h = m(torch.tensor([seq]), m.new_cache(1, len(seq) + 1))
        out: np.ndarray[Any, Any] = m.logits(h[0, len(ctx) - 1:]).numpy()
    return out


@pytest.mark.parametrize("model", ["tensorrt_llm_baseline", "tensorrt_llm_draft"])
def test_generation_logits_are_the_models_logits(served: Served, model: str) -> None:
    a = inputs(CTX, 5, return_generation_logits=True, exclude_input_in_output=True)
    if model == "tensorrt_llm_draft":
        r, ckpt = infer(served.url, model, a), served.draft
    else:
        (r, *rest), ckpt = grpc_stream(served.url, model, a), served.target
        assert rest == []
    tokens = ids(r)
    logits = r["generation_logits"]
    assert logits.dtype == np.float32 and logits.shape == (1, 1, 5, served.vocab)
    assert logits[0, 0].argmax(-1).tolist() == tokens
    np.testing.assert_allclose(logits[0, 0], _local_logits(ckpt, CTX, tokens), rtol=1e-4,
                               atol=1e-4)
    if model == "tensorrt_llm_baseline":
        assert tokens == served.greedy[:5]
    plain = infer(served.url, "tensorrt_llm_nd", inputs(CTX, 2))
    assert "generation_logits" not in plain  # only when asked


def test_generation_logits_refused_when_streaming(served: Served) -> None:
    with pytest.raises(StreamError, match="'return_generation_logits' is not supported with "
                                          "streaming"):
        grpc_stream(served.url, "tensorrt_llm",
                    inputs(CTX, 3, return_generation_logits=True, streaming=True))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_client_draft_target_loop(served: Served, temperature: float) -> None:
    """Draft K tokens with their generation_logits on tensorrt_llm_draft, verify them with
    draft_input_ids + draft_logits on tensorrt_llm_nd, until N_BASE tokens: at T=0 the
    baseline's greedy continuation; at T=1 every step answers 1..K+1 tokens, accepted <= K."""
    seq, steps = list(CTX), 0
    while len(seq) - len(CTX) < N_BASE:
        k = min(K, len(CTX) + N_BASE - len(seq) - 1)
        s = dict(temperature=temperature, seed=steps)
        if k == 0:
            seq = ids(infer(served.url, "tensorrt_llm_nd", inputs(seq, 1, **s)))
            break
        d = infer(served.url, "tensorrt_llm_draft",
                  inputs(seq, k, return_generation_logits=True, exclude_input_in_output=True,
                         **s))
        drafts, logits = ids(d), d["generation_logits"][0, 0]
        t = infer(served.url, "tensorrt_llm_nd",
                  inputs(seq, k + 1, drafts, logits, return_perf_metrics=True,
                         seed=1000 + steps, temperature=temperature))
        new = ids(t)[len(seq):]
        drafted, accepted, _ = perf(t)
        assert drafted == k and 0 <= accepted <= k and len(new) == accepted + 1
        assert new[:accepted] == drafts[:accepted]
        seq, steps = ids(t), steps + 1
    if temperature == 0:
        assert seq[len(CTX):] == served.greedy
