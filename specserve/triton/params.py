"""Placeholder values for the repository templates (pure).

Every placeholder of the pinned TensorRT-LLM 1.2.1 templates gets a value, because
:func:`specserve.triton.render.render` refuses leftovers. Parameters we do not set are rendered as
an empty string: the C++ backend's ``ModelState::GetParameter`` then fails to parse them
(``std::stoi("")``, "Cannot convert  to a boolean", empty device lists) and falls back to its
default with a warning, exactly as for an unfilled ``${...}``. Values we do set follow
the pinned release's ``inflight_batcher_llm`` configs, and for two-model TensorRT-LLM repositories
upstream's draft-target recipe (tensorrtllm_backend
``examples/draft_target_model/README.md`` fills both models with ``decoupled_mode:False``,
``enable_kv_cache_reuse:True``, ``kv_cache_free_gpu_mem_fraction:0.5`` and their own
``gpu_device_ids``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specserve.errors import SpecserveError
from specserve.triton.options import (
    RepoOptions,
    kv_fractions,
    parse_device_ids,
    trtllm_draft,
)

if TYPE_CHECKING:
    from specserve.engine_record import EngineRecord

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
_DECODING_MODE = {"medusa": "medusa", "eagle": "eagle", "lookahead": "lookahead"}
#: Nodes of the C++ backend's default tree (``mc_sim_7b_63``, also the default ``eagle_choices``).
DEFAULT_TREE_NODES = 63
#: ``${logits_datatype}`` of every template (tensorrt_llm, ensemble, BLS): the type of
#: ``context_logits`` / ``generation_logits`` / ``draft_logits`` (upstream fills TYPE_FP32).
LOGITS_DATATYPE = "TYPE_FP32"
SPEC_STATS_OUTPUT = ',\n  { name: "spec_stats_json" data_type: TYPE_STRING dims: [ 1 ] }'
# the reference tensorrt_llm model's own tensors (specserve.triton.llm_io): per-request
# speculation control and top-k log-probabilities, which no upstream tensor carries
REFERENCE_INPUTS = (
    ',\n  { name: "num_draft_tokens" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } '
    'optional: true }'
    ',\n  { name: "num_top_log_probs" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } '
    'optional: true }'
    ',\n  { name: "prediction" data_type: TYPE_STRING dims: [ 1 ] optional: true '
    'allow_ragged_batch: true }')
REFERENCE_OUTPUTS = (
    ',\n  { name: "top_log_probs" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }'
    ',\n  { name: "top_log_prob_ids" data_type: TYPE_INT32 dims: [ -1, -1, -1 ] }'
    ',\n  { name: "accepted_prediction_tokens" data_type: TYPE_INT32 dims: [ 1 ] }'
    ',\n  { name: "rejected_prediction_tokens" data_type: TYPE_INT32 dims: [ 1 ] }')
SPEC_STATS_MAP = '\n      output_map { key: "spec_stats_json" value: "spec_stats_json" }'
# the reference ensemble and BLS carry the reference model's own tensors (upstream's have no
# such tensors): top-k log-probabilities, per-request speculation control and Predicted
# Outputs (text, tokenized by the tensorrt_llm model as it is at its own door)
ENSEMBLE_TOP_INPUTS = (
    ',\n  { name: "num_top_log_probs" data_type: TYPE_INT32 dims: [ 1 ] optional: true }'
    ',\n  { name: "num_draft_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }'
    ',\n  { name: "prediction" data_type: TYPE_STRING dims: [ 1 ] optional: true '
    'allow_ragged_batch: true }')
ENSEMBLE_TOP_INPUT_MAP = (
    '\n      input_map { key: "num_top_log_probs" value: "num_top_log_probs" }'
    '\n      input_map { key: "num_draft_tokens" value: "num_draft_tokens" }'
    '\n      input_map { key: "prediction" value: "prediction" }')
ENSEMBLE_TOP_OUTPUTS = (
    ',\n  { name: "top_log_probs" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }'
    ',\n  { name: "top_log_prob_ids" data_type: TYPE_INT32 dims: [ -1, -1, -1 ] }'
    ',\n  { name: "accepted_prediction_tokens" data_type: TYPE_INT32 dims: [ 1 ] }'
    ',\n  { name: "rejected_prediction_tokens" data_type: TYPE_INT32 dims: [ 1 ] }')
ENSEMBLE_TOP_OUTPUT_MAP = (
    '\n      output_map { key: "top_log_probs" value: "top_log_probs" }'
    '\n      output_map { key: "top_log_prob_ids" value: "top_log_prob_ids" }'
    '\n      output_map { key: "accepted_prediction_tokens" value: "accepted_prediction_tokens" }'
    '\n      output_map { key: "rejected_prediction_tokens" value: "rejected_prediction_tokens" }')
# the BLS's own num_draft_tokens is upstream's input (its loop's); these it forwards to the
# reference target (reshaped to scalars like the BLS's other inputs)
BLS_REFERENCE_INPUTS = (
    ',\n  { name: "num_top_log_probs" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } '
    'optional: true }'
    ',\n  { name: "prediction" data_type: TYPE_STRING dims: [ 1 ] optional: true '
    'allow_ragged_batch: true }')
BLS_REFERENCE_PARAMETER = (
    '\nparameters: { key: "specserve_reference_target" value: { string_value: "true" } }')


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
    fraction, device_ids = kv_placement(cfg, opts, draft=draft)
    values.update(
        max_beam_width="1", batching_strategy="inflight_fused_batching", engine_dir=str(path),
        batch_scheduler_policy="guaranteed_no_evict", kv_cache_free_gpu_mem_fraction=fraction,
        exclude_input_in_output="false", cancellation_check_period_ms="100",
        stats_check_period_ms="100", normalize_log_probs="true", enable_chunked_context="false",
        # draft-target (README) and prompt lookup ("must be specified for this approach") need
        # KV reuse: the BLS re-sends the whole context every step. The reference model reuses
        # KV for every method (its prefix cache; model_params.py honours the switch).
        enable_kv_cache_reuse=_b(reference or mode in ("draft", "ngram")),
        decoding_mode=_DECODING_MODE.get(mode, "") if (speculation and not draft) else "",
        medusa_choices=_brace(cfg) if medusa else "",
        eagle_choices=eagle_choices(cfg) if mode == "eagle" and speculation and not draft else "",
        gpu_device_ids=device_ids,
        max_tokens_in_paged_kv_cache=_opt_int(opts.max_tokens_in_paged_kv_cache),
        max_attention_window_size=_opt_int(opts.max_attention_window_size),
    )
    if reference and not speculation:
        values["decoding_mode"] = "top_k_top_p"
    if mode == "lookahead" and speculation and not draft:
        values.update(lookahead_parameters(cfg))
    if opts.fast_logits and trtllm_draft(cfg):
        values.update(speculative_decoding_fast_logits="1",
                      participant_ids=participant_ids(cfg, draft=draft))
    # Draft-target and n-gram TensorRT-LLM engines: the BLS drives the engines step by step
    # through request.exec(decoupled=False) (upstream's triton_decoder.py), so neither the
    # target nor the draft may be decoupled; the BLS itself may stream.
    decoupled = opts.decoupled and not draft and not bls_driven(cfg)
    values.update(
        model_name=name, triton_backend="python" if reference else "tensorrtllm",
        triton_max_batch_size=str(batch), decoupled_mode=_b(decoupled),
        max_queue_delay_microseconds=str(opts.max_queue_delay_us), max_queue_size="0",
        encoder_input_features_data_type="TYPE_FP16", logits_datatype=LOGITS_DATATYPE,
        prompt_embedding_table_data_type="TYPE_FP16",
        specserve_extra_inputs=REFERENCE_INPUTS if reference else "",
        specserve_extra_outputs=SPEC_STATS_OUTPUT + REFERENCE_OUTPUTS if reference else "",
        specserve_parameters=(
            '\nparameters: { key: "specserve_speculation" value: { string_value: "%s" } }'
            % ("on" if speculation else "off")
            # the reference tensorrt_llm_draft: the engine's draft/ checkpoint alone
            + ('\nparameters: { key: "specserve_checkpoint" value: { string_value: "draft" } }'
               if draft else "")) if reference else "",
    )
    return values


def lookahead_parameters(cfg: EngineRecord) -> dict[str, str]:
    """``lookahead_window_size`` / ``lookahead_ngram_size`` / ``lookahead_verification_set_size``
    of a lookahead engine, from its record (the C++ backend refuses to load ``decoding_mode
    lookahead`` without all three; ``specserve.spec.lookahead``); the recorded (W, N, G) must
    give the engine's ``max_draft_len``."""
    from specserve.spec.lookahead import Lookahead

    la = Lookahead.from_dict(cfg.get("lookahead"), str(cfg.path))
    if la.max_draft_len != cfg.max_draft_len:
        raise SpecserveError(f"{cfg.path}: lookahead {la.text()} gives max_draft_len "
                             f"{la.max_draft_len}, the engine was built with "
                             f"{cfg.max_draft_len} (rebuild the engine)")
    return la.triton_parameters()


