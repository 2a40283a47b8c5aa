"""Pure pieces of the ``tensorrt_llm_bls`` model (stdlib only; copied into the repository's
``tensorrt_llm_bls/1/lib/``): which BLS input goes to which model input (:func:`route`,
:func:`target_inputs`: the BLS door's request mapping), the outputs forwarded, parameter
reading, and TensorRT-LLM's word-list layout (tensorrt_llm_bls config of the pinned
release)."""

from __future__ import annotations

from typing import Any

# BLS input -> (model, input name)
PRE = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
        "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
LLM = {"exclude_input_in_output": "exclude_input_in_output", "top_k": "runtime_top_k",
        "top_p": "runtime_top_p", "temperature": "temperature", "length_penalty": "len_penalty",
        "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
        "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
        "seed": "seed", "return_perf_metrics": "return_perf_metrics",
        "return_num_input_tokens": "return_num_input_tokens",
        "return_num_output_tokens": "return_num_output_tokens", "beam_width": "beam_width",
        "num_return_sequences": "num_return_sequences", "stream": "streaming",
        "return_log_probs": "return_log_probs", "return_context_logits": "return_context_logits",
        "return_generation_logits": "return_generation_logits",
        "guided_decoding_guide_type": "guided_decoding_guide_type",
        "guided_decoding_guide": "guided_decoding_guide",
        # the reference target's own inputs (declared by reference repositories' BLS only)
        "num_top_log_probs": "num_top_log_probs", "prediction": "prediction"}
PRE_OUT = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths",
            "REQUEST_OUTPUT_LEN": "request_output_len", "BAD_WORDS_IDS": "bad_words_list",
            "STOP_WORDS_IDS": "stop_words_list", "OUT_END_ID": "end_id", "OUT_PAD_ID": "pad_id"}
FORWARD = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
            "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens",
            "total_draft_tokens", "num_input_tokens", "num_output_tokens", "spec_stats_json",
            "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
            "sequence_index", "top_log_probs", "top_log_prob_ids",
            "accepted_prediction_tokens", "rejected_prediction_tokens")
# structured output: passed to the target unchanged without speculation (it serves them or
# refuses them by name); refused by the speculation loop (each target call of the loop would
# start the grammar afresh and the draft would ignore it)
GUIDE_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")
# asked of the target as the client asked them without speculation; refused with it (the loop's
# answer is many calls, upstream's BLS returns the last call's values only)
LOGITS_INPUTS = ("return_log_probs", "return_context_logits", "return_generation_logits")
# served by the reference target without speculation; refused by the loop, whose drafts come
# from its own source (draft model or prompt lookup) and whose target calls are single verify
# steps of those drafts: a prediction there would be dropped, or its counts made up
TARGET_ONLY_INPUTS = ("num_top_log_probs", "prediction")
# forwarded unchanged to the draft and the target of the loop (the models judge them)
SPEC_PASS = ("length_penalty", "repetition_penalty", "presence_penalty", "frequency_penalty")
MISSING = ("not found", "unknown model", "not ready", "unavailable")



def route(inputs: dict[str, Any], decoupled: bool) -> int:
    """``num_draft_tokens`` k of a BLS request: 0 forwards it to the target
    (:func:`target_inputs`), else the speculation loop runs it; ValueError for what this BLS
    cannot answer (``num_return_sequences`` > 1 on a BLS that is not decoupled)."""
    k = int(scalar(inputs, "num_draft_tokens", 0))
    if not decoupled and int(scalar(inputs, "num_return_sequences", 1)) > 1:
        raise ValueError("num_return_sequences > 1 needs a decoupled tensorrt_llm_bls "
                         "(one response per sequence)")
    return k


def target_inputs(inputs: dict[str, Any], pre: dict[str, Any], decoupled: bool,
                  reference: bool = False) -> dict[str, Any]:
    """The target's inputs of a request forwarded without speculation: preprocessing's outputs
    (under the target's names) and the client's inputs renamed by :data:`LLM` (``streaming``
    dropped on a BLS that is not decoupled). A ``reference`` target (parameter
    ``specserve_reference_target``) also gets the client's ``num_draft_tokens`` 0, which there
    means no speculation, as at the target's own door."""
    out = dict(pre)
    out.update({LLM[k]: as_batch(v) for k, v in inputs.items() if k in LLM})
    if reference and "num_draft_tokens" in inputs:
        out["num_draft_tokens"] = as_batch(inputs["num_draft_tokens"])
    if not decoupled:
        out.pop("streaming", None)
    return out


def param(params: dict[str, str], key: str, default: str) -> str:
    value = params.get(key, "")
    return default if not value or value.startswith("${") else value


def flag(params: dict[str, str], key: str, default: bool = False) -> bool:
    return param(params, key, str(default).lower()).lower() in ("true", "1", "yes")


def as_batch(a: Any) -> Any:
    """BLS inputs reshaped to scalars arrive as [1]; models want [1, 1]."""
    return a.reshape(1, -1) if a.ndim == 1 else a


def scalar(inputs: dict[str, Any], name: str, default: Any) -> Any:
    a = inputs.get(name)
    return default if a is None or a.size == 0 else a.reshape(-1)[0].item()


def word_lists(arr: Any) -> tuple[tuple[int, ...], ...]:
    """TensorRT-LLM's ``[1, 2, L]`` word list (flat ids; end offsets, -1 padded) as words."""
    if arr is None or arr.size == 0 or arr.size % 2:
        return ()
    ids, ends = arr.reshape(2, -1)
    words, start = [], 0
    for end in ends:
        if end < 0:
            break
        words.append(tuple(int(t) for t in ids[start:int(end)]))
        start = int(end)
    return tuple(w for w in words if w)
