"""TensorRT-LLM's PyTorch route (the LLM API) beside the pinned engine flow: one YAML,
``extra_llm_api_options.yaml``, read by ``trtllm-serve``, ``trtllm-bench`` and Triton's ``llmapi``
model (``model.yaml`` takes the same keys).

Keys and semantics are those of the release line ``--trtllm-version`` names
(:mod:`specserve.build.pins`; default 1.2.1; 1.3 = the 1.3.0 rc line Dynamo's images ship, field
set ``tests/build/data/llmapi_fields_1.3.json``: upper-bound ``draft_len_schedule`` keys, the
renamed acceptance pair, no ``eagle3_one_model``, ``speculative_model``). For 1.2.1: its
``tensorrt_llm/llmapi/llm_args.py`` (``TorchLlmArgs``,
``KvCacheConfig``, ``CudaGraphConfig`` and the decoding configs); the field set the goldens are
checked against is ``tests/build/data/llmapi_fields_1.2.1.json`` (its ``source`` names the copy
read). Facts and hazards: ``../shared/reference/llmapi-route.md`` §1-2, §4, §6. Choices made here:

- ``speculative_config.decoding_type``: ``Eagle`` for EAGLE-3 on 1.2.1 (``Eagle3`` on 1.3),
  ``Draft_Target`` (the pydantic ``Literal``;
  the docs' ``DraftTarget`` spelling is not what the discriminated union parses), ``NGram``,
  ``MTP``. The draft is named by ``speculative_model_dir`` (1.2's alias of ``speculative_model``).
- Load-aware speculation in 1.2's semantics: ``draft_len_schedule`` keys are batch-size *lower*
  bounds, key 1 is required and equals ``max_draft_len``; ``max_concurrency`` turns speculation
  off above a batch size; the two are mutually exclusive (later releases flip the key meaning,
  #10860/#12262). In 1.2 both act on two-model (Drafter) paths only, so EAGLE-3 with either gets
  ``eagle3_one_model: false`` and MTP refuses them.
- Options that do not exist in 1.2.1 (``use_rejection_sampling``, the renamed acceptance pair
  ``acceptance_rate_*`` ...) are refused with the PR that added them.
- FP8 weights: a ModelOpt-quantized HF checkpoint (``hf_quant_config.json``), loaded without a
  build step; when ``--model`` is not one, the plan's one step is ModelOpt's ``hf_ptq.py``
  export (NVIDIA/TensorRT-Model-Optimizer ``examples/llm_ptq/scripts/huggingface_example.sh``
  @09914046: ``--pyt_ckpt_path --export_path --qformat --kv_cache_qformat --calib_size
  --inference_tensor_parallel --inference_pipeline_parallel --export_fmt hf``). FP8 KV cache:
  ``kv_cache_config.dtype: fp8``.
- ``trtllm-bench``: the dataset from ``trtllm-bench --model M prepare-dataset --output F
  token-norm-dist ...`` (NVIDIA/TensorRT-LLM ``tensorrt_llm/bench/dataset/prepare_dataset.py``
  @0c8de69a and ``prepare_synthetic_data.py`` @f00d21a3; ported from the ``benchmarks/cpp``
  script by #9250, 2025-11-18) and ``trtllm-bench --model M --model_path P throughput --backend
  pytorch`` (TensorRT-LLM 1.2.0rc6 docs, developer-guide/perf-benchmarking).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from specserve import yamlio
from specserve.build.config import BuildConfig
from specserve.build.pins import DEFAULT_RELEASE, RELEASES, Release
from specserve.build.plan import BuildPlan, BuildStep, staging_dir
from specserve.errors import SpecserveError

LLMAPI_FILE = "extra_llm_api_options.yaml"
FP8_EXPORT_DIR = "fp8_target"  # ModelOpt export inside the engine directory
TRTLLM_SERVE = "trtllm-serve"
TRTLLM_BENCH = "trtllm-bench"
SERVE_HOST, SERVE_PORT = "127.0.0.1", 8000
DECODING_TYPES = {"eagle3": "Eagle3", "draft": "Draft_Target", "ngram": "NGram", "mtp": "MTP"}
DEFAULT_KV_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction default
DEFAULT_MAX_NUM_TOKENS = 8192  # BaseLlmArgs.max_num_tokens default
DEFAULT_NGRAM_SIZE = 2  # NGramDecodingConfig.max_matching_ngram_size default
PERF_METRICS_MAX_REQUESTS = 1000
BENCH_ISL = BENCH_OSL = 128
BENCH_REQUESTS = 256
#: ModelOpt's examples/ (clone NVIDIA/TensorRT-Model-Optimizer); override $MODELOPT_EXAMPLES_DIR.
DEFAULT_MODELOPT_EXAMPLES = "TensorRT-Model-Optimizer/examples"
FP8_CALIB_SIZE = 512
HF_QUANT_CONFIG = "hf_quant_config.json"

#: ``--spec-option KEY=VALUE`` keys per method and release: fields the plan does not set itself.
_BASE_OPTIONS = ("load_format", "allow_advanced_sampling")
_METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "eagle3": ("max_non_leaves_per_layer", "eagle3_layers_to_capture", "eagle3_model_arch"),
    "draft": (),
    "ngram": ("is_keep_all", "is_use_oldest", "is_public_pool"),
    "mtp": ("use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
            "use_mtp_vanilla", "mtp_eagle_one_model", "begin_thinking_phase_token",
            "end_thinking_phase_token"),
}
#: Eagle3 fields 1.2.1 has and the 1.3.0rc27 Eagle3DecodingConfig page does not.
EAGLE3_12_ONLY = ("greedy_sampling", "posterior_threshold", "eagle3_one_model")
#: Keys users meet in newer docs that TensorRT-LLM 1.2.1 does not have (llmapi-route.md §1.2).
LATER_KEYS = {
    "use_rejection_sampling": "#14745/#15775, June 2026",
    "acceptance_rate_window_size": "#12905, April 2026 (1.2.1 has acceptance_window)",
    "acceptance_rate_threshold": "#12905, April 2026 (1.2.1 has acceptance_length_threshold)",
    "advanced_sampling_mode": "the 1.3/1.4 API pages",
    "enable_penalty": "the 1.3/1.4 API pages",
    "spec_dec_variant": "the 1.3/1.4 API pages",
    "min_runtime_draft_len": "#16888, unmerged",
}
#: 1.2.1 keys the 1.3 line renamed or dropped, and what to write instead.
GONE_IN_13 = {
    "acceptance_window": "renamed acceptance_rate_window_size (#12905)",
    "acceptance_length_threshold": "renamed acceptance_rate_threshold, range [0, 1] (#12905)",
    "greedy_sampling": "not a field of 1.3.0rc27's Eagle3DecodingConfig",
    "posterior_threshold": "not a field of 1.3.0rc27's Eagle3DecodingConfig",
    "eagle3_one_model": "not a field of 1.3.0rc27's Eagle3DecodingConfig",
}


def decoding_type(mode: str, rel: Release) -> str:
    """The ``decoding_type`` written: ``Eagle`` for EAGLE-3 on 1.2.1 (both config layouts parse
    it, see :mod:`specserve.build.pins`), the class Literal otherwise."""
    return rel.eagle3_type if mode == "eagle3" else DECODING_TYPES[mode]


def spec_options_for(mode: str, rel: Release) -> tuple[str, ...]:
    """The ``--spec-option`` keys of one method on one release line."""
    extra = EAGLE3_12_ONLY if mode == "eagle3" and rel.eagle3_one_model else ()
    later = ("use_rejection_sampling", "advanced_sampling_mode", "enable_penalty") \
        if rel.name != "1.2.1" else ()
    return _BASE_OPTIONS + rel.acceptance_keys + later + _METHOD_OPTIONS.get(mode, ()) + extra


#: 1.2.1's keys per method (kept for readers of the old name).
SPEC_OPTIONS: dict[str, tuple[str, ...]] = {
    m: spec_options_for(m, RELEASES[DEFAULT_RELEASE]) for m in _METHOD_OPTIONS}


def validate_pytorch_config(cfg: BuildConfig) -> None:
    """Checks of a PyTorch-route config that need no files (one SpecserveError line)."""
    mode = cfg.spec_mode
    if cfg.dtype == "float32" and cfg.quantize == "fp8":
        raise SpecserveError("--dtype float32 with --quantize fp8: use float16 or bfloat16")
    if cfg.kv_cache_fraction is not None and not 0 < cfg.kv_cache_fraction <= 1:
        raise SpecserveError(f"--kv-cache-fraction {cfg.kv_cache_fraction}: must be in (0, 1] "
                             "(kv_cache_config.free_gpu_memory_fraction)")
    for name in ("max_num_tokens", "ngram_size", "max_concurrency", "dynamic_tree_top_k",
                 "max_total_draft_tokens"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise SpecserveError(f"--{name.replace('_', '-')}: must be >= 1, got {value}")
    sizes = cfg.cuda_graph_batch_sizes
    if sizes is not None and (not sizes or min(sizes) < 1 or max(sizes) > cfg.max_batch_size):
        raise SpecserveError(f"--cuda-graph-batch-sizes {','.join(map(str, sizes))}: each must "
                             f"be in 1..--max-batch-size {cfg.max_batch_size}")
    _check_method_options(cfg, mode)
    _check_schedule(cfg, mode)
    spec_option_values(cfg)


def _check_method_options(cfg: BuildConfig, mode: str) -> None:
    only = {"eagle_choices": "eagle3", "dynamic_tree_top_k": "eagle3",
            "max_total_draft_tokens": "eagle3", "ngram_size": "ngram"}
    for name, owner in only.items():
        if getattr(cfg, name) is not None and mode != owner:
            raise SpecserveError(f"--{name.replace('_', '-')}: only with --{owner}")
    rel = RELEASES[cfg.trtllm_version]
    if cfg.dynamic_tree_top_k is not None and not rel.dynamic_tree:
        raise SpecserveError(f"--dynamic-tree-top-k/--max-total-draft-tokens: not in TensorRT-LLM "
                             f"{rel.name} (its validate_eagle_config overwrites "
                             "max_total_draft_tokens with max_draft_len, and the PyTorch dynamic "
                             "tree lands in #12062/#13081, 2026); use --trtllm-version 1.3")
    if cfg.eagle_choices is not None and not rel.eagle3_one_model:
        raise SpecserveError(f"--eagle-choices: TensorRT-LLM {rel.name}'s Eagle3DecodingConfig "
                             "has no eagle3_one_model to select the two-model path that "
                             "upstream's static trees run on; use --trtllm-version 1.2.1, or a "
                             "chain")
    if cfg.eagle_choices is not None and cfg.dynamic_tree_top_k is not None:
        raise SpecserveError("--eagle-choices and --dynamic-tree-top-k: a static tree or a "
                             "dynamic one (1.2.1's EagleDecodingConfig refuses both)")
    if (cfg.dynamic_tree_top_k is None) != (cfg.max_total_draft_tokens is None):
        raise SpecserveError("--dynamic-tree-top-k and --max-total-draft-tokens: the dynamic "
                             "tree needs both (dynamic_tree_max_topK, max_total_draft_tokens)")
    if cfg.eagle_choices is not None:
        from specserve.spec.tree import MedusaTree

        MedusaTree.from_choices(cfg.eagle_choices)  # prefix-closed, or one line


def _check_schedule(cfg: BuildConfig, mode: str) -> None:
    if cfg.draft_len_schedule is None and cfg.max_concurrency is None:
        return
    rel = RELEASES[cfg.trtllm_version]
    if cfg.draft_len_schedule is not None and cfg.max_concurrency is not None:
        raise SpecserveError("--draft-len-schedule and --max-concurrency: mutually exclusive "
                             f"in TensorRT-LLM {rel.name} (give one)")
    if mode == "mtp" and rel.schedule_keys == "lower":
        raise SpecserveError("--draft-len-schedule/--max-concurrency with --mtp: 1.2.1 applies "
                             "them on two-model Drafter paths only, and MTP runs one-model")
    if cfg.draft_len_schedule is None:
        return
    from specserve.spec.schedule import DraftSchedule

    sched = DraftSchedule.parse(cfg.draft_len_schedule)
    k1, top = sched.at(1), max(v for _, v in sched.points)
    if cfg.max_draft_len is not None and k1 != cfg.max_draft_len:
        raise SpecserveError(f"--draft-len-schedule {sched.text()}: {rel.name} requires "
                             f"draft_len_schedule[1] == max_draft_len ({k1} != "
                             f"{cfg.max_draft_len})")
    if top > k1:
        raise SpecserveError(f"--draft-len-schedule {sched.text()}: every draft length must be "
                             f"<= draft_len_schedule[1] = max_draft_len {k1}")
    if rel.schedule_keys == "upper":
        upper_bound_schedule(sched.points, cfg.max_batch_size)  # or one line


def _scalar(text: str) -> Any:
    """A ``--spec-option`` value: true/false, an int, a float, or the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def spec_option_values(cfg: BuildConfig) -> dict[str, Any]:
    """``--spec-option KEY=VALUE`` pairs, each a field of the method's config in the release
    the YAML targets (``--trtllm-version``)."""
    rel = RELEASES[cfg.trtllm_version]
    allowed = spec_options_for(cfg.spec_mode, rel)
    out: dict[str, Any] = {}
    for key, value in cfg.spec_options:
        if rel.name == "1.2.1" and key in LATER_KEYS:
            raise SpecserveError(f"--spec-option {key}: not in TensorRT-LLM 1.2.1 (added by "
                                 f"{LATER_KEYS[key]}; --trtllm-version 1.3 has it)")
        if rel.name != "1.2.1" and key in GONE_IN_13:
            raise SpecserveError(f"--spec-option {key}: not in TensorRT-LLM {rel.name} "
                                 f"({GONE_IN_13[key]})")
        if key not in allowed:
            raise SpecserveError(f"--spec-option {key}: not a {rel.name} field of "
                                 f"{DECODING_TYPES.get(cfg.spec_mode, cfg.spec_mode)}'s config "
                                 f"that specserve passes through (one of: {', '.join(allowed)})")
        out[key] = _scalar(value)
    return out


