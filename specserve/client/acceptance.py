"""Acceptance figures as engines report them, read into one shape (pure; no I/O).

Sources, named in the report by the strings in :data:`SOURCES`:

- vLLM, per request: the root ``metrics.speculative_decoding`` object of the last (usage) chunk
  or the non-streamed body, sent with ``--per-request-spec-decode-metrics`` (vllm PR #48915):
  ``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``num_spec_tokens``
  and ``acceptance_histogram[j]`` = verify steps that accepted exactly ``j`` drafts.
- SGLang, per request: ``meta_info.spec_verify_ct``, ``spec_accept_length``,
  ``spec_accept_rate`` (sglang PR #11144), with ``completion_tokens``.
- TensorRT-LLM, per request: ``choices[].avg_decoded_tokens_per_iter`` of ``trtllm-serve``'s
  completion response (``tensorrt_llm/serve/openai_protocol.py`` ``CompletionResponseChoice``;
  decoded tokens per decoding iteration, the one per-request signal on 1.2.1's PyTorch path):
  steps = round(completion tokens / it), accepted = tokens - steps;
- TensorRT-LLM, per finished request: ``GET /perf_metrics`` entries'
  ``perf_metrics.speculative_decoding`` {``acceptance_rate``, ``total_accepted_draft_tokens``,
  ``total_draft_tokens``} (``trtllm-serve`` with ``return_perf_metrics``).
- Prometheus counters, their delta over the measured phase: vLLM
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position}``;
  TensorRT-LLM ``trtllm_spec_decode_num_draft_tokens_total`` / ``..._num_accepted_tokens_total``;
  SGLang's gauges ``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` (not counters:
  their last value, which the report says).

tau = 1 + accepted / verify steps (every step emits its accepted drafts plus one token), the
"acceptance length" of vLLM and AIPerf.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SOURCES = {
    "vllm_request": "vllm: response metrics.speculative_decoding",
    "sglang_request": "sglang: response meta_info.spec_*",
    "trtllm_perf": "trtllm: /perf_metrics speculative_decoding",
    "trtllm_request": "trtllm: response choices[].avg_decoded_tokens_per_iter",
    "vllm_counters": "vllm: Prometheus vllm:spec_decode_* delta",
    "trtllm_counters": "trtllm: Prometheus trtllm_spec_decode_* delta",
    "sglang_gauges": "sglang: Prometheus sglang:spec_accept_* gauges (last value)",
}

# tau below this while drafts were proposed: every draft rejected (vllm PR #52816's trap)
NO_ACCEPTANCE_TAU = 1.05


@dataclass(frozen=True)
class EngineAcceptance:
    """Acceptance of one request or one run as an engine reports it.

    ``steps`` are verify steps (``None`` where the source does not give them);
    ``per_position_accepted[k]`` counts steps whose draft position ``k`` was accepted, and
    ``per_position_drafted[k]`` steps that drafted position ``k``. ``reported_tau`` and
    ``reported_rate`` carry a source's own figure where it gives no counts (gauges)."""

    source: str
    steps: int | None
    draft_tokens: int | None
    accepted_draft_tokens: int | None
    per_position_accepted: tuple[int, ...] = ()
    per_position_drafted: tuple[int, ...] = ()
    reported_tau: float | None = None
    reported_rate: float | None = None

    @property
    def tau(self) -> float | None:
        if self.steps and self.accepted_draft_tokens is not None:
            return 1.0 + self.accepted_draft_tokens / self.steps
        return self.reported_tau

    @property
    def acceptance_rate(self) -> float | None:
        if self.draft_tokens and self.accepted_draft_tokens is not None:
            return self.accepted_draft_tokens / self.draft_tokens
        return self.reported_rate

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "steps": self.steps, "draft_tokens": self.draft_tokens,
                "accepted_draft_tokens": self.accepted_draft_tokens, "tau": self.tau,
                "acceptance_rate": self.acceptance_rate,
                "per_position_acceptance": [a / self.steps for a in self.per_position_accepted]
                if self.steps else [],
                "per_position_accepted": list(self.per_position_accepted),
                "per_position_drafted": list(self.per_position_drafted)}

    def server_fields(self) -> dict[str, float | int]:
        """The per-request totals under the names of TensorRT-LLM's perf outputs."""
        out: dict[str, float | int] = {}
        if self.draft_tokens is not None:
            out["total_draft_tokens"] = self.draft_tokens
        if self.accepted_draft_tokens is not None:
            out["total_accepted_draft_tokens"] = self.accepted_draft_tokens
        if self.acceptance_rate is not None:
            out["acceptance_rate"] = self.acceptance_rate
        return out

    def spec_stats(self) -> dict[str, Any] | None:
        """The per-request step counts in the reference backend's ``spec_stats_json`` shape."""
        if not self.steps or self.accepted_draft_tokens is None:
            return None
        return {"steps": self.steps, "emitted_tokens": self.steps + self.accepted_draft_tokens,
                "per_position_accepted": list(self.per_position_accepted),
                "per_position_drafted": list(self.per_position_drafted)}


