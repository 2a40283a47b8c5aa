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
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from specserve.errors import SpecserveError
from specserve.spec.tree import to_brace as brace
from specserve.triton.model_params import ModelParams
from specserve.triton.params import LLM_PARAMETER_PLACEHOLDERS
from specserve.triton.repository import RepoOptions, write_repository
from tests.helpers.server import FAKE_MEDUSA_CHOICES as MEDUSA_CHOICES
from tests.helpers.server import make_fake_trtllm_engine, trtllm_build_config

GOLDEN = Path(__file__).parent / "golden"
KINDS = ("medusa", "draft", "fp8", "ngram")
# The 43 parameter placeholders map to the same keys except these three, plus two fixed keys.
RENAMED = {"batching_strategy": "gpt_model_type", "engine_dir": "gpt_model_path",
           "encoder_engine_dir": "encoder_model_path"}
PINNED_KEYS = {RENAMED.get(p, p) for p in LLM_PARAMETER_PLACEHOLDERS} | {
    "FORCE_CPU_ONLY_INPUT_TENSORS", "executor_worker_path"}


def fake_engine(root: Path, kind: str, **record: object) -> Path:
    """A fake TensorRT-LLM engine dir: the helper's kinds, plus "ngram" and "eagle" (target
    only); ``record`` overrides build_config.json keys."""
    if kind in ("ngram", "eagle"):
        engine = root / f"engine-{kind}"
        for sub in ("target", "tokenizer"):
            (engine / sub).mkdir(parents=True, exist_ok=True)
        cfg = {**trtllm_build_config("draft"), "spec_mode": kind,
               "max_draft_len": 4 if kind == "ngram" else 63}
    else:
        engine = make_fake_trtllm_engine(root, kind)
        cfg = json.loads((engine / "build_config.json").read_text())
    cfg.update(record)
    (engine / "build_config.json").write_text(json.dumps(cfg, indent=2))
    return engine


def parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def configs(repo: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sorted(repo.glob("*/config.pbtxt"))}


@pytest.fixture(scope="module", params=KINDS)
def trt_repo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp(f"trt-{request.param}")
    engine = fake_engine(root, request.param)
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
            assert params["enable_kv_cache_reuse"] == "false"
        else:  # draft-target (README) and prompt lookup (README: "must be specified") need reuse
            assert params["medusa_choices"] == ""
            assert params["enable_kv_cache_reuse"] == "true"
        # the BLS loop calls draft-target / n-gram engines with exec(decoupled=False)
        assert mc.model_transaction_policy.decoupled == (kind in ("medusa", "fp8"))
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
        # the reference model reuses KV for every method (a Medusa engine too): the switch is on
        assert mc.parameters["enable_kv_cache_reuse"].string_value == "true"
        assert ModelParams.from_config(
            json_format.MessageToDict(mc, preserving_proto_field_name=True)).prefix_cache_bytes \
            != (0, 0)
        assert "specserve.triton.models.llm" in (repo / name / "1" / "model.py").read_text()
    base = parse(repo / "ensemble_baseline" / "config.pbtxt")
    assert [s.model_name for s in base.ensemble_scheduling.step] == [
        "preprocessing", "tensorrt_llm_baseline", "postprocessing"]
    assert "spec_stats_json" in {o.name for o in base.output}
    # no dynamic batcher on postprocessing, the ensemble's step after the decoupled model:
    # tritonserver 2.51 keeps ~20 KB for every cancelled ensemble request that passes one
    # (benchmarks/triton_cancel_leak.py); TensorRT-LLM repositories keep upstream's (goldens)
    assert not parse(repo / "postprocessing" / "config.pbtxt").HasField("dynamic_batching")


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


# --- upstream's two-model recipe (examples/draft_target_model/README.md) ---

def _params(repo: Path, model: str) -> dict[str, str]:
    return {k: v.string_value for k, v in parse(repo / model / "config.pbtxt").parameters.items()}


def _decoupled(repo: Path, model: str) -> bool:
    return bool(parse(repo / model / "config.pbtxt").model_transaction_policy.decoupled)


def test_draft_target_repo_holds_the_readme_values(tmp_path: Path) -> None:
    """examples/draft_target_model/README.md fills both models with decoupled_mode:False,
    enable_kv_cache_reuse:True, kv_cache_free_gpu_mem_fraction:0.5 (two models on one GPU)."""
    repo = write_repository(fake_engine(tmp_path, "draft"), tmp_path / "repo")
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        p = _params(repo, model)
        assert not _decoupled(repo, model), model
        assert p["enable_kv_cache_reuse"] == "true", model
        assert p["kv_cache_free_gpu_mem_fraction"] == "0.5", model
        assert p["gpu_device_ids"] == "" and p["max_tokens_in_paged_kv_cache"] == "", model
    assert _decoupled(repo, "tensorrt_llm_bls")  # the BLS may stream
    assert _params(repo, "tensorrt_llm_bls")["tensorrt_llm_draft_model_name"] == \
        "tensorrt_llm_draft"


