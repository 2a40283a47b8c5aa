"""Each engine's speculative-decoding series in Prometheus exposition text, read into one
shape: a worker's cumulative :class:`Totals` at one scrape (pure).

Series per engine, from the upstream source that defines them:

- ``specserve``: ``specserve:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position}``
  (:mod:`specserve.triton.spec_counters`, the reference Triton model), and the seqlock pair
  ``..._stats_updates_total{phase="begun"|"done"}`` that tells a torn read (:func:`settled`).
- ``vllm``: the same names under ``vllm:`` (vllm 0.32.0 ``vllm/v1/spec_decode/metrics.py``
  ``SpecDecodingProm``: prometheus_client Counters ``vllm:spec_decode_num_drafts`` etc., exposed
  with ``_total`` and a ``_created`` gauge each; labels ``model_name``, ``engine``).
- ``trtllm``: ``trtllm_spec_decode_num_draft_tokens_total`` and
  ``trtllm_spec_decode_num_accepted_tokens_total`` (counters),
  ``trtllm_spec_decode_acceptance_length`` (gauge, the last iteration's) on ``trtllm-serve``'s
  ``/prometheus/metrics``
  (NVIDIA/TensorRT-LLM ``tensorrt_llm/metrics/collector.py`` ``MetricsCollector``, from PR
  #12545, release 1.3; needs ``enable_iter_perf_stats`` and ``return_perf_metrics``). No count of
  verify steps: tau is the gauge. TensorRT-LLM 1.2.1 exports no speculative series there (the
  stored collector of that line, @89fd9b74, has the five request series only).
- ``sglang``: gauges ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` (the last
  batch's; sgl-project/sglang ``python/sglang/srt/metrics/collector.py`` @93d04878
  ``SchedulerMetricsCollector``) and the counter ``sglang:generation_tokens_total``, which says
  whether the interval saw traffic. No counts: interval figures are the gauges' values.

Series are summed over their other labels (``engine`` under data parallelism, ``model_name``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specserve.client.acceptance import Samples
from specserve.triton import spec_counters

ENGINES = ("specserve", "vllm", "trtllm", "sglang")


@dataclass(frozen=True)
class Schema:
    """Where one engine keeps each figure (``None``: the engine has no such series)."""

    engine: str
    drafts: str | None
    draft_tokens: str | None
    accepted: str | None
    per_pos: str | None
    tokens: str | None = None      # generated tokens: the activity of a gauge-only engine
    gauge_tau: str | None = None
    gauge_rate: str | None = None
    created: str | None = None     # a counter's creation time: a change is a restart
    updates: str | None = None     # seqlock counter, label phase="begun"|"done" (specserve)

    @property
    def marker(self) -> str:
        """The series whose presence says the engine speculates."""
        return self.draft_tokens or self.gauge_tau or ""

    @property
    def counters(self) -> tuple[str, ...]:
        return tuple(n for n in (self.drafts, self.draft_tokens, self.accepted, self.tokens)
                     if n)


def _vllm_like(engine: str, prefix: str, created: str | None) -> Schema:
    return Schema(engine, prefix + "num_drafts_total", prefix + "num_draft_tokens_total",
                  prefix + "num_accepted_tokens_total",
                  prefix + "num_accepted_tokens_per_pos_total", created=created)


SCHEMAS: dict[str, Schema] = {
    "specserve": Schema("specserve", spec_counters.DRAFTS,
                        spec_counters.DRAFT_TOKENS, spec_counters.ACCEPTED,
                        spec_counters.PER_POS, updates=spec_counters.UPDATES),
    "vllm": _vllm_like("vllm", "vllm:spec_decode_", "vllm:spec_decode_num_drafts_created"),
    "trtllm": Schema("trtllm", None, "trtllm_spec_decode_num_draft_tokens_total",
                     "trtllm_spec_decode_num_accepted_tokens_total", None,
                     gauge_tau="trtllm_spec_decode_acceptance_length",
                     created="trtllm_spec_decode_num_draft_tokens_created"),
    "sglang": Schema("sglang", None, None, None, None, tokens="sglang:generation_tokens_total",
                     gauge_tau="sglang:spec_accept_length", gauge_rate="sglang:spec_accept_rate",
                     created="sglang:generation_tokens_created"),
}


@dataclass(frozen=True)
class Totals:
    """One worker's cumulative counters (and current gauges) at one scrape."""

    engine: str
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    per_pos: tuple[float, ...] = ()
    tokens: float | None = None
    gauge_tau: float | None = None
    gauge_rate: float | None = None
    created: float | None = None
    begun: float | None = None  # seqlock: updates begun / done (None: the engine has none)
    done: float | None = None


def settled(before: Totals, after: Totals) -> bool:
    """Whether a read taken between the reads ``before`` and ``after`` holds whole updates:
    every update done by ``before`` and none begun by ``after`` (``before.done ==
    after.begun``; the seqlock of :mod:`specserve.triton.spec_counters`). Always true for an
    engine without the pair (its reads are taken as they come)."""
    if before.done is None or after.begun is None:
        return True
    return before.done == after.begun


def _phase(s: Samples, name: str | None, phase: str) -> float | None:
    vals = [v for (n, labels), v in s.items() if n == name and dict(labels).get("phase") == phase]
    return sum(vals) if vals else None


def _sum(s: Samples, name: str | None) -> float | None:
    if name is None:
        return None
    vals = [v for (n, _), v in s.items() if n == name]
    return sum(vals) if vals else None


def _mean(s: Samples, name: str | None) -> float | None:
    if name is None:
        return None
    vals = [v for (n, _), v in s.items() if n == name]
    return sum(vals) / len(vals) if vals else None


def _min(s: Samples, name: str | None) -> float | None:
    vals = [v for (n, _), v in s.items() if n == name] if name else []
    return min(vals) if vals else None


def _per_pos(s: Samples, name: str | None) -> tuple[float, ...]:
    by_pos: dict[int, float] = {}
    for (n, labels), v in s.items():
        pos = dict(labels).get("position", "")
        if n == name and pos.isdigit():
            by_pos[int(pos)] = by_pos.get(int(pos), 0.0) + v
    return tuple(by_pos.get(k, 0.0) for k in range(max(by_pos) + 1)) if by_pos else ()


def detect(s: Samples) -> list[str]:
    """The engines whose speculative series are in ``s``."""
    names = {n for n, _ in s}
    return [e for e in ENGINES if SCHEMAS[e].marker in names]


def read_totals(s: Samples, engine: str) -> Totals | None:
    """``engine``'s totals in ``s``, or ``None`` when its speculative series are absent."""
    sc = SCHEMAS[engine]
    if _sum(s, sc.marker) is None:
        return None
    return Totals(engine, _sum(s, sc.drafts), _sum(s, sc.draft_tokens), _sum(s, sc.accepted),
                  _per_pos(s, sc.per_pos), _sum(s, sc.tokens), _mean(s, sc.gauge_tau),
                  _mean(s, sc.gauge_rate), _min(s, sc.created), _phase(s, sc.updates, "begun"),
                  _phase(s, sc.updates, "done"))


def searched() -> str:
    """The marker series of every engine, for the message when none is found."""
    return ", ".join(f"{e}: {SCHEMAS[e].marker}" for e in ENGINES)


def counters_of(t: Totals) -> Mapping[str, float | None]:
    return {"drafts": t.drafts, "draft_tokens": t.draft_tokens, "accepted": t.accepted,
            "tokens": t.tokens}
