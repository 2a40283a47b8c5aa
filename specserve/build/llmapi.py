"""TensorRT-LLM's PyTorch route (the LLM API) beside the pinned engine flow: one YAML,
``extra_llm_api_options.yaml``, read by ``trtllm-serve``, ``trtllm-bench`` and Triton's ``llmapi``
model (``model.yaml`` takes the same keys). This module renders it, pure: ``BuildConfig`` in, the
dict of top-level ``TorchLlmArgs`` fields and its YAML text out.

The route in four modules: the keys each release line has (:mod:`specserve.build.llmapi_keys`),
the checks of a config against them (:mod:`specserve.build.llmapi_validate`), this YAML, and the
plan and commands around it: the ModelOpt FP8 step, ``trtllm-serve``, ``trtllm-bench``
(:mod:`specserve.build.llmapi_plan`).
"""

from __future__ import annotations

from typing import Any

from specserve import yamlio
from specserve.build.config import BuildConfig
from specserve.build.llmapi_keys import (
    DEFAULT_KV_FRACTION,
    DEFAULT_MAX_NUM_TOKENS,
    DEFAULT_NGRAM_SIZE,
    decoding_type,
    upper_bound_schedule,
)
from specserve.build.llmapi_validate import spec_option_values
from specserve.build.pins import RELEASES

LLMAPI_FILE = "extra_llm_api_options.yaml"
PERF_METRICS_MAX_REQUESTS = 1000


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