def test_ngram_repo_has_a_non_decoupled_target_with_kv_reuse(tmp_path: Path) -> None:
    repo = write_repository(fake_engine(tmp_path, "ngram"), tmp_path / "repo")
    p = _params(repo, "tensorrt_llm")
    assert not _decoupled(repo, "tensorrt_llm") and _decoupled(repo, "tensorrt_llm_bls")
    assert p["enable_kv_cache_reuse"] == "true"  # prompt lookup README: "must be specified"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.9"  # one model on the GPU
    assert p["decoding_mode"] == "" and not (repo / "tensorrt_llm_draft").exists()


def test_medusa_target_stays_decoupled_and_alone_at_0_9(tmp_path: Path) -> None:
    repo = write_repository(fake_engine(tmp_path, "medusa"), tmp_path / "repo")
    assert _decoupled(repo, "tensorrt_llm")
    assert _params(repo, "tensorrt_llm")["kv_cache_free_gpu_mem_fraction"] == "0.9"


def test_placement_options_reach_both_models(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path, "draft")
    opts = RepoOptions(gpu_device_ids="0", draft_gpu_device_ids=" 1 ",
                       max_tokens_in_paged_kv_cache=2560, max_attention_window_size=2560)
    repo = write_repository(engine, tmp_path / "a", opts)
    target, draft = _params(repo, "tensorrt_llm"), _params(repo, "tensorrt_llm_draft")
    assert (target["gpu_device_ids"], draft["gpu_device_ids"]) == ("0", "1")
    # different GPUs: each model alone on its GPU -> the C++ default 0.9
    assert target["kv_cache_free_gpu_mem_fraction"] == draft["kv_cache_free_gpu_mem_fraction"] \
        == "0.9"
    for p in (target, draft):
        assert p["max_tokens_in_paged_kv_cache"] == p["max_attention_window_size"] == "2560"
    repo = write_repository(engine, tmp_path / "b", RepoOptions(
        kv_cache_fraction=0.7, draft_kv_cache_fraction=0.25))
    assert _params(repo, "tensorrt_llm")["kv_cache_free_gpu_mem_fraction"] == "0.7"
    assert _params(repo, "tensorrt_llm_draft")["kv_cache_free_gpu_mem_fraction"] == "0.25"
    meta = json.loads((repo / "specserve_repo.json").read_text())
    assert meta["options"]["draft_kv_cache_fraction"] == 0.25


def test_tp2_target_counts_as_sharing_gpu0_with_the_draft(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path, "draft", tp_size=2, world_size=2)
    repo = write_repository(engine, tmp_path / "a", RepoOptions(draft_gpu_device_ids="1"))
    assert _params(repo, "tensorrt_llm")["kv_cache_free_gpu_mem_fraction"] == "0.5"  # ranks 0,1
    repo = write_repository(engine, tmp_path / "b", RepoOptions(draft_gpu_device_ids="2"))
    assert _params(repo, "tensorrt_llm_draft")["kv_cache_free_gpu_mem_fraction"] == "0.9"


@pytest.mark.parametrize(("kind", "opts", "message"), [
    ("draft", {"kv_cache_fraction": 0.0}, r"^--kv-cache-fraction 0.0: must be in \(0, 1\]"),
    ("draft", {"draft_kv_cache_fraction": 1.5}, r"^--draft-kv-cache-fraction 1.5: must be in"),
    ("draft", {"kv_cache_fraction": 0.6, "draft_kv_cache_fraction": 0.5},
     r"^--kv-cache-fraction 0.6 \+ --draft-kv-cache-fraction 0.5 = 1.1 > 1: target and draft "
     "share a GPU"),
    ("draft", {"kv_cache_fraction": 0.8}, r"0.8 \+ --draft-kv-cache-fraction 0.5 = 1.3 > 1"),
    ("draft", {"gpu_device_ids": "0;1"}, r"^--gpu-device-ids '0;1': expected comma-separated "
     "non-negative integers"),
    ("draft", {"draft_gpu_device_ids": "-1"}, r"^--draft-gpu-device-ids '-1': expected"),
    ("draft", {"gpu_device_ids": "0,1"}, r"^--gpu-device-ids '0,1': 2 device\(s\) for 1 rank"),
    ("fp8", {"gpu_device_ids": "0,0"}, r"'0,0': a device is listed twice"),
    ("draft", {"max_tokens_in_paged_kv_cache": 0}, r"^--max-tokens-in-paged-kv-cache 0: must "
     "be a positive integer"),
    ("medusa", {"draft_gpu_device_ids": "1"}, r"^--draft-gpu-device-ids: only for draft-target "
     r"engines \(this engine's spec_mode is medusa\)"),
    ("torch", {"kv_cache_fraction": 0.5}, r"^--kv-cache-fraction: a TensorRT-LLM executor "
     "option"),
])
def test_bad_placement_options_are_one_line(tmp_path: Path, kind: str, opts: dict[str, object],
                                            message: str) -> None:
    engine = fake_engine(tmp_path, "medusa" if kind == "torch" else kind,
                         **({"backend": "torch"} if kind == "torch" else {}))
    if kind == "torch":
        (engine / "medusa").mkdir()
    with pytest.raises(SpecserveError, match=message) as info:
        write_repository(engine, tmp_path / "repo", RepoOptions(**opts))  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert not (tmp_path / "repo").exists()


