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

Prometheus reads each series on its own: no scrape sees several series change together. A
request's update is several increments (each one a message from the Python backend's stub to
the server), so a scrape that lands between them reads its draft tokens without its accepted
ones (seen: 1 scrape in 1,875 at 5 ms under load read 11,448 drafted against 11,430 accepted
with the draft equal to the target; the next read was equal again). The seqlock makes such a
read detectable: a read taken after one that showed ``done = d`` and before one that shows
``begun = d`` holds exactly ``d`` whole updates (:func:`specserve.watch.series.settled`).
"""

from __future__ import annotations

from collections.abc import Mapping
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
        incs = increments(stats)
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