def upper_bound_schedule(points: tuple[tuple[int, int], ...] | list[tuple[int, int]],
                         max_batch_size: int) -> dict[int, int]:
    """specserve's lower-bound schedule (``1:4,4:2,8:0``: K=4 for batch 1-3, 2 for 4-7, 0 from
    8) in the 1.3 form, whose keys are upper bounds with 0 above the largest (#10860/#12262):
    ``{3: 4, 7: 2}``. The same draft length at every batch size up to ``max_batch_size``."""
    pts = sorted(points)
    out: dict[int, int] = {}
    for i, (lo, k) in enumerate(pts):
        hi = pts[i + 1][0] - 1 if i + 1 < len(pts) else max_batch_size
        hi = min(hi, max_batch_size)
        if hi >= lo and k > 0:
            out[hi] = k
    if not out:
        raise SpecserveError("--draft-len-schedule: no batch size up to --max-batch-size "
                             f"{max_batch_size} drafts (use --max-concurrency or no speculation)")
    if any(k == 0 for lo, k in pts if lo <= max(out)):
        raise SpecserveError("--draft-len-schedule: 1.3's upper-bound keys cannot say 0 between "
                             "two drafting ranges (give the zero at the end)")
    return out


def is_modelopt_checkpoint(model: str) -> bool:
    return (Path(model) / HF_QUANT_CONFIG).is_file()


