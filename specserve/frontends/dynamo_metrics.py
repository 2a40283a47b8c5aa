"""The Dynamo worker's Prometheus metrics, under vLLM's names so that tools reading a vLLM
worker read ours (``vllm:spec_decode_*``, ``vllm:request_success``), plus the prefix cache's
lookups and the KV events sent to Dynamo's router. Served on 127.0.0.1 at the worker's
``--metrics-port``; ``prometheus_client`` is imported here only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specserve.frontends.dynamo_kv_events import KvEventRelay
from specserve.runtime.kv_pool import PoolStats


class SpecCounters:
    """vLLM's speculative-decoding counters (prometheus_client, imported here)."""

    def __init__(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, start_http_server

        reg = CollectorRegistry()
        v = "vllm:spec_decode_"
        self.drafts = Counter(v + "num_drafts", "verify steps", registry=reg)
        self.draft_tokens = Counter(v + "num_draft_tokens", "drafted tokens", registry=reg)
        self.accepted = Counter(v + "num_accepted_tokens", "accepted drafts", registry=reg)
        self.per_pos = Counter(v + "num_accepted_tokens_per_pos", "accepted drafts per position",
                               ["position"], registry=reg)
        # Predicted Outputs: Dynamo's frontend builds the response's usage itself and has no
        # field for OpenAI's accepted / rejected prediction tokens, so they are counted here
        pred = "specserve:prediction_tokens"
        self.prediction = Counter(pred, "prediction tokens drafted, by outcome (accepted: "
                                  "kept in the output; rejected: drafted and not kept)",
                                  ["outcome"], registry=reg)
        self.finished = Counter("vllm:request_success", "finished requests by reason (abort: "
                                "the client went away, its slot freed)", ["finished_reason"],
                                registry=reg)
        self.registry = reg
        start_http_server(port, addr="127.0.0.1", registry=reg)

    def prefix_cache(self, stats: Callable[[], PoolStats], events: KvEventRelay) -> None:
        """The prefix cache's block lookups and hits so far, and the KV events sent to
        Dynamo's router (gauges read at each scrape)."""
        from prometheus_client import Gauge

        p, reg = "specserve:prefix_cache_", self.registry
        Gauge(p + "queried_blocks", "full prompt blocks looked up in the prefix cache",
              registry=reg).set_function(lambda: stats().queried)
        Gauge(p + "hit_blocks", "full prompt blocks found in the prefix cache (reused)",
              registry=reg).set_function(lambda: stats().hit)
        Gauge("specserve:kv_events_published", "prefix-cache block events sent to Dynamo",
              registry=reg).set_function(lambda: events.sent)
        Gauge("specserve:kv_events_failed", "prefix-cache block events Dynamo did not take",
              registry=reg).set_function(lambda: events.failed)

    def add(self, stats: dict[str, Any]) -> None:
        self.drafts.inc(int(stats.get("steps") or 0))
        self.draft_tokens.inc(int(stats.get("draft_tokens") or 0))
        self.accepted.inc(int(stats.get("accepted_tokens") or 0))
        for pos, n in enumerate(stats.get("per_position_accepted") or ()):
            self.per_pos.labels(position=str(pos)).inc(int(n))

    def add_prediction(self, accepted: int, rejected: int) -> None:
        """One request's accepted and rejected prediction tokens."""
        self.prediction.labels(outcome="accepted").inc(accepted)
        self.prediction.labels(outcome="rejected").inc(rejected)