def participant_ids(cfg: EngineRecord, *, draft: bool) -> str:
    """MPI ranks of a fast-logits draft-target repository (upstream's draft-target README §8:
    rank 0 is the orchestrator, rank 1 the draft (one rank), the rest the target's
    ``world_size`` ranks); ``specserve serve`` starts 1 + draft + target ranks."""
    ranks = [1] if draft else list(range(2, 2 + cfg.world_size))
    return ",".join(map(str, ranks))


def bls_driven(cfg: EngineRecord) -> bool:
    """TensorRT-LLM engines whose speculation the BLS drives (draft-target, n-gram)."""
    return cfg.backend == "trtllm" and cfg.spec_mode in ("draft", "ngram")


def kv_placement(cfg: EngineRecord, opts: RepoOptions, *, draft: bool) -> tuple[str, str]:
    """(kv_cache_free_gpu_mem_fraction, gpu_device_ids) rendered for one model."""
    target_f, draft_f = kv_fractions(cfg, opts)
    fraction = draft_f if draft and draft_f is not None else target_f
    spec = opts.draft_gpu_device_ids if draft else opts.gpu_device_ids
    ids = parse_device_ids(spec, "--draft-gpu-device-ids" if draft else "--gpu-device-ids")
    return format(fraction, "g"), ",".join(str(i) for i in ids)


