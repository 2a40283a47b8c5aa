"""Placeholder values for the repository templates (pure).

Every placeholder of the pinned TensorRT-LLM 1.2.1 templates gets a value, because
:func:`specserve.triton.render.render` refuses leftovers. Parameters we do not set are rendered as
an empty string: the C++ backend's ``ModelState::GetParameter`` then fails to parse them
(``std::stoi("")``, "Cannot convert  to a boolean", empty device lists) and falls back to its
default with a warning, exactly as for an unfilled ``${...}``. Values we do set follow
``trtllm-pinned.md`` §3.6 / ``trtllm-facts.md`` §3.3.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specserve.engine_record import EngineRecord
    from specserve.triton.repository import RepoOptions

# The 43 parameter placeholders of tensorrt_llm/config.pbtxt (keys differ for three: see template).
LLM_PARAMETER_PLACEHOLDERS = (
    "max_beam_width", "batching_strategy", "engine_dir", "encoder_engine_dir",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length",
    "batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks", "exclude_input_in_output",
    "cancellation_check_period_ms", "stats_check_period_ms", "iter_stats_max_iterations",
    "request_stats_max_iterations", "enable_kv_cache_reuse", "normalize_log_probs",
    "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes",
    "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir",
    "decoding_mode", "lookahead_window_size", "lookahead_ngram_size",
    "lookahead_verification_set_size", "medusa_choices", "eagle_choices", "gpu_weights_percent",
    "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode", "cuda_graph_cache_size",
    "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
)
_DECODING_MODE = {"medusa": "medusa", "eagle": "eagle"}
SPEC_STATS_OUTPUT = ',\n  { name: "spec_stats_json" data_type: TYPE_STRING dims: [ 1 ] }'
SPEC_STATS_MAP = '\n      output_map { key: "spec_stats_json" value: "spec_stats_json" }'


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def llm_mapping(name: str, engine_dir: Path, cfg: EngineRecord, batch: int, opts: RepoOptions,
                *, speculation: bool, draft: bool = False) -> dict[str, str]:
    """Values for ``tensorrt_llm/config.pbtxt`` (also ``tensorrt_llm_draft``/``_baseline``)."""
    reference = cfg.backend == "torch"
    mode = cfg.spec_mode
    values = dict.fromkeys(LLM_PARAMETER_PLACEHOLDERS, "")
    if reference:
        path = engine_dir
    else:
        path = engine_dir / ("draft" if draft else "target")
    medusa = mode == "medusa" and not draft
    values.update(
        max_beam_width="1", batching_strategy="inflight_fused_batching", engine_dir=str(path),
        batch_scheduler_policy="guaranteed_no_evict", kv_cache_free_gpu_mem_fraction="0.9",
        exclude_input_in_output="false", cancellation_check_period_ms="100",
        stats_check_period_ms="100", normalize_log_probs="true", enable_chunked_context="false",
        enable_kv_cache_reuse=_b(mode == "draft"),
        decoding_mode=_DECODING_MODE.get(mode, "") if (speculation and not draft) else "",
        medusa_choices=_brace(cfg) if medusa else "",
    )
    if reference and not speculation:
        values["decoding_mode"] = "top_k_top_p"
    # draft-target on the pinned release: the BLS drives both engines without streaming.
    decoupled = opts.decoupled and not draft
    values.update(
        model_name=name, triton_backend="python" if reference else "tensorrtllm",
        triton_max_batch_size=str(batch), decoupled_mode=_b(decoupled),
        max_queue_delay_microseconds=str(opts.max_queue_delay_us), max_queue_size="0",
        encoder_input_features_data_type="TYPE_FP16", logits_datatype="TYPE_FP32",
        prompt_embedding_table_data_type="TYPE_FP16",
        specserve_extra_outputs=SPEC_STATS_OUTPUT if reference else "",
        specserve_parameters=(
            '\nparameters: { key: "specserve_speculation" value: { string_value: "%s" } }'
            % ("on" if speculation else "off")) if reference else "",
    )
    return values


def _brace(cfg: EngineRecord) -> str:
    """The recorded tree in brace form (``spec.tree`` imports torch: only for Medusa repos)."""
    from specserve.spec.tree import to_brace

    return to_brace(cfg.medusa_choices or ())


def ensemble_mapping(name: str, llm: str, batch: int, reference: bool) -> dict[str, str]:
    return {
        "ensemble_name": name, "tensorrt_llm_model_name": llm,
        "triton_max_batch_size": str(batch),
        "specserve_extra_outputs": SPEC_STATS_OUTPUT if reference else "",
        "specserve_extra_output_map": SPEC_STATS_MAP if reference else "",
    }


def bls_mapping(batch: int, opts: RepoOptions, reference: bool, draft: bool) -> dict[str, str]:
    return {
        "triton_max_batch_size": str(batch),
        "decoupled_mode": _b(opts.decoupled and not draft),
        "bls_instance_count": str(opts.bls_instance_count),
        "accumulate_tokens": _b(opts.accumulate_tokens),
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": "tensorrt_llm_draft" if draft else "",
        "multimodal_encoders_name": "",
        "specserve_extra_outputs": SPEC_STATS_OUTPUT if reference else "",
    }


def pre_mapping(batch: int, tokenizer: str, opts: RepoOptions) -> dict[str, str]:
    return {
        "triton_max_batch_size": str(batch), "tokenizer_dir": tokenizer,
        "add_special_tokens": "true", "max_queue_delay_microseconds": str(opts.max_queue_delay_us),
        "max_queue_size": "0",
        "preprocessing_instance_count": str(opts.preprocessing_instance_count),
    }


def post_mapping(batch: int, tokenizer: str, opts: RepoOptions) -> dict[str, str]:
    return {
        "triton_max_batch_size": str(batch), "tokenizer_dir": tokenizer,
        "skip_special_tokens": "true",
        "postprocessing_instance_count": str(opts.postprocessing_instance_count),
    }