def served_model(cfg: BuildConfig) -> str:
    """The HF directory trtllm-serve loads: ``--model``, or the ModelOpt FP8 export."""
    if cfg.quantize == "fp8" and not is_modelopt_checkpoint(cfg.model):
        return os.path.join(cfg.out, FP8_EXPORT_DIR)
    return cfg.model


def default_cuda_graph_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to the batch limit, and the limit itself."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if (1 << i) <= max_batch_size]
    return sizes + ([max_batch_size] if sizes[-1] != max_batch_size else [])


def speculative_config(cfg: BuildConfig) -> dict[str, Any]:
    """The ``speculative_config`` block (1.2.1 field names)."""
    mode, rel = cfg.spec_mode, RELEASES[cfg.trtllm_version]
    spec: dict[str, Any] = {"decoding_type": decoding_type(mode, rel)}
    if mode == "mtp":  # MTPDecodingConfig sets max_draft_len from num_nextn_predict_layers
        spec["num_nextn_predict_layers"] = cfg.max_draft_len
    else:
        spec["max_draft_len"] = cfg.max_draft_len
    if mode in ("eagle3", "draft"):
        spec[rel.model_key] = cfg.source_dir
    if mode == "eagle3":
        # two-model (Drafter) paths: load-aware speculation and static trees in 1.2 (every
        # upstream static-tree test builds Eagle3 with eagle3_one_model=False)
        two_model = cfg.draft_len_schedule is not None or cfg.max_concurrency is not None or \
            cfg.eagle_choices is not None
        if rel.eagle3_one_model:  # 1.3 has no such field (one-model, schedules included)
            spec["eagle3_one_model"] = not two_model
        if cfg.eagle_choices is not None:
            spec["eagle_choices"] = [list(p) for p in cfg.eagle_choices]
        if cfg.dynamic_tree_top_k is not None:
            spec.update(use_dynamic_tree=True, dynamic_tree_max_topK=cfg.dynamic_tree_top_k,
                        max_total_draft_tokens=cfg.max_total_draft_tokens)
    if mode == "ngram":
        spec["max_matching_ngram_size"] = cfg.ngram_size or DEFAULT_NGRAM_SIZE
    if cfg.draft_len_schedule is not None:
        from specserve.spec.schedule import DraftSchedule

        points = DraftSchedule.parse(cfg.draft_len_schedule).points
        spec["draft_len_schedule"] = dict(points) if rel.schedule_keys == "lower" else \
            upper_bound_schedule(points, cfg.max_batch_size)
    if cfg.max_concurrency is not None:
        spec["max_concurrency"] = cfg.max_concurrency
    spec.update(spec_option_values(cfg))
    return spec


