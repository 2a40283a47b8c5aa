"""The PyTorch route's plan and commands around the LLM-API YAML (:mod:`specserve.build.llmapi`):
which HF directory ``trtllm-serve`` loads, the ModelOpt FP8 step, and the ``trtllm-serve`` /
``trtllm-bench`` command lines the plan prints.

- FP8 weights: a ModelOpt-quantized HF checkpoint (``hf_quant_config.json``), loaded without a
  build step; when ``--model`` is not one, the plan's one step is ModelOpt's ``hf_ptq.py``
  export (NVIDIA/TensorRT-Model-Optimizer ``examples/llm_ptq/scripts/huggingface_example.sh``
  @09914046: ``--pyt_ckpt_path --export_path --qformat --kv_cache_qformat --calib_size
  --inference_tensor_parallel --inference_pipeline_parallel --export_fmt hf``). FP8 KV cache:
  ``kv_cache_config.dtype: fp8`` (in the YAML).
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

from specserve.build.config import BuildConfig
from specserve.build.llmapi import LLMAPI_FILE
from specserve.build.pins import RELEASES
from specserve.build.plan import BuildPlan, BuildStep, staging_dir

FP8_EXPORT_DIR = "fp8_target"  # ModelOpt export inside the engine directory
TRTLLM_SERVE = "trtllm-serve"
TRTLLM_BENCH = "trtllm-bench"
SERVE_HOST, SERVE_PORT = "127.0.0.1", 8000
BENCH_ISL = BENCH_OSL = 128
BENCH_REQUESTS = 256
#: ModelOpt's examples/ (clone NVIDIA/TensorRT-Model-Optimizer); override $MODELOPT_EXAMPLES_DIR.
DEFAULT_MODELOPT_EXAMPLES = "TensorRT-Model-Optimizer/examples"
FP8_CALIB_SIZE = 512
HF_QUANT_CONFIG = "hf_quant_config.json"


def is_modelopt_checkpoint(model: str) -> bool:
    return (Path(model) / HF_QUANT_CONFIG).is_file()


def served_model(cfg: BuildConfig) -> str:
    """The HF directory trtllm-serve loads: ``--model``, or the ModelOpt FP8 export."""
    if cfg.quantize == "fp8" and not is_modelopt_checkpoint(cfg.model):
        return os.path.join(cfg.out, FP8_EXPORT_DIR)
    return cfg.model


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
        notes.append("FP8 target + BF16 EAGLE-3 head: check on the device "
                     "(NVIDIA/TensorRT-LLM#7842: one-model EAGLE-3 asserts with an FP8 target); "
                     "`make trtllm-check`")
    return BuildPlan(backend="trtllm", out=cfg.out, staging=staging_dir(cfg.out),
                     steps=(step,) if step else (), world_size=cfg.world_size,
                     notes=tuple(notes),
                     pin={"tensorrt_llm": rel.name, "image": rel.image, "flow": "pytorch"})
