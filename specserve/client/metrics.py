"""Per-request latency records for streamed generation (pure; no I/O).

Definitions follow the benchmark clients compared in ``docs/results.md`` ("Does the client
measure right?": genai-perf/AIPerf,
vLLM ``bench serve``, SGLang ``bench_serving``) with their known fault fixed: under speculative
decoding one streamed chunk carries several tokens, so inter-token latency (ITL) is the gap
between two chunks *divided over the tokens of the later chunk*, never one gap per chunk.

For one request with chunks arriving at ``t_1 < ... < t_n`` (seconds after the send) carrying
``k_1 ... k_n`` tokens (``N = sum k_i``) and the final response at ``T``:

- TTFT = ``t_1``; E2E = ``T``;
- TPOT = ``(E2E - TTFT) / (N - 1)`` (undefined for ``N <= 1``);
- ITL per token: for every chunk ``i >= 2``, ``k_i`` values ``(t_i - t_{i-1}) / k_i``;
  the extra tokens of the first chunk arrive with the first token and get no ITL value;
- ITL per chunk: ``t_i - t_{i-1}`` for ``i >= 2``;
- tokens per step: the chunk sizes ``k_2 ... k_n`` (the first chunk is the prefill token); their
  mean is tau, the mean number of tokens emitted per verify step, when the server streams once
  per step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Perf outputs of TensorRT-LLM >= 0.19 (``return_perf_metrics``), as the ensemble returns them.
PERF_OUTPUTS = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "arrival_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
)


@dataclass(frozen=True)
class Timing:
    """Latency figures derived from one request's chunk timeline (seconds)."""

    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    itl_token_s: tuple[float, ...]
    itl_chunk_s: tuple[float, ...]
    output_tokens: int


def derive_timing(
    chunk_times_s: Sequence[float], chunk_tokens: Sequence[int], end_s: float | None
) -> Timing:
    """Compute TTFT, E2E, TPOT and both ITL flavours from a chunk timeline.

    ``chunk_times_s[i]`` is when chunk ``i`` arrived (seconds after the send, non-decreasing),
    ``chunk_tokens[i]`` how many tokens it carried (chunks with 0 tokens are ignored), ``end_s``
    when the request completed (the final response; ``None`` if it never did).
    """
    if len(chunk_times_s) != len(chunk_tokens):
        raise ValueError("chunk_times_s and chunk_tokens differ in length")
    pairs = [(t, k) for t, k in zip(chunk_times_s, chunk_tokens, strict=True) if k > 0]
    n_tokens = sum(k for _, k in pairs)
    if not pairs:
        return Timing(None, end_s, None, (), (), 0)
    ttft = pairs[0][0]
    itl_token: list[float] = []
    itl_chunk: list[float] = []
    for (t_prev, _), (t, k) in zip(pairs, pairs[1:], strict=False):
        gap = t - t_prev
        itl_chunk.append(gap)
        itl_token.extend([gap / k] * k)
    tpot = None
    if end_s is not None and n_tokens > 1:
        tpot = (end_s - ttft) / (n_tokens - 1)
    return Timing(ttft, end_s, tpot, tuple(itl_token), tuple(itl_chunk), n_tokens)


