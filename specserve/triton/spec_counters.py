"""Cumulative Prometheus counters of the reference ``tensorrt_llm`` model's speculation (pure).

The reference model (``triton/models/llm.py``) exports them through the Python backend's custom
metrics API (``pb_utils.MetricFamily`` COUNTER, python_backend README "Custom Metrics"; served on
tritonserver's ``/metrics`` port beside its own ``nv_*`` series). The names follow vLLM 0.32's
``SpecDecodingProm`` (``vllm/v1/spec_decode/metrics.py``: ``vllm:spec_decode_num_drafts``,
``_num_draft_tokens``, ``_num_accepted_tokens``, ``_num_accepted_tokens_per_pos{position}``,
exposed with ``_total``) under the ``specserve:`` prefix, so one PromQL form reads either engine:

- ``specserve:spec_decode_num_drafts_total``: verify steps (every step of a speculating
  sequence; vLLM counts a "draft" per sequence per step the same way);
- ``specserve:spec_decode_num_draft_tokens_total``: draft tokens verified;
- ``specserve:spec_decode_num_accepted_tokens_total``: draft tokens accepted;
- ``specserve:spec_decode_num_accepted_tokens_per_pos_total{position="k"}``: steps whose draft
  position ``k`` was accepted;
- ``specserve:spec_decode_stats_updates_total{phase="begun"|"done"}``: a seqlock around each
  request's update (Lamport 1977, "Concurrent reading and writing"; the Linux kernel's
  ``seqlock_t``): ``begun`` grows before the other series, ``done`` after them.

Labels ``model`` and ``version`` (the Triton model). They grow when a request ends (its
:class:`~specserve.spec.stats.AcceptanceStats`), so an interval sees whole requests; a model
reload starts them at 0 again (a counter reset, which ``rate()`` and ``specserve watch`` handle).
The reference model updates them through :class:`DeferredCounters`: requests' increments are
summed as they end and written by the model's sender thread after the response, one seqlocked
update for all the requests that ended since the last one. Every increment is a round trip to
tritonserver; made by the serving loop itself they held its thread ~0.4 ms for each request
(timestamps around the writes; py-spy, which slows them, put them at a quarter of the loop's
busy time in the BLS loop's verify calls).

Prometheus reads each series on its own: no scrape sees several series change together. A
request's update is several increments (each one a message from the Python backend's stub to
the server), so a scrape that lands between them reads its draft tokens without its accepted
ones (seen: 1 scrape in 1,875 at 5 ms under load read 11,448 drafted against 11,430 accepted
with the draft equal to the target; the next read was equal again). The seqlock makes such a
read detectable: a read taken after one that showed ``done = d`` and before one that shows
``begun = d`` holds exactly ``d`` whole updates (:func:`specserve.watch.series.settled`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

PREFIX = "specserve:spec_decode_"
DRAFTS = PREFIX + "num_drafts_total"
DRAFT_TOKENS = PREFIX + "num_draft_tokens_total"
ACCEPTED = PREFIX + "num_accepted_tokens_total"
PER_POS = PREFIX + "num_accepted_tokens_per_pos_total"
UPDATES = PREFIX + "stats_updates_total"
BEGUN, DONE = (("phase", "begun"),), (("phase", "done"),)

HELP = {
    DRAFTS: "Number of speculative verify steps (vLLM's spec decoding drafts).",
    DRAFT_TOKENS: "Number of draft tokens verified.",
    ACCEPTED: "Number of draft tokens accepted.",
    PER_POS: "Accepted tokens per draft position.",
    UPDATES: "Request updates of these counters begun / done (a seqlock: equal = settled).",
}


@dataclass(frozen=True)
class Increment:
    """Add ``value`` to the series ``name`` with the extra ``labels``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: int


def increments(stats: Mapping[str, Any]) -> list[Increment]:
    """What one finished request adds (``AcceptanceStats.to_dict()``); nothing for a request
    that ran no verify step or drafted nothing (speculation off)."""
    steps, drafted = int(stats.get("steps", 0)), int(stats.get("draft_tokens", 0))
    if steps <= 0 or drafted <= 0:
        return []
    out = [Increment(DRAFTS, (), steps), Increment(DRAFT_TOKENS, (), drafted),
           Increment(ACCEPTED, (), int(stats.get("accepted_tokens", 0)))]
    for k, n in enumerate(stats.get("per_position_accepted") or []):
        out.append(Increment(PER_POS, (("position", str(k)),), int(n)))
    return out


class CounterFactory(Protocol):
    """Makes one counter series (Triton: ``MetricFamily(...).Metric(labels=...)``)."""

    def __call__(self, name: str, labels: dict[str, str]) -> Any: ...


class SpecCounters:
    """The model's counters: series made on first use, then ``increment``-ed."""

    def __init__(self, factory: CounterFactory, labels: Mapping[str, str]) -> None:
        self.factory, self.labels = factory, dict(labels)
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        for name, extra in ((UPDATES, BEGUN), (DRAFTS, ()), (DRAFT_TOKENS, ()),
                            (ACCEPTED, ()), (UPDATES, DONE)):  # present (at 0) from the start
            self._series(name, extra)

    def observe(self, stats: Mapping[str, Any]) -> None:
        """One request's increments, between ``begun`` and ``done`` (the seqlock)."""
        self.write(increments(stats))

    def write(self, incs: list[Increment]) -> None:
        """One update: ``incs`` between ``begun`` and ``done``; nothing when ``incs`` is empty."""
        if not incs:
            return
        self._series(UPDATES, BEGUN).increment(1)
        for inc in incs:
            if inc.value > 0:
                self._series(inc.name, inc.labels).increment(inc.value)
            else:
                self._series(inc.name, inc.labels)
        self._series(UPDATES, DONE).increment(1)

    def _series(self, name: str, extra: tuple[tuple[str, str], ...]) -> Any:
        key = (name, extra)
        if key not in self.series:
            self.series[key] = self.factory(name, {**self.labels, **dict(extra)})
        return self.series[key]


class DeferredCounters:
    """:class:`SpecCounters` written off the caller's thread: calling it with a request's stats
    adds them to a running sum (no I/O) and, unless a write is already queued, hands ``post``
    one write job (the model's :class:`~specserve.triton.models.llm.Outbox`, after the
    request's response). A write takes the whole sum: one seqlocked update of whole requests."""

    def __init__(self, counters: SpecCounters, post: Callable[[Callable[[], None]], None]
                 ) -> None:
        self.counters, self.post = counters, post
        self._lock = threading.Lock()
        self._sum: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._queued = False

    def __call__(self, stats: Mapping[str, Any]) -> None:
        incs = increments(stats)
        if not incs:
            return
        with self._lock:
            for inc in incs:
                key = (inc.name, inc.labels)
                self._sum[key] = self._sum.get(key, 0) + inc.value
            if self._queued:
                return
            self._queued = True
        self.post(self.flush)

    def flush(self) -> None:
        """Write what was summed so far as one update (called on the ``post`` thread)."""
        with self._lock:
            total, self._sum, self._queued = self._sum, {}, False
        self.counters.write([Increment(name, labels, v) for (name, labels), v in total.items()])
