"""Triton's ``tensorrt_llm`` inputs -> the serving core's request (pure): the reference
``tensorrt_llm`` model's wire format. The request type and its checks are door-neutral
(:mod:`specserve.serving.request`, :mod:`specserve.serving.admission`), the response tensors
:mod:`specserve.serving.responses`.

Inputs and outputs follow TensorRT-LLM 1.2.1 ``inflight_batcher_llm/tensorrt_llm`` (names, types,
``[batch, beams, tokens]`` output ids). Semantics copied from that release's Python
``tensorrt_llm/1/model.py`` ``convert_response`` (read, not copied):

- streaming: one response per verify step holding only the tokens accepted in that step (several
  under speculation); ``num_output_tokens`` is the number of tokens *in that response* (per chunk,
  not cumulative: the release sets it to ``output_ids.size`` of each response). The request ends
  with a final response holding zero tokens and, when ``return_perf_metrics``, the perf outputs
  and ``spec_stats_json``.
- non-streaming: one response with every token (prompt first unless ``exclude_input_in_output``).
- perf outputs use ``time.monotonic_ns()`` (a steady clock, like TensorRT-LLM's): use differences.
- ``draft_input_ids`` (K tokens after the full context in ``input_ids``; optional
  ``draft_logits`` [K, V], the draft model's raw logits of them): ONE verify step of those
  drafts (:meth:`SpecDecoder.verify <specserve.runtime.decoder.SpecDecoder.verify>`), answering
  the accepted drafts + 1 token, at most ``request_output_len`` (drafts past
  ``request_output_len - 1`` are not verified; a larger ``request_output_len`` still ends after
  that step). Empty ``draft_input_ids`` = none: a plain request. ``return_generation_logits``:
  ``generation_logits`` [1, 1, T, V] FP32 of the T generated tokens (not with streaming).
- ``return_log_probs``: ``output_log_probs`` [1, 1, T] FP32 (the log-probability of
  each of the T generated tokens, :mod:`specserve.spec.logprobs`: the target's distribution
  after temperature, before top-k/top-p) and ``cum_log_probs`` [1, 1] FP32 (their sum), the
  shapes of TensorRT-LLM's ``[batch, beam, tokens]`` / ``[batch, beam]``; streamed, each
  response carries its own tokens' log-probs (``serving.loop.stream_arrays``; refused with
  ``draft_input_ids``). specserve's extensions on reference repositories (tensor names of
  their own, no upstream tensor carries these): input ``num_top_log_probs`` INT32 k (0..20, needs
  ``return_log_probs``) -> outputs ``top_log_probs`` [1, 1, T, k] FP32 and
  ``top_log_prob_ids`` [1, 1, T, k] INT32 (most likely first; OpenAI's ``top_logprobs``);
  input ``num_draft_tokens`` INT32 (the BLS input's semantics, per request: 0 = no speculation,
  k = at most k drafts per step; absent = the engine's); input ``prediction`` STRING (OpenAI's
  Predicted Outputs: the expected output text, tokenized by the model's tokenizer without
  special tokens, a draft source; at most the engine's max_seq_len tokens) -> outputs
  ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` [1, 1] INT32 on the final
  response (:mod:`specserve.runtime.proposers.prediction`).
- structured output: ``guided_decoding_guide_type`` STRING (TensorRT-LLM's names and
  values, tensorrtllm_backend ``tensorrt_llm/1/model.py``
  ``get_guided_decoding_params_from_request``: ``json``, ``json_schema``, ``regex``,
  ``ebnf_grammar``) and ``guided_decoding_guide`` STRING (the schema / regex / grammar; none
  for ``json``), compiled with xgrammar for the model's tokenizer
  (:mod:`specserve.runtime.grammar`); a guide without a type, an unknown type, a malformed
  guide or one the tokenizer cannot express is one error line for that request.
- ``num_return_sequences`` n (TensorRT-LLM's input and semantics, tensorrtllm_backend
  ``tensorrt_llm/1/model.py`` ``convert_response`` @ c2e65b8): n in [1, 16] independent
  sequences (``runtime.params.expand_n``), on a decoupled model only, not with
  ``draft_input_ids``; each response holds one sequence and ``sequence_index`` [1, 1]
  (``serving.responses.sequence_index_array``; the fan-out is ``serving.loop.fan_out``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from specserve.serving.admission import CompileGuide, Encode, sampling_params
from specserve.serving.request import LlmRequest

if TYPE_CHECKING:
    from specserve.runtime.params import SamplingParams
    from specserve.serving.request import EngineLimits
    from specserve.triton.model_params import ModelParams

# Inputs the reference decoder honours; others must be absent or hold their neutral value.
NEUTRAL: dict[str, float] = {
    "len_penalty": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "beam_width": 1,
    "return_context_logits": 0, "early_stopping": 0, "stop": 0,
}
HONOURED = {
    "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list",
    "bad_words_list", "streaming", "temperature", "runtime_top_k", "runtime_top_p", "seed",
    "min_tokens", "exclude_input_in_output", "return_perf_metrics", "return_num_input_tokens",
    "return_num_output_tokens", "draft_input_ids", "draft_logits", "return_generation_logits",
    "return_log_probs", "num_top_log_probs", "num_draft_tokens", "prediction",
    "guided_decoding_guide_type", "guided_decoding_guide", "num_return_sequences",
}
MAYBE_EMPTY = {"draft_input_ids", "draft_logits"}  # empty = no drafts (a plain request)


def _scalar(a: np.ndarray[Any, Any]) -> Any:
    return a.reshape(-1)[0].item()


def word_ids(words: np.ndarray[Any, Any] | None, name: str = "stop_words_list"
             ) -> list[list[int]]:
    """Decode TensorRT-LLM's ``[2, L]`` word list (flat ids; end offsets, -1 padded)."""
    if words is None:
        return []
    if words.size % 2:
        raise ValueError(f"input '{name}' must hold [2, L] values (ids, then end offsets), "
                         f"got {words.size}")
    w = words.reshape(2, -1)
    out, start = [], 0
    for end in w[1]:
        if end < 0:
            break
        out.append([int(t) for t in w[0, start:int(end)]])
        start = int(end)
    return out