def test_cli_repo_placement_options(tmp_path: Path) -> None:
    from specserve.cli.main import cli

    engine = fake_engine(tmp_path, "draft")
    runner = CliRunner()
    res = runner.invoke(cli, ["repo", "--engine", str(engine), "--out", str(tmp_path / "r"),
                              "--kv-cache-fraction", "0.6", "--draft-kv-cache-fraction", "0.3",
                              "--gpu-device-ids", "0", "--draft-gpu-device-ids", "0",
                              "--max-tokens-in-paged-kv-cache", "2560",
                              "--max-attention-window-size", "2048"])
    assert res.exit_code == 0, res.output
    draft = _params(tmp_path / "r", "tensorrt_llm_draft")
    assert (draft["kv_cache_free_gpu_mem_fraction"], draft["gpu_device_ids"],
            draft["max_attention_window_size"]) == ("0.3", "0", "2048")
    bad = runner.invoke(cli, ["repo", "--engine", str(engine), "--out", str(tmp_path / "s"),
                              "--draft-gpu-device-ids", "gpu1"])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        "error: --draft-gpu-device-ids 'gpu1': expected comma-separated non-negative integers, "
        "e.g. 0 or 0,1"]


# --- EAGLE: the default tree (mc_sim_7b_63) cut to the engine's draft length ---

def test_eagle_choices_cut_the_default_tree_to_max_draft_len(tmp_path: Path) -> None:
    from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

    full = write_repository(fake_engine(tmp_path / "a", "eagle"), tmp_path / "a" / "repo")
    p = _params(full, "tensorrt_llm")
    assert p["decoding_mode"] == "eagle" and p["eagle_choices"] == ""  # C++ default: 63 nodes
    cut = write_repository(fake_engine(tmp_path / "b", "eagle", max_draft_len=20),
                           tmp_path / "b" / "repo")
    text = _params(cut, "tensorrt_llm")["eagle_choices"]
    tree = MedusaTree.from_brace(text)
    assert tree.num_nodes == 20 and set(tree.choices) == set(MC_SIM_7B_63[:20])
    assert text.startswith("{0}, {1}, {2}, {3}")  # depth order, as medusa_choices
    assert tree.depth <= 4  # num_eagle_layers
    assert _params(cut, "tensorrt_llm")["medusa_choices"] == ""


# --- preprocessing: what NVIDIA's BLS model.py requests (audit §4) ---

# upstream tensorrt_llm_bls/1/lib/triton_decoder.py: TritonDecoder._preproc_outputs
NVIDIA_BLS_PREPROC_OUTPUTS = (
    "INPUT_ID", "DECODER_INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_DECODER_INPUT_LEN",
    "BAD_WORDS_IDS", "STOP_WORDS_IDS", "EMBEDDING_BIAS", "OUT_PAD_ID", "OUT_END_ID",
    "OUT_PROMPT_TABLE_EXTRA_IDS", "PIXEL_VALUES", "IMAGE_SIZES", "IS_VIDEO_INPUT",
    "VISION_INPUT_ID", "ATTENTION_MASK", "IMAGE_GRID_THW")
