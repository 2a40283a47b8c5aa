"""Repository writer: protobuf parse, golden files, pinned parameter keys, atomic writes.

Goldens: ``tests/triton/golden/<kind>/<model>/config.pbtxt`` with the engine path replaced by
``<ENGINE>``. Regenerate with ``SPECSERVE_UPDATE_GOLDEN=1 pytest tests/triton``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specserve.errors import SpecserveError
from specserve.spec.tree import to_brace as brace
from specserve.triton.params import LLM_PARAMETER_PLACEHOLDERS
from specserve.triton.repository import RepoOptions, write_repository
from tests.helpers.server import FAKE_MEDUSA_CHOICES as MEDUSA_CHOICES
from tests.helpers.server import make_fake_trtllm_engine

GOLDEN = Path(__file__).parent / "golden"
KINDS = ("medusa", "draft", "fp8")
# The 43 parameter placeholders map to the same keys except these three, plus two fixed keys.
RENAMED = {"batching_strategy": "gpt_model_type", "engine_dir": "gpt_model_path",
           "encoder_engine_dir": "encoder_model_path"}
PINNED_KEYS = {RENAMED.get(p, p) for p in LLM_PARAMETER_PLACEHOLDERS} | {
    "FORCE_CPU_ONLY_INPUT_TENSORS", "executor_worker_path"}


def parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def configs(repo: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sorted(repo.glob("*/config.pbtxt"))}


@pytest.fixture(scope="module", params=KINDS)
def trt_repo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp(f"trt-{request.param}")
    engine = make_fake_trtllm_engine(root, request.param)
    repo = write_repository(engine, root / "repo", RepoOptions(max_queue_delay_us=100))
    return request.param, engine.resolve(), repo


def test_every_config_parses_into_model_config(trt_repo) -> None:  # type: ignore[no-untyped-def]
    kind, _, repo = trt_repo
    cfgs = configs(repo)
    expected = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"}
    assert set(cfgs) == expected | ({"tensorrt_llm_draft"} if kind == "draft" else set())
    for name, path in cfgs.items():
        mc = parse(path)
        assert mc.name == name
    assert (repo / "ensemble" / "1").is_dir()


def test_configs_match_golden_files(trt_repo) -> None:  # type: ignore[no-untyped-def]
    kind, engine, repo = trt_repo
    for name, path in configs(repo).items():
        text = path.read_text().replace(str(engine), "<ENGINE>")
        golden = GOLDEN / kind / name / "config.pbtxt"
        if os.environ.get("SPECSERVE_UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert text == golden.read_text(), f"{kind}/{name} differs from its golden file"


def test_tensorrt_llm_parameters_are_exactly_the_pinned_keys(trt_repo) -> None:  # type: ignore[no-untyped-def]
    kind, engine, repo = trt_repo
    for name in ("tensorrt_llm",) + (("tensorrt_llm_draft",) if kind == "draft" else ()):
        mc = parse(repo / name / "config.pbtxt")
        assert mc.backend == "tensorrtllm"
        assert set(mc.parameters) == PINNED_KEYS
        assert len(PINNED_KEYS) == 45
        params = {k: v.string_value for k, v in mc.parameters.items()}
        sub = "draft" if name == "tensorrt_llm_draft" else "target"
        assert params["gpt_model_path"] == str(engine / sub)
        assert params["gpt_model_type"] == "inflight_fused_batching"
        if kind in ("medusa", "fp8"):
            assert params["decoding_mode"] == "medusa"
            assert params["medusa_choices"] == brace(MEDUSA_CHOICES)
            assert params["medusa_choices"].startswith("{0}, {0, 0}, {1}")
        else:
            assert params["medusa_choices"] == ""
            assert params["enable_kv_cache_reuse"] == "true"  # draft-target needs KV reuse
        assert mc.model_transaction_policy.decoupled == (name == "tensorrt_llm")
        assert mc.dynamic_batching.max_queue_delay_microseconds == 100


def test_ensemble_contract_names(trt_repo) -> None:  # type: ignore[no-untyped-def]
    _, _, repo = trt_repo
    mc = parse(repo / "ensemble" / "config.pbtxt")
    inputs = {i.name for i in mc.input}
    outputs = {o.name for o in mc.output}
    assert {"text_input", "max_tokens", "stream", "temperature", "top_k", "top_p", "end_id",
            "pad_id", "seed", "exclude_input_in_output", "min_tokens",
            "return_perf_metrics", "return_num_output_tokens"} <= inputs
    assert {"text_output", "acceptance_rate", "total_accepted_draft_tokens",
            "total_draft_tokens", "arrival_time_ns", "first_token_time_ns",
            "last_token_time_ns", "num_output_tokens"} <= outputs
    assert "spec_stats_json" not in outputs  # reference-only extension
    llm = parse(repo / "tensorrt_llm" / "config.pbtxt")
    llm_in = {i.name for i in llm.input}
    for step in mc.ensemble_scheduling.step:  # every mapped tensor exists in the step model
        model = parse(repo / step.model_name / "config.pbtxt")
        assert set(step.input_map) <= {i.name for i in model.input}
        assert set(step.output_map) <= {o.name for o in model.output}
    assert {"input_ids", "input_lengths", "request_output_len", "streaming", "seed",
            "min_tokens", "return_perf_metrics"} <= llm_in


def test_fp8_records_world_size(trt_repo) -> None:  # type: ignore[no-untyped-def]
    kind, _, repo = trt_repo
    meta = json.loads((repo / "specserve_repo.json").read_text())
    assert meta["world_size"] == (2 if kind == "fp8" else 1)


def test_existing_out_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    engine = make_fake_trtllm_engine(tmp_path, "medusa")
    out = tmp_path / "repo"
    write_repository(engine, out)
    marker = out / "ensemble" / "config.pbtxt"
    before = marker.read_text()
    with pytest.raises(SpecserveError, match="already exists"):
        write_repository(engine, out, RepoOptions(max_batch_size=2))
    assert marker.read_text() == before
    write_repository(engine, out, RepoOptions(max_batch_size=2), force=True)
    assert "max_batch_size: 2" in marker.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine-medusa", "repo"]


@pytest.mark.parametrize("content, message", [
    (None, "build_config.json: not found"),
    ("{oops", "invalid JSON"),
    ('{"backend": "onnx"}', "backend must be 'torch' or 'trtllm'"),
    ('{"backend": "torch", "spec_mode": "magic"}', "unknown spec_mode"),
])
def test_bad_engine_dir(tmp_path: Path, content: str | None, message: str) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    if content is not None:
        (engine / "build_config.json").write_text(content)
    with pytest.raises(SpecserveError, match=message):
        write_repository(engine, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]


def test_baseline_needs_reference_engine(tmp_path: Path) -> None:
    engine = make_fake_trtllm_engine(tmp_path, "medusa")
    with pytest.raises(SpecserveError, match="--baseline needs a reference"):
        write_repository(engine, tmp_path / "repo", RepoOptions(baseline=True))


def test_reference_repo_shape(tmp_path: Path) -> None:
    engine = make_fake_trtllm_engine(tmp_path, "medusa")
    cfg = json.loads((engine / "build_config.json").read_text())
    cfg["backend"] = "torch"
    (engine / "medusa").mkdir()
    (engine / "build_config.json").write_text(json.dumps(cfg))
    repo = write_repository(engine, tmp_path / "repo", RepoOptions(baseline=True))
    assert set(configs(repo)) == {"ensemble", "ensemble_baseline", "preprocessing",
                                  "postprocessing", "tensorrt_llm", "tensorrt_llm_baseline",
                                  "tensorrt_llm_bls"}
    for name in ("tensorrt_llm", "tensorrt_llm_baseline"):
        mc = parse(repo / name / "config.pbtxt")
        assert mc.backend == "python"
        assert "spec_stats_json" in {o.name for o in mc.output}
        on = mc.parameters["specserve_speculation"].string_value
        assert on == ("on" if name == "tensorrt_llm" else "off")
        assert "specserve.triton.models.llm" in (repo / name / "1" / "model.py").read_text()
    base = parse(repo / "ensemble_baseline" / "config.pbtxt")
    assert [s.model_name for s in base.ensemble_scheduling.step] == [
        "preprocessing", "tensorrt_llm_baseline", "postprocessing"]
    assert "spec_stats_json" in {o.name for o in base.output}


def test_cli_repo_writes_and_reports(tmp_path: Path) -> None:
    from specserve.cli.main import cli

    engine = make_fake_trtllm_engine(tmp_path, "draft")
    runner = CliRunner()
    res = runner.invoke(cli, ["repo", "--engine", str(engine), "--out", str(tmp_path / "r"),
                              "--max-batch-size", "3", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert "tensorrt_llm_draft" in data["models"]
    assert parse(tmp_path / "r" / "tensorrt_llm" / "config.pbtxt").max_batch_size == 3
    again = runner.invoke(cli, ["repo", "--engine", str(engine), "--out", str(tmp_path / "r")])
    assert again.exit_code == 2
    assert "already exists" in again.output