def parse_request(arrays: dict[str, np.ndarray[Any, Any]],
                  exclude_default: bool = False) -> LlmRequest:
    """Map one Triton request's numpy inputs (batch dim 1) to an LlmRequest, or raise ValueError
    naming the input the reference backend cannot honour."""
    empty = sorted(name for name, arr in arrays.items()
                   if arr.size == 0 and name not in MAYBE_EMPTY)
    if empty:
        raise ValueError(f"input '{empty[0]}' is empty")
    for name, arr in arrays.items():
        if name in HONOURED:
            continue
        if name not in NEUTRAL or float(_scalar(arr)) != NEUTRAL[name]:
            raise ValueError(f"input '{name}' is not supported by the specserve reference backend")
    if "input_ids" not in arrays or "request_output_len" not in arrays:
        raise ValueError("inputs 'input_ids' and 'request_output_len' are required")
    ids = arrays["input_ids"].reshape(-1)
    n = int(_scalar(arrays["input_lengths"])) if "input_lengths" in arrays else ids.size
    if n <= 0 or n > ids.size:
        raise ValueError(f"input_lengths {n} does not fit input_ids of length {ids.size}")
    if word_ids(arrays.get("bad_words_list"), "bad_words_list"):
        raise ValueError("input 'bad_words_list' is not supported by the specserve reference "
                         "backend")
    stops = word_ids(arrays.get("stop_words_list"))
    if any(len(s) != 1 for s in stops):
        raise ValueError("stop words must be single tokens in the specserve reference backend")
    max_tokens = int(_scalar(arrays["request_output_len"]))
    if max_tokens <= 0:
        raise ValueError(f"request_output_len must be positive, got {max_tokens}")

    def opt(name: str, default: Any) -> Any:
        return _scalar(arrays[name]) if name in arrays else default

    end_id = opt("end_id", None)
    seed = opt("seed", None)
    draft_ids, draft_logits = _drafts(arrays)
    gen_logits = bool(opt("return_generation_logits", False))
    streaming = bool(opt("streaming", False))
    log_probs = bool(opt("return_log_probs", False))
    if gen_logits and streaming:
        raise ValueError("input 'return_generation_logits' is not supported with streaming by "
                         "the specserve reference backend")
    if log_probs and streaming and draft_ids is not None:
        raise ValueError("input 'return_log_probs' is not supported with streaming and "
                         "'draft_input_ids' by the specserve reference backend")
    k = opt("num_draft_tokens", None)
    guide_type = _text(arrays, "guided_decoding_guide_type")
    guide = _text(arrays, "guided_decoding_guide")
    if guide is not None and guide_type is None:
        raise ValueError("input 'guided_decoding_guide' needs 'guided_decoding_guide_type'")
    return LlmRequest(
        prompt=[int(t) for t in ids[:n]], max_tokens=max_tokens,
        streaming=bool(opt("streaming", False)), temperature=float(opt("temperature", 0.0)),
        top_k=int(opt("runtime_top_k", 0)), top_p=float(opt("runtime_top_p", 1.0)),
        seed=None if seed is None else int(seed),
        end_id=None if end_id is None else int(end_id),
        min_tokens=int(opt("min_tokens", 0)), stop_token_ids=tuple(s[0] for s in stops),
        exclude_input=bool(opt("exclude_input_in_output", exclude_default)),
        perf=bool(opt("return_perf_metrics", False)),
        num_input_tokens=bool(opt("return_num_input_tokens", False)),
        num_output_tokens=bool(opt("return_num_output_tokens", False)),
        draft_ids=draft_ids, draft_logits=draft_logits, return_generation_logits=gen_logits,
        return_log_probs=log_probs, top_log_probs=int(opt("num_top_log_probs", 0)),
        num_draft_tokens=None if k is None else int(k), prediction=_text(arrays, "prediction"),
        guide_type=guide_type, guide=guide, n=int(opt("num_return_sequences", 1)),
    )