def llm_api_options(cfg: BuildConfig) -> dict[str, Any]:
    """The whole ``extra_llm_api_options.yaml`` (top-level TorchLlmArgs fields), pure."""
    kv: dict[str, Any] = {
        "free_gpu_memory_fraction": cfg.kv_cache_fraction or DEFAULT_KV_FRACTION,
        "enable_block_reuse": True if cfg.block_reuse is None else cfg.block_reuse,
    }
    if cfg.kv_cache_dtype == "fp8":
        kv["dtype"] = "fp8"
    k = cfg.max_draft_len or 0
    return {
        "tensor_parallel_size": cfg.tp_size,
        "pipeline_parallel_size": cfg.pp_size,
        "max_batch_size": cfg.max_batch_size,
        "max_num_tokens": cfg.max_num_tokens or max(DEFAULT_MAX_NUM_TOKENS,
                                                    cfg.max_batch_size * (k + 1)),
        "max_seq_len": cfg.max_seq_len,
        "kv_cache_config": kv,
        "cuda_graph_config": {
            "batch_sizes": list(cfg.cuda_graph_batch_sizes
                                or default_cuda_graph_sizes(cfg.max_batch_size)),
            "enable_padding": True,
        },
        "enable_iter_perf_stats": True,  # /metrics specDecodingStats
        "return_perf_metrics": True,  # /perf_metrics, Triton llmapi perf outputs
        "perf_metrics_max_requests": PERF_METRICS_MAX_REQUESTS,
        "speculative_config": speculative_config(cfg),
    }