def _opt_int(value: int | None) -> str:
    return "" if value is None else str(value)


def eagle_choices(cfg: EngineRecord) -> str:
    """``eagle_choices`` in brace form: "" (the C++ default ``mc_sim_7b_63``, 63 nodes) when
    ``max_draft_len`` >= 63, else the first ``max_draft_len`` nodes of ``mc_sim_7b_63`` in its
    own order (every prefix of it is a tree: each node comes after its parent), sorted by depth.
    The default tree cannot be used by an engine built for fewer draft tokens."""
    if not 0 < cfg.max_draft_len < DEFAULT_TREE_NODES:
        return ""
    from specserve.spec.tree import MC_SIM_7B_63, MedusaTree, to_brace

    return to_brace(MedusaTree.from_choices(MC_SIM_7B_63[:cfg.max_draft_len]).choices)


def _brace(cfg: EngineRecord) -> str:
    """The recorded tree in brace form (``spec.tree`` imports torch: only for Medusa repos)."""
    from specserve.spec.tree import to_brace

    return to_brace(cfg.medusa_choices or ())


def ensemble_mapping(name: str, llm: str, batch: int, reference: bool) -> dict[str, str]:
    return {
        "ensemble_name": name, "tensorrt_llm_model_name": llm,
        "triton_max_batch_size": str(batch), "logits_datatype": LOGITS_DATATYPE,
        "specserve_extra_inputs": ENSEMBLE_TOP_INPUTS if reference else "",
        "specserve_extra_input_map": ENSEMBLE_TOP_INPUT_MAP if reference else "",
        "specserve_extra_outputs": SPEC_STATS_OUTPUT + ENSEMBLE_TOP_OUTPUTS if reference
        else "",
        "specserve_extra_output_map": SPEC_STATS_MAP + ENSEMBLE_TOP_OUTPUT_MAP if reference
        else "",
    }


