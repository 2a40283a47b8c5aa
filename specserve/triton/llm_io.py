"""Pure request/response mapping for the reference ``tensorrt_llm`` model.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Inputs the reference decoder honours; others must be absent or hold their neutral value.
NEUTRAL: dict[str, float] = {
    "len_penalty": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "beam_width": 1, "num_return_sequences": 1,
    "return_log_probs": 0, "return_context_logits": 0, "return_generation_logits": 0,
    "early_stopping": 0, "stop": 0,
}
HONOURED = {
    "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list",
    "bad_words_list", "streaming", "temperature", "runtime_top_k", "runtime_top_p", "seed",
    "min_tokens", "exclude_input_in_output", "return_perf_metrics", "return_num_input_tokens",
    "return_num_output_tokens",
}


@dataclass(frozen=True)
class LlmRequest:
    """One request as the reference decoder needs it."""

    prompt: list[int]
    max_tokens: int
    streaming: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    end_id: int | None = None  # None: the tokenizer's EOS; negative: never stop on a token
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    exclude_input: bool = False
    perf: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False


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
    empty = sorted(name for name, arr in arrays.items() if arr.size == 0)
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
    )


@dataclass(frozen=True)
class PerfTimes:
    """Steady-clock timestamps (ns) of one request."""

    arrival: int
    first_scheduled: int
    first_token: int
    last_token: int


def token_arrays(req: LlmRequest, tokens: list[int]) -> dict[str, np.ndarray[Any, Any]]:
    """``output_ids`` [1, 1, T], ``sequence_length`` [1, 1] and the requested token counts."""
    out = {
        "output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
    }
    if req.num_input_tokens:
        out["num_input_tokens"] = np.array([[len(req.prompt)]], dtype=np.int32)
    if req.num_output_tokens:
        out["num_output_tokens"] = np.array([[len(tokens)]], dtype=np.int32)
    return out


def perf_arrays(times: PerfTimes, drafted: int, accepted: int,
                stats_json: str | None) -> dict[str, np.ndarray[Any, Any]]:
    """TensorRT-LLM's perf outputs ([1, 1] each) plus ``spec_stats_json`` when given."""
    rate = accepted / drafted if drafted else 0.0
    out: dict[str, np.ndarray[Any, Any]] = {
        "arrival_time_ns": np.array([[times.arrival]], dtype=np.int64),
        "first_scheduled_time_ns": np.array([[times.first_scheduled]], dtype=np.int64),
        "first_token_time_ns": np.array([[times.first_token]], dtype=np.int64),
        "last_token_time_ns": np.array([[times.last_token]], dtype=np.int64),
        "acceptance_rate": np.array([[rate]], dtype=np.float32),
        "total_accepted_draft_tokens": np.array([[accepted]], dtype=np.int32),
        "total_draft_tokens": np.array([[drafted]], dtype=np.int32),
    }
    if stats_json is not None:
        out["spec_stats_json"] = np.array([[stats_json.encode("utf-8")]], dtype=np.object_)
    return out