# upstream preprocessing/config.pbtxt: the outputs' types and dims
UPSTREAM_PREPROC_OUTPUTS = {
    "INPUT_ID": ("TYPE_INT32", [-1]), "REQUEST_INPUT_LEN": ("TYPE_INT32", [1]),
    "DECODER_INPUT_ID": ("TYPE_INT32", [-1]), "REQUEST_DECODER_INPUT_LEN": ("TYPE_INT32", [1]),
    "BAD_WORDS_IDS": ("TYPE_INT32", [2, -1]), "STOP_WORDS_IDS": ("TYPE_INT32", [2, -1]),
    "EMBEDDING_BIAS": ("TYPE_FP32", [-1]), "REQUEST_OUTPUT_LEN": ("TYPE_INT32", [-1]),
    "OUT_END_ID": ("TYPE_INT32", [1]), "OUT_PAD_ID": ("TYPE_INT32", [1]),
    "OUT_PROMPT_TABLE_EXTRA_IDS": ("TYPE_UINT64", [-1]),
    "PIXEL_VALUES": ("TYPE_FP16", [-1, -1, -1, -1]), "ASPECT_RATIO_IDS": ("TYPE_INT64", [-1]),
    "ASPECT_RATIO_MASK": ("TYPE_INT64", [-1, -1]),
    "CROSS_ATTENTION_MASK": ("TYPE_INT64", [-1, -1, -1]),
    "IMAGE_SIZES": ("TYPE_INT64", [-1, 2]), "IS_VIDEO_INPUT": ("TYPE_BOOL", [1]),
    "ATTENTION_MASK": ("TYPE_INT64", [-1]), "IMAGE_GRID_THW": ("TYPE_INT64", [3]),
    "VISION_INPUT_ID": ("TYPE_INT32", [-1]),
}


def test_preprocessing_declares_upstream_outputs(trt_repo) -> None:  # type: ignore[no-untyped-def]
    _, _, repo = trt_repo
    mc = parse(repo / "preprocessing" / "config.pbtxt")
    got = {o.name: (model_config_pb2.DataType.Name(o.data_type), list(o.dims))
           for o in mc.output}
    assert got == UPSTREAM_PREPROC_OUTPUTS
    assert [o.name for o in mc.output] == list(UPSTREAM_PREPROC_OUTPUTS)  # upstream's order
    assert set(NVIDIA_BLS_PREPROC_OUTPUTS) <= set(got)


PROBE_CONFIG = """name: "probe"
backend: "python"
max_batch_size: 4
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "json" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
# Calls preprocessing as NVIDIA's BLS does (TritonDecoder.preprocess: the same requested
# outputs, exec(decoupled=False)) and answers what came back.
PROBE_MODEL = '''import json
import numpy as np
import triton_python_backend_utils as pb_utils
WANTED = __WANTED__
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text").as_numpy()
            pre = pb_utils.InferenceRequest(
                model_name="preprocessing", requested_output_names=list(WANTED),
                inputs=[pb_utils.Tensor("QUERY", text),
                        pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.array([[8]], np.int32))])
            res = pre.exec(decoupled=False)
            if res.has_error():
                got = {"error": res.error().message()}
            else:
                got = {t.name(): [str(t.as_numpy().dtype), list(t.as_numpy().shape),
                                  t.as_numpy().reshape(-1).tolist()]
                       for t in res.output_tensors()}
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "json", np.array([[json.dumps(got).encode()]], dtype=object))]))
        return out
'''.replace("__WANTED__", repr(NVIDIA_BLS_PREPROC_OUTPUTS))


@pytest.mark.server
def test_preprocessing_answers_nvidia_bls_requests_on_tritonserver(
        tmp_path: Path, tiny_ckpt) -> None:  # type: ignore[no-untyped-def]
    """A real tritonserver loads our preprocessing and answers the request NVIDIA's BLS makes
    with upstream's text-only values; the multimodal outputs are simply absent."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from specserve.triton.server import TritonServer

    full = write_repository(fake_engine(tmp_path, "draft"), tmp_path / "full",
                            RepoOptions(tokenizer_dir=str(tiny_ckpt.target)))
    repo = tmp_path / "repo"
    (repo / "preprocessing" / "1").mkdir(parents=True)
    (repo / "probe" / "1").mkdir(parents=True)
    for rel in ("preprocessing/config.pbtxt", "preprocessing/1/model.py"):
        (repo / rel).write_text((full / rel).read_text())
    (repo / "probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (repo / "probe" / "1" / "model.py").write_text(PROBE_MODEL)
    with TritonServer(repo, log_path=tmp_path / "server.log").start(timeout_s=120) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("text", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[b"hello world"]], dtype=object))
        res = client.infer("probe", [inp])
        got = json.loads(res.as_numpy("json").reshape(-1)[0])
    assert "error" not in got, got
    assert set(got) == {"INPUT_ID", "DECODER_INPUT_ID", "REQUEST_INPUT_LEN",
                        "REQUEST_DECODER_INPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS",
                        "EMBEDDING_BIAS", "OUT_PAD_ID", "OUT_END_ID"}  # requested ∩ produced
    pad = got["OUT_PAD_ID"][2][0]
    assert got["DECODER_INPUT_ID"] == ["int32", [1, 1], [pad]]
    assert got["REQUEST_DECODER_INPUT_LEN"] == ["int32", [1, 1], [1]]
    assert got["EMBEDDING_BIAS"] == ["float32", [1, 0], []]
    assert got["REQUEST_INPUT_LEN"][2] == [len(got["INPUT_ID"][2])]
