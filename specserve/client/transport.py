"""What every transport shares: the request, the result, and the protocol they meet in.

A transport is a thin I/O adapter to one server: Triton's gRPC stream
(:mod:`specserve.client.triton_grpc`), Triton's HTTP generate extension
(:mod:`specserve.client.triton_http`) or an OpenAI-compatible server
(:mod:`specserve.client.openai`); all satisfy :class:`Transport`.

Each call returns a :class:`RawResult`: arrival times of every response carrying data, its text,
its ``num_output_tokens`` when present, the last value of every perf output, and
``spec_stats_json`` when the reference backend sends it. Times are ``time.perf_counter()``
seconds after the send. Inputs a model does not declare are left out (see
:func:`build_inputs`), so the same client talks to TRT-LLM's ensemble and to simpler ones.

A model that takes token ids and no text (the ``tensorrt_llm`` model itself: ``input_ids``,
``request_output_len``, ``streaming``) is sent the prompt's ids (:attr:`GenParams.input_ids`,
tokenized by the client) and answers ``output_ids``, kept in :attr:`RawResult.output_ids`
(the caller decodes them). Predicted Outputs: ``prediction`` (text) goes to every model that
declares it; ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` come back on the
final response.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from specserve.client.acceptance import EngineAcceptance
from specserve.client.metrics import PERF_OUTPUTS

# Ensemble inputs of the pinned release (TensorRT-LLM 1.2.1): name -> Triton dtype.
INPUT_DTYPES: dict[str, str] = {
    "text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32",
    "top_k": "INT32", "top_p": "FP32", "seed": "UINT64", "end_id": "INT32",
    "exclude_input_in_output": "BOOL", "return_perf_metrics": "BOOL",
    "return_num_output_tokens": "BOOL", "num_draft_tokens": "INT32",
    # sent only through GenParams.extra (specserve conform): stops, min_tokens, log-probs, n
    "stop_words": "BYTES", "min_tokens": "INT32", "return_log_probs": "BOOL",
    "num_return_sequences": "INT32", "return_num_input_tokens": "BOOL",
    "num_top_log_probs": "INT32",   # the reference tensorrt_llm model's own
    "prediction": "BYTES",          # Predicted Outputs (reference ensemble, BLS, tensorrt_llm)
    # the tensorrt_llm model's own names (token ids in and out)
    "input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32",
    "streaming": "BOOL", "runtime_top_k": "INT32", "runtime_top_p": "FP32",
    "guided_decoding_guide_type": "BYTES", "guided_decoding_guide": "BYTES",
}
# outputs kept whole (flattened, in order), not reduced to their first element: log-probs of
# each token (``output_log_probs`` [1, 1, T]) and, from the reference model, its top-k
# (``top_log_probs`` / ``top_log_prob_ids`` [1, 1, T, k])
ARRAY_OUTPUTS = ("output_log_probs", "top_log_probs", "top_log_prob_ids", "output_ids")
PREDICTION_OUTPUTS = ("accepted_prediction_tokens", "rejected_prediction_tokens")



@dataclass(frozen=True)
class GenParams:
    """Sampling parameters sent with every request (``None`` = not sent)."""

    max_tokens: int
    stream: bool = True
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    perf_outputs: bool = True   # ask for perf metrics and per-response token counts
    num_draft_tokens: int | None = None  # tensorrt_llm_bls only (left out where undeclared)
    ignore_eos: bool = False             # OpenAI protocol: generate exactly max_tokens
    # more ensemble inputs by name (names in INPUT_DTYPES), e.g. (("min_tokens", 4),)
    extra: tuple[tuple[str, Any], ...] = ()
    messages: tuple[tuple[str, str], ...] = ()  # OpenAI chat: the history, sent as messages
    prediction: str | None = None        # Predicted Outputs: the expected output's text
    # OpenAI protocol: how the prediction is sent: "nvext" (Dynamo's nvext.annotations
    # "prediction:<text>") or "openai" (OpenAI's top-level {"type": "content", ...})
    prediction_field: str = "nvext"
    input_ids: tuple[int, ...] | None = None  # the prompt's ids, for models that take ids


def takes_ids(declared: frozenset[str] | None) -> bool:
    """Whether a model with these inputs takes token ids and no text (``tensorrt_llm``)."""
    return declared is not None and "input_ids" in declared and "text_input" not in declared


def build_inputs(prompt: str, p: GenParams, declared: frozenset[str] | None) -> dict[str, Any]:
    """Input name -> value (scalars; the ids a tuple), limited to the names the model declares
    (all if ``None``)."""
    if takes_ids(declared):
        if p.input_ids is None:
            raise ValueError("this model takes token ids (input_ids): the client needs the "
                             "model's tokenizer (--tokenizer)")
        ids: dict[str, Any] = {
            "input_ids": tuple(p.input_ids), "input_lengths": len(p.input_ids),
            "request_output_len": p.max_tokens, "streaming": p.stream,
            "temperature": p.temperature, "runtime_top_k": p.top_k, "runtime_top_p": p.top_p,
            "seed": p.seed, "end_id": p.end_id, "exclude_input_in_output": True,
            "return_perf_metrics": p.perf_outputs or None,
            "return_num_output_tokens": p.perf_outputs or None,
            "num_draft_tokens": p.num_draft_tokens, "prediction": p.prediction, **dict(p.extra),
        }
        return {k: v for k, v in ids.items() if v is not None and k in (declared or ())}
    values: dict[str, Any] = {
        "text_input": prompt, "max_tokens": p.max_tokens, "stream": p.stream,
        "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "seed": p.seed,
        "end_id": p.end_id, "exclude_input_in_output": True,
        "return_perf_metrics": p.perf_outputs or None,
        "return_num_output_tokens": p.perf_outputs or None,
        "num_draft_tokens": p.num_draft_tokens, "prediction": p.prediction, **dict(p.extra),
    }
    return {k: v for k, v in values.items()
            if v is not None and (declared is None or k in declared)}


@dataclass
class RawResult:
    """What came back for one request (mutable while the request runs)."""

    send_wall_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)
    chunk_num_tokens: list[int | None] = field(default_factory=list)
    # which sequence each chunk belongs to (``sequence_index``; 0 without num_return_sequences)
    chunk_sequences: list[int] = field(default_factory=list)
    end_s: float | None = None
    server: dict[str, float | int] = field(default_factory=dict)
    spec_stats: dict[str, Any] | None = None
    usage_tokens: int | None = None  # OpenAI ``usage.completion_tokens`` (the request's total)
    acceptance: EngineAcceptance | None = None   # per request, as the engine reported it
    arrays: dict[str, list[Any]] = field(default_factory=dict)  # ARRAY_OUTPUTS, all responses
    # Predicted Outputs, as the server counted them (None: not returned)
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    error: str | None = None
    cancelled: bool = False
    connection_error: bool = False   # the server could not be reached at all
    replica: str | None = None       # pooled runs: the replica that served it (balance.py)

    @property
    def output_ids(self) -> list[int] | None:
        """The emitted token ids where the model answered ids (``None``: text only)."""
        ids = self.arrays.get("output_ids")
        return None if ids is None else [int(x) for x in ids]

    def add_response(self, t: float, outputs: dict[str, Any]) -> None:
        """Record one response's outputs (already decoded to Python values)."""
        for name in PERF_OUTPUTS:
            v = outputs.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.server[name] = v  # ints stay ints: *_time_ns need every digit
        if outputs.get("spec_stats_json"):
            try:
                self.spec_stats = json.loads(outputs["spec_stats_json"])
            except (TypeError, ValueError):
                self.spec_stats = None
        if isinstance(outputs.get("num_input_tokens"), int):
            self.server["num_input_tokens"] = outputs["num_input_tokens"]
        for name in ARRAY_OUTPUTS:
            if outputs.get(name) is not None:
                self.arrays.setdefault(name, []).extend(_flat(outputs[name]))
        for name in PREDICTION_OUTPUTS:
            v = outputs.get(name)
            if v is not None and not isinstance(v, bool):
                n_pred = int(_flat(v)[0]) if isinstance(v, (list, np.ndarray)) else int(v)
                setattr(self, name, n_pred)
        text = outputs.get("text_output")
        n = outputs.get("num_output_tokens")
        ids = outputs.get("output_ids")
        n_ids = len(_flat(ids)) if ids is not None else 0
        if text is None and n is None and not n_ids:
            return  # an empty (final) response
        if n is None and ids is not None:
            n = n_ids   # a model answering ids: its chunk's tokens
        self.chunk_times_s.append(t)
        self.chunk_texts.append(text or "")
        self.chunk_num_tokens.append(None if n is None else int(n))
        seq = outputs.get("sequence_index")
        self.chunk_sequences.append(int(seq) if isinstance(seq, int) else 0)


class Transport(Protocol):
    """One protocol to one server."""

    url: str

    async def declared_inputs(self, model: str) -> frozenset[str]: ...

    async def generate(self, model: str, prompt: str, params: GenParams,
                       declared: frozenset[str] | None, timeout_s: float) -> RawResult: ...

    async def close(self) -> None: ...


def _flat(value: Any) -> list[Any]:
    """An output tensor (numpy array or nested JSON list) as a flat list of Python values."""
    return [x.item() if hasattr(x, "item") else x for x in np.asarray(value).reshape(-1)]