def bls_mapping(batch: int, opts: RepoOptions, reference: bool, draft: bool,
                spec: dict[str, str]) -> dict[str, str]:
    """Values for ``tensorrt_llm_bls/config.pbtxt``; ``spec``: :func:`bls_spec_mapping`."""
    return {
        "triton_max_batch_size": str(batch), "logits_datatype": LOGITS_DATATYPE,
        "decoupled_mode": _b(opts.decoupled),
        "bls_instance_count": str(opts.bls_instance_count),
        "accumulate_tokens": _b(opts.accumulate_tokens),
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": "tensorrt_llm_draft" if draft else "",
        "multimodal_encoders_name": "",
        # the draft's generation_logits are then a fast-logits handle, passed to the target as
        # they are (lib/spec_io.py); "" = per-position logits
        "speculative_decoding_fast_logits": "1" if opts.fast_logits and draft else "",
        "specserve_extra_inputs": BLS_REFERENCE_INPUTS if reference else "",
        "specserve_extra_outputs": SPEC_STATS_OUTPUT + ENSEMBLE_TOP_OUTPUTS if reference
        else "",
        # the target is the reference model: it takes num_draft_tokens (0 = no speculation),
        # num_top_log_probs and prediction (lib/request.py target_inputs)
        "specserve_parameters": BLS_REFERENCE_PARAMETER if reference else "",
        **spec,
    }


DEFAULT_NGRAM_MAX_SIZE = 3  # the reference NgramProposer's and the BLS prompt lookup's max n


def bls_spec_mapping(cfg: EngineRecord, engine_dir: Path, *,
                     target_decoupled: bool) -> dict[str, str]:
    """The BLS loop's parameters (specserve's BLS model.py; NVIDIA's ignores them):
    ``speculative_mode`` (draft | ngram | ""), the target's ``max_draft_len``,
    ``ngram_max_size``, whether ``tensorrt_llm`` / ``tensorrt_llm_draft`` are decoupled, the
    target's vocabulary size (checked against the draft's generation logits) and whether the
    draft's logits may go to the target at all (``use_draft_logits``)."""
    mode = cfg.spec_mode if cfg.spec_mode in ("draft", "ngram") else ""
    ngram = cfg.get("ngram_max_size") or DEFAULT_NGRAM_MAX_SIZE
    return {
        "speculative_mode": mode,
        "max_draft_len": str(cfg.max_draft_len) if mode else "",
        "ngram_max_size": str(ngram) if mode == "ngram" else "",
        "tensorrt_llm_decoupled": _b(target_decoupled),
        "tensorrt_llm_draft_decoupled": "false",
        "tensorrt_llm_vocab_size": target_vocab_size(engine_dir) if mode == "draft" else "",
        # false for a draft padded to another vocab_size (build_config.json draft_logits):
        # its drafts are accepted by token ids and the BLS refuses use_draft_logits
        "specserve_draft_logits": ("false" if cfg.get("draft_logits") is False else "true")
        if mode == "draft" else "",
    }


def target_vocab_size(engine_dir: Path) -> str:
    """``vocab_size`` of ``engine_dir/target/config.json`` (HF: top level; TensorRT-LLM:
    ``pretrained_config``), "" when it cannot be read."""
    import json

    try:
        cfg = json.loads((engine_dir / "target" / "config.json").read_text(encoding="utf-8"))
        value = cfg.get("vocab_size", cfg.get("pretrained_config", {}).get("vocab_size"))
    except (OSError, ValueError, AttributeError):
        return ""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else ""


def pre_mapping(batch: int, tokenizer: str, opts: RepoOptions) -> dict[str, str]:
    return {
        "triton_max_batch_size": str(batch), "tokenizer_dir": tokenizer,
        "add_special_tokens": "true", "max_queue_delay_microseconds": str(opts.max_queue_delay_us),
        "max_queue_size": "0",
        "preprocessing_instance_count": str(opts.preprocessing_instance_count),
    }


def post_mapping(batch: int, tokenizer: str, opts: RepoOptions,
                 reference: bool = False) -> dict[str, str]:
    """postprocessing's placeholders. ``dynamic_batching {}`` (upstream's) for TensorRT-LLM
    engines only: on the tritonserver that serves reference (torch) engines here (2.51, the
    ``nvidia-pytriton`` build), a dynamically batched step inside an ensemble keeps ~20 KB for
    every ensemble request cancelled over a gRPC stream (``benchmarks/triton_cancel_leak.py``:
    21.5 / 22.2 KB a request with it, 0.62 / 0.11 without; docs/reliability.md §3), and
    postprocessing's streamed requests rarely share a shape to batch (c = 16 output tok/s was
    the same without it)."""
    return {
        "triton_max_batch_size": str(batch), "tokenizer_dir": tokenizer,
        "skip_special_tokens": "true",
        "postprocessing_instance_count": str(opts.postprocessing_instance_count),
        "postprocessing_dynamic_batching": "" if reference else "dynamic_batching {}",
    }