@dataclass(frozen=True)
class RequestRecord:
    """One request, as written to ``requests.jsonl`` (one JSON object per line)."""

    index: int                      # order of submission in the run
    variant: str                    # "spec" or "baseline"
    phase: str                      # "measure" or "warmup" (warmup is left out of summaries)
    model: str
    url: str
    prompt_index: int
    status: str                     # completed | cancelled | error
    send_time_unix_s: float         # wall clock at the send
    streaming: bool
    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    output_tokens: int
    token_count_source: str         # "server" (num_output_tokens), "usage" (OpenAI usage),
                                    # "tokenizer", "chunks"; "usage+X": X's split, usage's total
    chunk_times_s: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    itl_token_s: tuple[float, ...]
    itl_chunk_s: tuple[float, ...]
    server: dict[str, float | int] = field(default_factory=dict)  # perf outputs, last seen
    spec_stats: dict[str, Any] | None = None   # step counts (spec_stats_json, or an engine's)
    error: str | None = None
    output_text: str = ""
    acceptance_source: str | None = None       # the server field acceptance came from
    category: str = "uncategorized"            # the prompt's category (reports split by it)
    turn: int = 0                              # multi-turn: the turn of the conversation
    input_tokens: int | None = None            # prompt tokens (--tokenizer), when counted
    # Predicted Outputs (client/prediction.py): whether the request carried a prediction, the
    # server's counts (None: not returned), the client's recount (None: not made, the note
    # says why)
    prediction_sent: bool = False
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    prediction_recount: int | None = None
    prediction_recount_note: str | None = None

    @property
    def tokens_per_step(self) -> tuple[int, ...]:
        """Tokens per verify step: the chunk sizes after the first chunk, which carries the
        prefill (context phase) token, as TensorRT-LLM and the reference decoder stream it."""
        return tuple(k for k in self.chunk_tokens if k > 0)[1:]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        for key in ("chunk_times_s", "chunk_tokens", "itl_token_s", "itl_chunk_s"):
            kw[key] = tuple(kw.get(key, ()))
        return cls(**kw)


def make_record(
    *,
    index: int,
    variant: str,
    phase: str,
    model: str,
    url: str,
    prompt_index: int,
    send_time_unix_s: float,
    streaming: bool,
    chunk_times_s: Sequence[float],
    chunk_tokens: Sequence[int],
    end_s: float | None,
    token_count_source: str,
    server: dict[str, float | int] | None = None,
    spec_stats: dict[str, Any] | None = None,
    error: str | None = None,
    cancelled: bool = False,
    output_text: str = "",
    acceptance_source: str | None = None,
    category: str = "uncategorized",
    turn: int = 0,
    input_tokens: int | None = None,
    prediction_sent: bool = False,
    accepted_prediction_tokens: int | None = None,
    rejected_prediction_tokens: int | None = None,
    prediction_recount: int | None = None,
    prediction_recount_note: str | None = None,
) -> RequestRecord:
    """Build a record from a raw timeline; the status follows from ``error``/``cancelled``."""
    timing = derive_timing(chunk_times_s, chunk_tokens, end_s)
    status = "error" if error else ("cancelled" if cancelled else "completed")
    if status == "completed" and end_s is None:
        raise ValueError("a completed request needs end_s")
    return RequestRecord(
        index=index, variant=variant, phase=phase, model=model, url=url,
        prompt_index=prompt_index, status=status, send_time_unix_s=send_time_unix_s,
        streaming=streaming, ttft_s=timing.ttft_s, e2e_s=timing.e2e_s, tpot_s=timing.tpot_s,
        output_tokens=timing.output_tokens, token_count_source=token_count_source,
        chunk_times_s=tuple(float(t) for t in chunk_times_s),
        chunk_tokens=tuple(int(k) for k in chunk_tokens),
        itl_token_s=timing.itl_token_s, itl_chunk_s=timing.itl_chunk_s,
        server=dict(server or {}), spec_stats=spec_stats, error=error, output_text=output_text,
        acceptance_source=acceptance_source, category=category, turn=turn,
        input_tokens=input_tokens, prediction_sent=prediction_sent,
        accepted_prediction_tokens=accepted_prediction_tokens,
        rejected_prediction_tokens=rejected_prediction_tokens,
        prediction_recount=prediction_recount, prediction_recount_note=prediction_recount_note,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q} outside [0, 100]")
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


@dataclass(frozen=True)
class Distribution:
    """mean/p50/p90/p99 (plus n, min, max) of one metric, in the metric's unit."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        vals = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return cls(0, None, None, None, None, None, None)
        return cls(
            n=len(vals), mean=math.fsum(vals) / len(vals), p50=percentile(vals, 50),
            p90=percentile(vals, 90), p99=percentile(vals, 99), min=min(vals), max=max(vals),
        )

    def scaled(self, factor: float) -> Distribution:
        """The same distribution in another unit (e.g. seconds -> milliseconds)."""
        def s(v: float | None) -> float | None:
            return None if v is None else v * factor
        return Distribution(self.n, s(self.mean), s(self.p50), s(self.p90), s(self.p99),
                            s(self.min), s(self.max))
