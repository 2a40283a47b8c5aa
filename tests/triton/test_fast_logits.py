"""Fast logits for TensorRT-LLM draft-target repositories: ``specserve repo
--fast-logits`` writes ``speculative_decoding_fast_logits`` and upstream's ``participant_ids``
layout, refuses the option elsewhere, and ``specserve serve`` starts such a repository in
orchestrator mode with spawning off (every rank started here), which the C++ backend needs
before it enables fast logits. Upstream facts: ``data/trtllm_fast_logits.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import specserve.triton.server as srv
from specserve.errors import ServerError, SpecserveError
from specserve.triton.models.bls_lib import spec_io
from specserve.triton.models.bls_lib.spec_loop import Sampling
from specserve.triton.repository import RepoOptions, write_repository
from tests.triton.test_triton_launcher import capture_launch
from tests.triton.test_triton_repository import fake_engine

UPSTREAM: dict[str, Any] = json.loads((Path(__file__).parent / "data" /
                                       "trtllm_fast_logits.json").read_text())


def params(repo: Path, model: str) -> dict[str, str]:
    mc = text_format.Parse((repo / model / "config.pbtxt").read_text(),
                           model_config_pb2.ModelConfig())
    return {k: v.string_value for k, v in mc.parameters.items()}


def repo_of(root: Path, world: int = 1, fast: bool = True, kind: str = "draft") -> Path:
    engine = fake_engine(root, kind, tp_size=world, world_size=world)
    return write_repository(engine, root / "repo", RepoOptions(fast_logits=fast))


@pytest.mark.parametrize("world", [1, 2])
def test_both_models_get_fast_logits_and_upstream_s_ranks(tmp_path: Path, world: int) -> None:
    repo = repo_of(tmp_path, world)
    target, draft = params(repo, "tensorrt_llm"), params(repo, "tensorrt_llm_draft")
    for p in (target, draft):
        assert p["speculative_decoding_fast_logits"] == UPSTREAM["fast_logits_value"]
    assert draft["participant_ids"] == UPSTREAM["draft_participant_ids"]
    first = UPSTREAM["target_participant_ids_first"]
    assert target["participant_ids"] == ",".join(str(first + r) for r in range(world))
    assert srv.prespawn_world_size(repo) == 1 + 1 + world
    if world == 1:
        assert srv.prespawn_world_size(repo) == UPSTREAM["readme_world_size"]


def test_without_the_option_nothing_changes(tmp_path: Path) -> None:
    repo = repo_of(tmp_path, fast=False)
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        p = params(repo, model)
        assert p["speculative_decoding_fast_logits"] == p["participant_ids"] == ""
    assert srv.prespawn_world_size(repo) is None  # the orchestrator spawns the ranks


@pytest.mark.parametrize("kind", ["medusa", "ngram"])
def test_the_option_is_refused_without_a_draft_engine(tmp_path: Path, kind: str) -> None:
    with pytest.raises(SpecserveError, match=r"^--fast-logits: only for TensorRT-LLM "
                                             "draft-target engines"):
        repo_of(tmp_path, kind=kind)
    assert not (tmp_path / "repo").exists()


def _set_ids(repo: Path, model: str, ids: str) -> None:
    cfg = repo / model / "config.pbtxt"
    text = cfg.read_text()
    old = [ln for ln in text.splitlines() if '"participant_ids"' in ln][0]
    cfg.write_text(text.replace(old, 'parameters: { key: "participant_ids" value: '
                                     f'{{ string_value: "{ids}" }} }}'))


@pytest.mark.parametrize(("model", "ids", "message"), [
    ("tensorrt_llm", "1", r"must cover ranks 1\.\.2 once each"),
    ("tensorrt_llm", "3", r"must cover ranks 1\.\.2 once each"),
    ("tensorrt_llm", "", "tensorrt_llm has no participant_ids while tensorrt_llm_draft has"),
    ("tensorrt_llm_draft", "x", "participant_ids 'x' is not a list of MPI ranks"),
])
def test_rank_layouts_that_cannot_start_are_refused(tmp_path: Path, model: str, ids: str,
                                                    message: str) -> None:
    repo = repo_of(tmp_path)
    _set_ids(repo, model, ids)
    with pytest.raises(ServerError, match=message):
        srv.prespawn_world_size(repo)


def test_serve_starts_every_rank_with_spawning_off(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """TritonServer.start (what `specserve serve` runs): the argv and env it launches."""
    repo = repo_of(tmp_path, world=2)
    seen = capture_launch(srv.TritonServer(repo, log_path=tmp_path / "log"), tmp_path,
                          monkeypatch, gpus=3)
    binary = tmp_path / "tritonserver"
    cmd, env = seen["cmd"], seen["env"]
    assert isinstance(cmd, list) and isinstance(env, dict)
    assert {k: env.get(k) for k in UPSTREAM["spawn_env"]} == UPSTREAM["spawn_env"]
    ranks = " ".join(cmd).split(" : ")
    assert cmd[0] == "mpirun" and len(ranks) == 1 + 1 + 2  # orchestrator + draft + 2 target
    assert all(str(binary) in r for r in ranks)
    assert "--grpc-port" in ranks[0] and "--model-control-mode" not in ranks[0]
    for r in ranks[1:]:
        assert "--model-control-mode=explicit" in r
        assert "--load-model=tensorrt_llm " in r + " " and "--load-model=tensorrt_llm_draft" in r
    assert not any(flag in cmd for flag in UPSTREAM["rank0_without"])


def test_the_bls_is_told_and_forwards_the_draft_s_handle(tmp_path: Path) -> None:
    """With fast logits the draft answers a handle [1, 1, 1, W] (W floats of {request id,
    rank}) in place of its logits: the BLS passes it to the target whole as draft_logits
    [1, 1, W], checks no vocabulary on it and gives the loop no per-position logits."""
    bls = params(repo_of(tmp_path), "tensorrt_llm_bls")
    cfg = spec_io.BlsParams.from_params(bls)
    assert cfg.fast_logits and not spec_io.BlsParams.from_params(
        params(repo_of(tmp_path / "plain", fast=False), "tensorrt_llm_bls")).fast_logits
    handle = np.arange(UPSTREAM["handle_floats"], dtype=np.float32).reshape(1, 1, 1, -1)
    out = {"output_ids": [5, 6, 7], "generation_logits": handle}
    opts = spec_io.SpecOptions(use_logits=True)
    logits, fast = spec_io.draft_logits(cfg, out, opts)
    assert logits is None
    spec_io.check_draft(cfg, out["output_ids"], logits)  # no width check on a handle
    pre = {"input_ids": np.array([[4]], dtype=np.int32),
           "input_lengths": np.array([[1]], dtype=np.int32)}
    call, _ = spec_io.target_call({}, pre, [4], [5, 6, 7], logits, Sampling(), fast)
    assert call["draft_logits"].shape == (1, 1, UPSTREAM["handle_floats"])
    assert call["draft_logits"].tobytes() == handle.tobytes()
    assert spec_io.draft_logits(cfg, out, spec_io.SpecOptions()) == (None, None)
    plain = spec_io.BlsParams(draft="d")
    rows = np.ones((1, 1, 3, 8), dtype=np.float32)
    got, none = spec_io.draft_logits(plain, {"generation_logits": rows}, opts)
    assert none is None and got is rows  # per-position logits go to the loop as before