def render_options(cfg: BuildConfig) -> str:
    rel = RELEASES[cfg.trtllm_version]
    head = (f"# specserve build --flow pytorch: TensorRT-LLM {rel.name} LLM API options "
            f"({rel.image})\n# trtllm-serve / trtllm-bench --extra_llm_api_options "
            f"{LLMAPI_FILE}\n")
    return head + yamlio.dump(llm_api_options(cfg))


# --- commands ---------------------------------------------------------------------------------

def options_path(cfg: BuildConfig) -> str:
    return os.path.join(cfg.out, LLMAPI_FILE)


def serve_argv(cfg: BuildConfig) -> list[str]:
    """``trtllm-serve`` on 127.0.0.1 with the YAML (which overrides the CLI values)."""
    return [TRTLLM_SERVE, served_model(cfg), "--host", SERVE_HOST, "--port", str(SERVE_PORT),
            "--backend", "pytorch", "--tp_size", str(cfg.tp_size), "--pp_size",
            str(cfg.pp_size), "--extra_llm_api_options", options_path(cfg)]


def bench_commands(cfg: BuildConfig) -> list[str]:
    """Shell lines: the synthetic dataset with ``trtllm-bench prepare-dataset`` (the script's
    port into the CLI, #9250; the ``benchmarks/`` script path is not in every image), then
    ``trtllm-bench throughput`` with the YAML."""
    model = served_model(cfg)
    dataset = os.path.join(cfg.out, f"synthetic_{BENCH_ISL}_{BENCH_OSL}.json")
    prepare = [TRTLLM_BENCH, "--model", model, "prepare-dataset", "--output", dataset,
               "token-norm-dist", "--num-requests", str(BENCH_REQUESTS),
               "--input-mean", str(BENCH_ISL), "--input-stdev", "0",
               "--output-mean", str(BENCH_OSL), "--output-stdev", "0"]
    bench = [TRTLLM_BENCH, "--model", model, "--model_path", model, "throughput", "--backend",
             "pytorch", "--tp", str(cfg.tp_size), "--pp", str(cfg.pp_size), "--dataset",
             dataset, "--extra_llm_api_options", options_path(cfg)]
    return [shlex.join(prepare), shlex.join(bench)]


