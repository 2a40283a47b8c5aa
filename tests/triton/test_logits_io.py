"""``return_log_probs`` and the logits outputs: the ensemble and BLS configs
declare and wire them exactly as upstream's (``data/logits_io.json``, upstream files and
commits), the BLS passes them to ``tensorrt_llm`` and back without speculation and refuses them
with it, and a reference (torch) repository, whose decoder computes no log probs, refuses a
request for them with one message instead of ignoring it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specserve.triton import llm_io
from specserve.triton.models.bls_lib import request as rq
from specserve.triton.models.bls_lib import spec_io
from specserve.triton.repository import RepoOptions, write_repository
from tests.helpers.server import make_fake_trtllm_engine

UPSTREAM: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "logits_io.json")
                                      .read_text())
TYPE = model_config_pb2.DataType


def parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def repo_of(tmp_path: Path, backend: str) -> Path:
    engine = make_fake_trtllm_engine(tmp_path, "draft")
    if backend == "torch":
        cfg = json.loads((engine / "build_config.json").read_text())
        (engine / "build_config.json").write_text(json.dumps({**cfg, "backend": "torch"}))
    return write_repository(engine, tmp_path / "repo", RepoOptions())


def declared(tensors: Any) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (TYPE.Name(t.data_type), list(t.dims)) for t in tensors}


def upstream(kind: str) -> dict[str, tuple[str, list[int]]]:
    dtype = UPSTREAM["logits_datatype"]
    return {k: (dtype if t == "${logits_datatype}" else t, dims)
            for k, (t, dims) in UPSTREAM[kind].items()}


@pytest.mark.parametrize("backend", ["trtllm", "torch"])
def test_ensemble_and_bls_declare_upstream_s_log_prob_and_logits_tensors(
        tmp_path: Path, backend: str) -> None:
    repo = repo_of(tmp_path, backend)
    for model in ("ensemble", "tensorrt_llm_bls"):
        mc = parse(repo / model / "config.pbtxt")
        inputs, outputs = declared(mc.input), declared(mc.output)
        assert {k: inputs.get(k) for k in UPSTREAM["inputs"]} == upstream("inputs"), model
        assert {k: outputs.get(k) for k in UPSTREAM["outputs"]} == upstream("outputs"), model
        if model == "tensorrt_llm_bls":  # reshaped to scalars, as upstream's BLS
            assert all(list(i.reshape.shape) == UPSTREAM["bls_inputs_reshape"] and
                       i.HasField("reshape") for i in mc.input if i.name in UPSTREAM["inputs"])
    ens = parse(repo / "ensemble" / "config.pbtxt")
    step = next(s for s in ens.ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    assert {k: step.input_map.get(k) for k in UPSTREAM["inputs"]} == \
        {k: k for k in UPSTREAM["inputs"]}
    assert {k: step.output_map.get(k) for k in UPSTREAM["outputs"]} == \
        {k: k for k in UPSTREAM["outputs"]}
    llm = parse(repo / "tensorrt_llm" / "config.pbtxt")  # the step model has them, same types
    assert {k: declared(llm.output).get(k) for k in UPSTREAM["outputs"]} == upstream("outputs")


def test_the_bls_passes_them_through_without_speculation() -> None:
    """Upstream's BLS sends the flags to tensorrt_llm and answers its four outputs."""
    assert {k: rq.LLM.get(k) for k in UPSTREAM["inputs"]} == {k: k for k in UPSTREAM["inputs"]}
    assert set(UPSTREAM["outputs"]) <= set(rq.FORWARD)


@pytest.mark.parametrize("name", sorted(UPSTREAM["inputs"]))
def test_the_bls_loop_refuses_them(name: str) -> None:
    cfg = spec_io.BlsParams(spec_mode="ngram")
    with pytest.raises(ValueError, match=f"^{name} is not supported with speculative decoding"):
        spec_io.check_spec_request(cfg, {name: np.array([True])}, 2)
    spec_io.check_spec_request(cfg, {name: np.array([False])}, 2)


@pytest.mark.parametrize("name", ["return_context_logits"])
def test_the_reference_model_refuses_what_it_cannot_compute(name: str) -> None:
    """A torch repository declares the tensors (upstream's I/O), so the request reaches the
    reference tensorrt_llm model, which refuses it with one line (never answers without)."""
    base = {"input_ids": np.array([[1, 2]], dtype=np.int32),
            "request_output_len": np.array([[4]], dtype=np.int32)}
    with pytest.raises(ValueError, match=f"^input '{name}' is not supported by the specserve "
                                         "reference backend$"):
        llm_io.parse_request({**base, name: np.array([[True]])})
    assert llm_io.parse_request({**base, name: np.array([[False]])}).max_tokens == 4
    gen = llm_io.parse_request({**base, "return_generation_logits": np.array([[True]])})
    assert gen.return_generation_logits  # served by the reference decoder
    lp = llm_io.parse_request({**base, "return_log_probs": np.array([[True]])})
    assert lp.return_log_probs  # the reference backend serves it (test_api_features_io.py)