def _text(arrays: dict[str, np.ndarray[Any, Any]], name: str) -> str | None:
    """A TYPE_STRING [1] input as text (UTF-8), None when absent."""
    if name not in arrays:
        return None
    value = arrays[name].reshape(-1)[0]
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise ValueError(f"input '{name}' is not valid UTF-8") from None


def admit(arrays: dict[str, np.ndarray[Any, Any]], model: ModelParams, decoupled: bool,
          limits: EngineLimits, encode: Encode | None = None,
          guides: CompileGuide | None = None) -> tuple[LlmRequest, SamplingParams]:
    """One Triton request's inputs -> (request, its sampling parameters), every check done."""
    req = parse_request(arrays, model.exclude_default)
    if req.streaming and not decoupled:
        raise ValueError("streaming needs a decoupled model (specserve repo --decoupled)")
    if req.n > 1 and not decoupled:
        raise ValueError("num_return_sequences > 1 needs a decoupled model: each sequence is "
                         "answered by responses of its own (sequence_index), as TensorRT-LLM "
                         "answers them")
    return req, sampling_params(req, limits, encode, guides)


def _drafts(arrays: dict[str, np.ndarray[Any, Any]]
            ) -> tuple[tuple[int, ...] | None, np.ndarray[Any, Any] | None]:
    """(draft ids or None, draft logits [K, V] float32 or None), shapes checked."""
    ids = arrays.get("draft_input_ids")
    logits = arrays.get("draft_logits")
    if ids is None or ids.size == 0:
        if logits is not None and logits.size:
            raise ValueError("input 'draft_logits' needs 'draft_input_ids'")
        return None, None
    draft = tuple(int(t) for t in ids.reshape(-1))
    if logits is None:
        return draft, None
    k = len(draft)
    if logits.ndim < 2 or logits.size == 0 or logits.size // logits.shape[-1] != k:
        raise ValueError(f"input 'draft_logits' must be [K, V] with K = {k} (the "
                         f"draft_input_ids), got shape {list(logits.shape)}")
    q = np.asarray(logits, dtype=np.float32).reshape(k, logits.shape[-1])
    if np.isnan(q).any() or np.isposinf(q).any():
        raise ValueError("input 'draft_logits' holds NaN or +inf")
    return draft, q

