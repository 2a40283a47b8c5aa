"""Run summaries: latency distributions, throughput, goodput, acceptance and speedup (pure).

- Goodput as in DistServe (Zhong et al., OSDI'24) and vLLM ``bench serve --goodput``: completed
  requests per second whose TTFT/TPOT/E2E all meet the service-level objectives.
- Acceptance as TensorRT-LLM reports it: ``acceptance_rate = accepted draft tokens / draft
  tokens``; tau = mean tokens per verify step (Leviathan et al., 2023, "expected tokens per
  step"), measured here as the mean streamed chunk size, and from the server's per-request
  ``spec_stats_json`` (``emitted_tokens / steps``) when the reference backend sends it.
- Speedup vs the no-speculation baseline: ratio of means, with a seeded percentile-bootstrap
  95% confidence interval (Efron & Tibshirani, 1993), requests resampled with replacement.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specserve.client.acceptance import EngineAcceptance, acceptance_flags
from specserve.client.metrics import Distribution, RequestRecord
from specserve.errors import SpecserveError
from specserve.spec.stats import AcceptanceStats


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in milliseconds (``None`` = not constrained)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if r.status != "completed":
            return False
        checks = (("ttft", self.ttft_ms, r.ttft_s), ("tpot", self.tpot_ms, r.tpot_s),
                  ("e2e", self.e2e_ms, r.e2e_s))
        for name, limit, value in checks:
            if limit is None:
                continue
            if value is None:
                if name == "tpot":  # no TPOT for a one-token answer: nothing to violate
                    continue
                return False
            if value * 1000.0 > limit:
                return False
        return True


def parse_slo(text: str) -> Slo:
    """Parse ``ttft=200,tpot=50[,e2e=2000]`` (milliseconds; an ``ms`` suffix is allowed)."""
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot", "e2e"):
            raise SpecserveError(f"--slo: '{part}' is not ttft=MS, tpot=MS or e2e=MS")
        raw = raw.strip().removesuffix("ms")
        try:
            v = float(raw)
        except ValueError as e:
            raise SpecserveError(f"--slo: '{part}' has no number of milliseconds") from e
        if not math.isfinite(v) or v <= 0:
            raise SpecserveError(f"--slo: '{part}' must be a positive number of milliseconds")
        values[f"{key}_ms"] = v
    if not values:
        raise SpecserveError("--slo: empty; give e.g. ttft=200,tpot=50")
    return Slo(**values)


@dataclass(frozen=True)
class Acceptance:
    """Speculation figures of one variant (``None`` where the server gave nothing)."""

    draft_tokens: int
    accepted_draft_tokens: int
    steps: int                             # verify steps (spec_stats_json), for tune-tree
    emitted_tokens: int                    # tokens emitted over those steps
    acceptance_rate: float | None          # accepted / drafted, pooled over requests
    mean_request_acceptance_rate: float | None   # mean of the server's per-request value
    tau_stream: float | None               # mean tokens per streamed chunk
    tau_server: float | None               # emitted / steps from spec_stats_json
    per_position_acceptance: tuple[float, ...]   # P(position k accepted), over all steps
    per_position_acceptance_given_drafted: tuple[float, ...]  # P(accepted | drafted) at k
    tokens_per_step_histogram: dict[int, int]
    accepted_nodes: dict[str, int]         # Medusa "head,rank" -> count, for tune-tree
    sources: tuple[str, ...] = ()          # the server fields the per-request figures came from


def acceptance_of(records: Sequence[RequestRecord]) -> Acceptance:
    """Pool acceptance figures over completed requests."""
    done = [r for r in records if r.status == "completed"]
    drafted = sum(int(r.server.get("total_draft_tokens", 0)) for r in done)
    accepted = sum(int(r.server.get("total_accepted_draft_tokens", 0)) for r in done)
    rates = [float(r.server["acceptance_rate"]) for r in done
             if "acceptance_rate" in r.server and r.server.get("total_draft_tokens", 0) > 0]
    sizes = [k for r in done if r.streaming for k in r.tokens_per_step]
    merged = AcceptanceStats()
    for r in done:
        if r.spec_stats:
            merged = merged.merge(AcceptanceStats.from_dict(r.spec_stats))
    steps, emitted = merged.steps, merged.emitted_tokens
    pos_d, pos_a = merged.per_position_drafted, merged.per_position_accepted
    nodes = dict(sorted(merged.accepted_nodes.items()))
    per_pos = tuple(a / steps for a in pos_a) if steps else ()
    given = tuple(a / d for a, d in zip(pos_a, pos_d, strict=False) if d > 0)
    return Acceptance(
        draft_tokens=drafted,
        accepted_draft_tokens=accepted,
        steps=steps,
        emitted_tokens=emitted,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_request_acceptance_rate=sum(rates) / len(rates) if rates else None,
        tau_stream=sum(sizes) / len(sizes) if sizes else None,
        tau_server=emitted / steps if steps else None,
        per_position_acceptance=per_pos,
        per_position_acceptance_given_drafted=given,
        tokens_per_step_histogram=dict(sorted(Counter(sizes).items())),
        accepted_nodes=nodes,
        sources=tuple(sorted({r.acceptance_source for r in done if r.acceptance_source})),
    )


@dataclass(frozen=True)
class VariantSummary:
    """Everything reported for one variant (spec or baseline) of a run."""

    variant: str
    model: str
    requests: int
    completed: int
    errors: int
    cancelled: int
    duration_s: float
    request_throughput_rps: float | None       # None in an interleaved run (see summarize)
    output_token_throughput_tok_s: float | None
    output_tokens: int
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution            # per token (chunk gap divided over its tokens)
    itl_chunk_ms: Distribution      # per chunk (what naive clients call ITL)
    e2e_ms: Distribution
    per_user_tok_s: Distribution    # output tokens / E2E of each request
    goodput_rps: float | None
    goodput_fraction: float | None
    acceptance: Acceptance
    engine_counters: dict[str, Any] | None = None   # Prometheus delta over the run (openai)
    flags: tuple[str, ...] = ()                     # e.g. "every draft rejected"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["acceptance"]["tokens_per_step_histogram"] = {
            str(k): v for k, v in self.acceptance.tokens_per_step_histogram.items()}
        d["acceptance"]["sources"] = list(self.acceptance.sources)
        d["flags"] = list(self.flags)  # as summary.json reads back
        return d


def summarize(records: Sequence[RequestRecord], variant: str, duration_s: float,
              slo: Slo | None = None,
              counters: EngineAcceptance | None = None,
              interleaved: bool = False) -> VariantSummary:
    """Summarize the measured (non-warmup) records of ``variant`` over a run of ``duration_s``;
    ``counters``: the acceptance its server's Prometheus counters gave over the run.
    ``interleaved``: the run mixed two variants on the same cores, so no per-variant throughput
    (request/s, tok/s, goodput/s) is given: either variant's share of a mixed run is not what it
    would serve alone (``bench --sweep`` runs each in its own phase)."""
    rs = [r for r in records if r.variant == variant and r.phase == "measure"]
    done = [r for r in rs if r.status == "completed"]
    tokens = sum(r.output_tokens for r in done)
    dur = max(duration_s, 1e-9)
    good = [r for r in done if slo.met_by(r)] if slo else []
    return VariantSummary(
        variant=variant,
        model=rs[0].model if rs else "",
        requests=len(rs),
        completed=len(done),
        errors=sum(r.status == "error" for r in rs),
        cancelled=sum(r.status == "cancelled" for r in rs),
        duration_s=duration_s,
        request_throughput_rps=None if interleaved else len(done) / dur,
        output_token_throughput_tok_s=None if interleaved else tokens / dur,
        output_tokens=tokens,
        ttft_ms=Distribution.of([r.ttft_s for r in done if r.ttft_s is not None]).scaled(1e3),
        tpot_ms=Distribution.of([r.tpot_s for r in done if r.tpot_s is not None]).scaled(1e3),
        itl_ms=Distribution.of([x for r in done for x in r.itl_token_s]).scaled(1e3),
        itl_chunk_ms=Distribution.of([x for r in done for x in r.itl_chunk_s]).scaled(1e3),
        e2e_ms=Distribution.of([r.e2e_s for r in done if r.e2e_s is not None]).scaled(1e3),
        per_user_tok_s=Distribution.of(per_request_values(done, "per_user_tok_s")),
        goodput_rps=len(good) / dur if slo and not interleaved else None,
        goodput_fraction=(len(good) / len(rs) if rs else None) if slo else None,
        acceptance=(acc := acceptance_of(done)),
        engine_counters=counters.to_dict() if counters else None,
        flags=tuple(acceptance_flags(counters or _as_engine(acc), variant)),
    )


def _as_engine(acc: Acceptance) -> EngineAcceptance | None:
    """The per-request figures pooled, for :func:`acceptance_flags` (``None``: none sent)."""
    if not acc.sources:
        return None
    return EngineAcceptance(" + ".join(acc.sources), acc.steps or None, acc.draft_tokens,
                            acc.accepted_draft_tokens)


# metric -> True when higher is better
SPEEDUP_METRICS: dict[str, bool] = {
    "ttft_s": False, "tpot_s": False, "itl_s": False, "e2e_s": False, "per_user_tok_s": True,
}


def per_request_values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    """One value of ``metric`` per completed request (requests without one are skipped)."""
    out: list[float] = []
    for r in records:
        if r.status != "completed":
            continue
        v: float | None
        if metric == "itl_s":
            v = sum(r.itl_token_s) / len(r.itl_token_s) if r.itl_token_s else None
        elif metric == "per_user_tok_s":
            v = r.output_tokens / r.e2e_s if r.e2e_s and r.output_tokens else None
        else:
            v = getattr(r, metric)
        if v is not None and math.isfinite(v):
            out.append(float(v))
    return out


@dataclass(frozen=True)
class Speedup:
    """Spec-vs-baseline ratio of means (>1 means speculation is better) with a 95% CI."""

    metric: str
    spec_mean: float
    baseline_mean: float
    speedup: float
    ci_low: float
    ci_high: float
    n_spec: int
    n_baseline: int


def bootstrap_speedup(spec: Sequence[float], base: Sequence[float], higher_is_better: bool,
                      metric: str = "", n_boot: int = 2000, seed: int = 0,
                      level: float = 0.95) -> Speedup | None:
    """Ratio of means with a percentile-bootstrap CI; ``None`` if either side is empty."""
    a, b = np.asarray(spec, dtype=float), np.asarray(base, dtype=float)
    if a.size == 0 or b.size == 0 or a.mean() <= 0 or b.mean() <= 0:
        return None
    rng = np.random.default_rng(seed)
    ma = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)  # [n_boot]
    mb = b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(axis=1)  # [n_boot]
    with np.errstate(divide="ignore"):  # a resample of zero TPOTs (a request whose tokens all
        ratios = ma / mb if higher_is_better else mb / ma  # came in one chunk) gives inf
    point = a.mean() / b.mean() if higher_is_better else b.mean() / a.mean()
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha], method="inverted_cdf")  # no inf - inf
    return Speedup(metric, float(a.mean()), float(b.mean()), float(point), float(lo), float(hi),
                   int(a.size), int(b.size))


def speedups(records: Sequence[RequestRecord], seed: int = 0,
             n_boot: int = 2000) -> dict[str, Speedup]:
    """Speedup of every metric in :data:`SPEEDUP_METRICS` over the measured records."""
    meas = [r for r in records if r.phase == "measure"]
    spec = [r for r in meas if r.variant == "spec"]
    base = [r for r in meas if r.variant == "baseline"]
    out: dict[str, Speedup] = {}
    for i, (metric, higher) in enumerate(SPEEDUP_METRICS.items()):
        s = bootstrap_speedup(per_request_values(spec, metric), per_request_values(base, metric),
                              higher, metric, n_boot=n_boot, seed=seed + i)
        if s is not None:
            out[metric] = s
    return out


# per-category figures (SPEED-Bench's qualitative split: acceptance differs by category)
CATEGORY_SPEEDUPS = ("per_user_tok_s", "tpot_s", "ttft_s", "e2e_s")


def category_figures(records: Sequence[RequestRecord], variant: str) -> dict[str, Any]:
    """tau, acceptance and latency of ``variant`` over ``records`` (one category's measured
    requests; no throughput: categories share the run's time)."""
    vs = summarize(records, variant, 0.0, interleaved=True)
    acc = vs.acceptance
    return {"requests": vs.requests, "completed": vs.completed,
            "tau": acc.tau_server or acc.tau_stream, "tau_server": acc.tau_server,
            "tau_stream": acc.tau_stream, "acceptance_rate": acc.acceptance_rate,
            "ttft_ms_p50": vs.ttft_ms.p50, "tpot_ms_p50": vs.tpot_ms.p50,
            "tpot_ms_mean": vs.tpot_ms.mean, "e2e_ms_p50": vs.e2e_ms.p50,
            "per_user_tok_s_mean": vs.per_user_tok_s.mean}


def by_category(records: Sequence[RequestRecord], seed: int = 0,
                n_boot: int = 2000) -> dict[str, Any]:
    """Category -> each variant's :func:`category_figures` and, with a baseline, the speedups
    of :data:`CATEGORY_SPEEDUPS` over that category's requests (bootstrap CIs as
    :func:`speedups`). Categories sorted by name."""
    meas = [r for r in records if r.phase == "measure"]
    out: dict[str, Any] = {}
    for cat in sorted({r.category for r in meas}):
        rs = [r for r in meas if r.category == cat]
        names = sorted({r.variant for r in rs}, key=lambda v: v != "spec")
        sp = speedups(rs, seed=seed, n_boot=n_boot) if "baseline" in names else {}
        out[cat] = {"variants": {v: category_figures(rs, v) for v in names},
                    "speedup": {m: asdict(sp[m]) for m in CATEGORY_SPEEDUPS if m in sp}}
    return out
