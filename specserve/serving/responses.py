"""The serving loop's responses, as numpy arrays in TensorRT-LLM 1.2.1's names, types and
``[batch, beams, tokens]`` shapes (the reference ``tensorrt_llm`` model sends them as they are;
the contract is :mod:`specserve.triton.llm_io`'s docstring; the Dynamo worker reads them into
its chunks): output ids and counts, generation logits, log-probs,
``sequence_index``, Predicted Outputs' counts and the perf outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specserve.serving.request import LlmRequest


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


def generation_logits_array(logits: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """``generation_logits`` [1, 1, T, V] FP32 (``logits_datatype`` of reference repos)."""
    return {"generation_logits": np.asarray(logits, dtype=np.float32)[None, None]}


def logprob_arrays(logprobs: list[float], top: list[list[tuple[int, float]]] | None,
                   k: int) -> dict[str, np.ndarray[Any, Any]]:
    """``output_log_probs`` [1, 1, T] and ``cum_log_probs`` [1, 1] FP32; with ``k`` > 0 also
    ``top_log_probs`` [1, 1, T, k] FP32 and ``top_log_prob_ids`` [1, 1, T, k] INT32."""
    lp = np.asarray(logprobs, dtype=np.float32)
    out: dict[str, np.ndarray[Any, Any]] = {
        "output_log_probs": lp.reshape(1, 1, -1),
        "cum_log_probs": np.array([[float(lp.astype(np.float64).sum())]], dtype=np.float32)}
    if k > 0:
        rows = top or []
        out["top_log_probs"] = np.array([[v for _, v in r] for r in rows],
                                        dtype=np.float32).reshape(1, 1, len(rows), k)
        out["top_log_prob_ids"] = np.array([[t for t, _ in r] for r in rows],
                                           dtype=np.int32).reshape(1, 1, len(rows), k)
    return out


def sequence_index_array(index: int) -> dict[str, np.ndarray[Any, Any]]:
    """``sequence_index`` [1, 1] INT32: which of ``num_return_sequences`` a response holds
    (TensorRT-LLM's output, sent only when ``num_return_sequences`` > 1)."""
    return {"sequence_index": np.array([[index]], dtype=np.int32)}


def prediction_arrays(accepted: int, rejected: int) -> dict[str, np.ndarray[Any, Any]]:
    """``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` [1, 1] INT32."""
    return {"accepted_prediction_tokens": np.array([[accepted]], dtype=np.int32),
            "rejected_prediction_tokens": np.array([[rejected]], dtype=np.int32)}


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