def modelopt_examples_dir() -> str:
    return os.environ.get("MODELOPT_EXAMPLES_DIR", DEFAULT_MODELOPT_EXAMPLES)


def quantize_step(cfg: BuildConfig) -> BuildStep | None:
    """ModelOpt FP8 export of ``--model`` (None when it already is a ModelOpt checkpoint)."""
    if cfg.quantize != "fp8" or is_modelopt_checkpoint(cfg.model):
        return None
    out = os.path.join(staging_dir(cfg.out), FP8_EXPORT_DIR)
    argv = ["python3", os.path.join(modelopt_examples_dir(), "llm_ptq/hf_ptq.py"),
            f"--pyt_ckpt_path={cfg.model}", f"--export_path={out}", "--qformat=fp8"]
    if cfg.kv_cache_dtype == "fp8":
        argv.append("--kv_cache_qformat=fp8")
    argv += [f"--calib_size={FP8_CALIB_SIZE}", f"--inference_tensor_parallel={cfg.tp_size}",
             f"--inference_pipeline_parallel={cfg.pp_size}", "--export_fmt=hf"]
    return BuildStep("quantize target (ModelOpt fp8, HF export)", "modelopt", tuple(argv), out)


def make_pytorch_plan(cfg: BuildConfig) -> BuildPlan:
    """The PyTorch route's plan: at most one step (ModelOpt FP8); the rest is one YAML."""
    rel = RELEASES[cfg.trtllm_version]
    step = quantize_step(cfg)
    notes = [f"writes {options_path(cfg)} and build_config.json (flow pytorch; no engine build: "
             f"TensorRT-LLM {rel.name}'s PyTorch backend loads the HF checkpoint)",
             f"serve inside {rel.image}: {shlex.join(serve_argv(cfg))}",
             *(f"benchmark: {line}" for line in bench_commands(cfg))]
    if step is not None:
        notes.insert(0, f"FP8 weights: ModelOpt ({modelopt_examples_dir()}, clone "
                        "NVIDIA/TensorRT-Model-Optimizer) exports an HF checkpoint with "
                        f"{HF_QUANT_CONFIG}; a Hopper (sm90) or newer GPU")
    elif cfg.quantize == "fp8":
        notes.insert(0, f"FP8 weights: {cfg.model} is a ModelOpt checkpoint ({HF_QUANT_CONFIG}); "
                        "loaded as is")
    if cfg.spec_mode == "eagle3" and cfg.quantize == "fp8":
        notes.append("FP8 target + BF16 EAGLE-3 head: check on the device (issue #7842: "
                     "one-model EAGLE-3 asserts with an FP8 target); `make trtllm-check`")
    return BuildPlan(backend="trtllm", out=cfg.out, staging=staging_dir(cfg.out),
                     steps=(step,) if step else (), world_size=cfg.world_size,
                     notes=tuple(notes),
                     pin={"tensorrt_llm": rel.name, "image": rel.image, "flow": "pytorch"})
