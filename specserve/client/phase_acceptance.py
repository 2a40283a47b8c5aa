"""The engine's own acceptance over a benchmark's measured phase, from its servers' metrics.

Every variant's servers (each replica of a pool, or the ``--metrics-url`` workers named for it)
are scraped before the phase and after (:mod:`specserve.client.scrape`: Prometheus counters,
``trtllm-serve``'s ``/perf_metrics``); per server the counter deltas
(:func:`specserve.client.acceptance.counter_acceptance`), else its perf entries, give the
phase's acceptance, and over replicas their sum (none unless every replica reports). A variant
that shares a server with the other is not scraped: that server's counters mix both. Only
OpenAI-protocol runs are scraped, and only with ``BenchmarkConfig.scrape_metrics`` on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.client.acceptance import (
    EngineAcceptance,
    Samples,
    counter_acceptance,
    from_perf_metrics,
    pool,
)
from specserve.client.balance import PooledTransport
from specserve.client.config import BenchmarkConfig
from specserve.client.scrape import MetricsEndpoint, TextGetter, perf_entries, scrape_settled
from specserve.client.transport import Transport
from specserve.errors import SpecserveError


@dataclass(frozen=True)
class ServerScrape:
    """What one server's metrics said at one moment."""

    samples: Samples | None
    perf: list[Any] | None     # trtllm-serve /perf_metrics entries


def _servers(tr: Transport) -> list[Transport]:
    """The servers a variant's transport sends to: every replica of a pool, else its one."""
    return list(tr.transports) if isinstance(tr, PooledTransport) else [tr]


async def scrape_variants(cfg: BenchmarkConfig,
                          transports: dict[str, Transport]) -> dict[str, list[ServerScrape]]:
    """Variant -> what each of its servers' metrics say now (one entry per replica); only for
    a variant whose servers are its own (a shared server's counters mix both variants)."""
    if cfg.protocol != "openai" or not cfg.scrape_metrics:
        return {}
    servers = {v: _servers(tr) for v, tr in transports.items()}
    out: dict[str, list[ServerScrape]] = {}
    named = {"spec": cfg.metrics_urls, "baseline": cfg.baseline_metrics_urls}
    for variant, mine in servers.items():
        if named.get(variant):  # the variant's workers: their counters are its alone
            out[variant] = [await _scrape_one(MetricsEndpoint(u)) for u in named[variant]]
            continue
        others = {s.url for v, theirs in servers.items() if v != variant for s in theirs}
        if not any(s.url in others for s in mine):
            out[variant] = [await _scrape_one(s) for s in mine]
    return out


async def _scrape_one(server: Transport | TextGetter) -> ServerScrape:
    if not isinstance(server, TextGetter):
        raise SpecserveError(f"{server.url}: this transport cannot read the server's metrics")
    return ServerScrape(await scrape_settled(server), await perf_entries(server))


def phase_acceptance(before: dict[str, list[ServerScrape]],
                     after: dict[str, list[ServerScrape]]) -> dict[str, EngineAcceptance]:
    """Variant -> acceptance over the phase: per server, counter deltas, else its /perf_metrics
    entries; over replicas, their sum (none unless every replica reports)."""
    out: dict[str, EngineAcceptance] = {}
    for variant, ends in after.items():
        starts: list[ServerScrape | None] = [*before.get(variant, [None] * len(ends))]
        accs = [_phase(b, a) for b, a in zip(starts, ends, strict=True)]
        found = [a for a in accs if a is not None]
        total = found[0] if len(found) == 1 else pool(found)
        if total is not None and len(found) == len(accs):
            out[variant] = total
    return out


def _phase(b: ServerScrape | None, a: ServerScrape) -> EngineAcceptance | None:
    acc = counter_acceptance(b.samples or {} if b else {}, a.samples) if a.samples else None
    return acc or (from_perf_metrics(a.perf) if a.perf else None)