def _int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _float(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def from_vllm(payload: Mapping[str, Any]) -> EngineAcceptance | None:
    """vLLM's per-request ``speculative_decoding`` object, or ``None`` if it has no steps."""
    steps = _int(payload, "num_spec_steps")
    if steps is None:
        return None
    hist = [int(x) for x in payload.get("acceptance_histogram") or []]  # [K + 1]
    k = _int(payload, "num_spec_tokens") or max(len(hist) - 1, 0)
    accepted = _int(payload, "num_accepted_draft_tokens")
    drafted = _int(payload, "num_draft_tokens")
    per_acc = tuple(sum(hist[j + 1:]) for j in range(len(hist) - 1))
    per_draft = (steps,) * k if drafted == steps * k else ()
    return EngineAcceptance(SOURCES["vllm_request"], steps, drafted, accepted, per_acc, per_draft,
                            reported_rate=_float(payload, "draft_acceptance_rate"))


def from_sglang(meta: Mapping[str, Any]) -> EngineAcceptance | None:
    """SGLang's per-request ``meta_info`` (``spec_verify_ct`` and the completion tokens)."""
    steps = _int(meta, "spec_verify_ct")
    tokens = _int(meta, "completion_tokens")
    if not steps or tokens is None:
        return None
    accepted = max(tokens - steps, 0)
    drafted = _int(meta, "spec_draft_token_num")
    return EngineAcceptance(SOURCES["sglang_request"], steps, drafted, accepted,
                            reported_tau=_float(meta, "spec_accept_length"),
                            reported_rate=_float(meta, "spec_accept_rate"))


def from_response(body: Mapping[str, Any]) -> EngineAcceptance | None:
    """Per-request acceptance in an OpenAI-protocol body or chunk, from whichever engine."""
    metrics = body.get("metrics")
    if isinstance(metrics, Mapping) and isinstance(metrics.get("speculative_decoding"), Mapping):
        return from_vllm(metrics["speculative_decoding"])
    choices = [c for c in body.get("choices") or [] if isinstance(c, Mapping)]
    for holder in (body, *choices):
        meta = holder.get("meta_info")
        if isinstance(meta, Mapping) and "spec_verify_ct" in meta:
            return from_sglang(meta)
    usage = body.get("usage")
    for c in choices:
        if "avg_decoded_tokens_per_iter" in c and isinstance(usage, Mapping):
            return from_trtllm_choice(c, usage)
    return None


def from_trtllm_choice(choice: Mapping[str, Any], usage: Mapping[str, Any]
                       ) -> EngineAcceptance | None:
    """TensorRT-LLM's per-request ``avg_decoded_tokens_per_iter`` with the completion tokens."""
    avg, tokens = _float(choice, "avg_decoded_tokens_per_iter"), _int(usage, "completion_tokens")
    if avg is None or avg < 1.0 or not tokens:
        return None
    steps = max(1, round(tokens / avg))
    return EngineAcceptance(SOURCES["trtllm_request"], steps, None, max(tokens - steps, 0),
                            reported_tau=avg)


def from_perf_metrics(entries: Sequence[Any]) -> EngineAcceptance | None:
    """TensorRT-LLM ``/perf_metrics`` entries pooled (no step counts: rate only)."""
    drafted = accepted = 0
    seen = False
    for e in entries:
        pm = e.get("perf_metrics") if isinstance(e, Mapping) else None
        sd = pm.get("speculative_decoding") if isinstance(pm, Mapping) else None
        if not isinstance(sd, Mapping):
            continue
        seen = True
        drafted += _int(sd, "total_draft_tokens") or 0
        accepted += _int(sd, "total_accepted_draft_tokens") or 0
    if not seen:
        return None
    return EngineAcceptance(SOURCES["trtllm_perf"], None, drafted, accepted)


def pool(items: Sequence[EngineAcceptance]) -> EngineAcceptance | None:
    """Per-request acceptances summed into one (counts add; per-position lists add)."""
    if not items:
        return None

    def add(vals: Sequence[int | None]) -> int | None:
        return None if any(v is None for v in vals) else sum(v or 0 for v in vals)

    def add_lists(lists: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
        out = [0] * max((len(x) for x in lists), default=0)
        for x in lists:
            for i, v in enumerate(x):
                out[i] += v
        return tuple(out)

    return EngineAcceptance(
        " + ".join(sorted({i.source for i in items})), add([i.steps for i in items]),
        add([i.draft_tokens for i in items]), add([i.accepted_draft_tokens for i in items]),
        add_lists([i.per_position_accepted for i in items]),
        add_lists([i.per_position_drafted for i in items]))


# Prometheus text exposition format: name{label="v",...} value [timestamp]
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_prometheus(text: str) -> Samples:
    """(name, sorted labels) -> value for every sample line (comments and junk skipped)."""
    out: Samples = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = value
    return out


def _total(s: Samples, name: str) -> float | None:
    vals = [v for (n, _), v in s.items() if n == name]
    return sum(vals) if vals else None


def _per_position(s: Samples, name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (n, labels), v in s.items():
        pos = dict(labels).get("position")
        if n == name and pos is not None and pos.isdigit():
            out[int(pos)] = out.get(int(pos), 0.0) + v
    return out


def _delta(before: Samples, after: Samples, name: str) -> int | None:
    a = _total(after, name)
    return None if a is None else round(a - (_total(before, name) or 0.0))


def counter_acceptance(before: Samples, after: Samples) -> EngineAcceptance | None:
    """Acceptance over a run from two scrapes of one server (``None``: no speculative series)."""
    v = "vllm:spec_decode_"
    if _total(after, v + "num_drafts_total") is not None:
        pa, pb = _per_position(after, v + "num_accepted_tokens_per_pos_total"), \
            _per_position(before, v + "num_accepted_tokens_per_pos_total")
        steps = _delta(before, after, v + "num_drafts_total")
        per_acc = tuple(round(pa[k] - pb.get(k, 0.0)) for k in sorted(pa))
        drafted = _delta(before, after, v + "num_draft_tokens_total")
        per_draft = (steps or 0,) * len(per_acc) if drafted == (steps or 0) * len(per_acc) else ()
        return EngineAcceptance(SOURCES["vllm_counters"], steps, drafted,
                                _delta(before, after, v + "num_accepted_tokens_total"),
                                per_acc, per_draft)
    t = "trtllm_spec_decode_"
    if _total(after, t + "num_draft_tokens_total") is not None:
        return EngineAcceptance(SOURCES["trtllm_counters"], None,
                                _delta(before, after, t + "num_draft_tokens_total"),
                                _delta(before, after, t + "num_accepted_tokens_total"),
                                reported_tau=_total(after, t + "acceptance_length"))
    if _total(after, "sglang:spec_accept_length") is not None:
        return EngineAcceptance(SOURCES["sglang_gauges"], None, None, None,
                                reported_tau=_total(after, "sglang:spec_accept_length"),
                                reported_rate=_total(after, "sglang:spec_accept_rate"))
    return None


def acceptance_flags(acc: EngineAcceptance | None, variant: str) -> list[str]:
    """Warnings for a variant's engine-reported acceptance (empty when nothing is wrong)."""
    if acc is None:
        return []
    tau = acc.tau
    if acc.draft_tokens == 0 and variant == "spec":
        return [f"{variant}: the server reports no drafted tokens ({acc.source}): speculation "
                "is not running on it"]
    drafted = acc.draft_tokens if acc.draft_tokens is not None else acc.steps
    if tau is not None and tau < NO_ACCEPTANCE_TAU and drafted:  # 0 drafts: no speculation
        return [f"{variant}: tau {tau:.3f} with drafts proposed ({acc.source}): the server "
                "rejects (nearly) every draft; check the draft model, its vocabulary and the "
                "speculative config"]
    return []
