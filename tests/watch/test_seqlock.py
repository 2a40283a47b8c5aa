"""The seqlock around each request's counter update (``specserve.triton.spec_counters``) and
the watch's settled read (``specserve.watch.run.scrape``): a scrape that lands between one
request's drafted and accepted increments must not reach an interval (the healthy-server watch
read 0.98 acceptance once with the draft equal to the target, docs/reliability.md §7)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from specserve.triton import spec_counters as sc
from specserve.triton.spec_counters import DeferredCounters, SpecCounters
from specserve.watch import run
from specserve.watch.series import Totals, settled

LABELS = {"model": "tensorrt_llm", "version": "1"}


class Store:
    """Counters in a dict, each increment logged in order; ``pause_s`` after each (the stub's
    message to the server that makes the window a scrape can land in)."""

    def __init__(self, pause_s: float = 0.0) -> None:
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.log: list[tuple[str, str]] = []
        self.pause_s = pause_s

    def factory(self, name: str, labels: dict[str, str]) -> Any:
        key = (name, tuple(sorted(labels.items())))
        self.values[key] = 0.0
        store = self

        class Counter:
            def increment(self, v: int) -> None:
                store.values[key] += v
                store.log.append((name, labels.get("phase", labels.get("position", ""))))
                if store.pause_s:
                    time.sleep(store.pause_s)
        return Counter()

    def text(self) -> str:
        return "".join(f"{n}{{{','.join(f'{k}={v!r}'.replace(chr(39), chr(34)) for k, v in lb)}}}"
                       f" {v}\n" for (n, lb), v in list(self.values.items()))


REQUEST = {"steps": 3, "draft_tokens": 12, "accepted_tokens": 12,
           "per_position_accepted": [3, 3, 3, 3]}  # the draft is the target: all accepted


def test_each_update_is_bracketed_by_begun_and_done() -> None:
    st = Store()
    c = SpecCounters(st.factory, LABELS)
    c.observe(REQUEST)
    assert st.log[0] == (sc.UPDATES, "begun") and st.log[-1] == (sc.UPDATES, "done")
    assert len(st.log) == 2 + 3 + 4
    c.observe({"steps": 0, "draft_tokens": 0})  # speculation off: no update at all
    assert len(st.log) == 9


def test_deferred_counters_sum_requests_and_write_them_as_one_update_on_the_post_thread(
        ) -> None:
    """DeferredCounters (the reference model's: the serving loop adds, the sender thread
    writes): a call makes no increment itself and posts at most one write at a time; the write
    is one seqlocked update of the summed requests; a call after it posts again."""
    st = Store()
    posted: list[Any] = []
    c = DeferredCounters(SpecCounters(st.factory, LABELS), posted.append)
    start = len(st.log)
    c(REQUEST)
    c({"steps": 0, "draft_tokens": 0})  # speculation off: nothing to add
    c(REQUEST)
    assert len(st.log) == start and len(posted) == 1  # no I/O on the caller's thread
    posted.pop()()
    assert st.log[start:] == [(sc.UPDATES, "begun"), (sc.DRAFTS, ""), (sc.DRAFT_TOKENS, ""),
                              (sc.ACCEPTED, ""), *[(sc.PER_POS, str(k)) for k in range(4)],
                              (sc.UPDATES, "done")]
    value = {n: v for (n, lb), v in st.values.items() if "position" not in dict(lb)}
    assert value[sc.DRAFT_TOKENS] == 24 and value[sc.ACCEPTED] == 24 and value[sc.DRAFTS] == 6
    assert value[sc.UPDATES] == 1  # begun; done likewise (the same name, other labels)
    c(REQUEST)
    assert len(posted) == 1  # the write above took the sum: the next request posts anew
    posted.pop()()
    assert st.values[(sc.DRAFT_TOKENS, tuple(sorted(LABELS.items())))] == 36


def test_settled_needs_the_done_before_to_equal_the_begun_after() -> None:
    def t(begun: float | None, done: float | None) -> Totals:
        return Totals("specserve", 0.0, 0.0, 0.0, begun=begun, done=done)
    assert settled(t(5, 5), t(5, 5))
    assert not settled(t(6, 5), t(6, 6))   # update 6 was in progress at the first read
    assert not settled(t(5, 5), t(6, 5))   # update 6 began before the last read
    assert settled(t(None, None), t(None, None))  # an engine without the pair


def _scraper(st: Store) -> tuple[run.Worker, Any]:
    def fetch(url: str, timeout_s: float) -> str:
        return st.text()
    first = run.read_once("x", "specserve", fetch, 1.0)
    return run.Worker("x", first), fetch


def test_a_torn_read_is_skipped() -> None:
    st = Store()
    c = SpecCounters(st.factory, LABELS)
    c.observe(REQUEST)
    texts = []
    # a scrape taken mid-update: begun 2, done 1, drafted counted, accepted not yet
    st.values[(sc.UPDATES, (("model", "tensorrt_llm"), ("phase", "begun"),
                            ("version", "1")))] += 1
    st.values[(sc.DRAFT_TOKENS, tuple(sorted(LABELS.items())))] += 12
    texts += [st.text(), st.text()]
    c2 = Store()  # the finished state: two whole requests
    c2c = SpecCounters(c2.factory, LABELS)
    c2c.observe(REQUEST)
    c2c.observe(REQUEST)
    texts += [c2.text()] * 3
    calls = iter(texts)
    got, ok = run.scrape(run.Worker("x", Totals("specserve", 0, 0, 0)), "specserve",
                         lambda u, t: next(calls), 1.0, pause_s=0.0)
    assert ok and got.draft_tokens == got.accepted == 24.0, got


class PausedStore(Store):
    """A Store whose writer stops right after the drafted increment (accepted not yet counted)
    until ``release`` is set: the window a scrape can land in, held open on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def factory(self, name: str, labels: dict[str, str]) -> Any:
        inner = super().factory(name, labels)
        store = self

        class Counter:
            def increment(self, v: int) -> None:
                inner.increment(v)
                if name == sc.DRAFT_TOKENS:
                    store.entered.set()
                    store.release.wait(timeout=10)
        return Counter()


@pytest.mark.parametrize("release_after", range(run.SETTLE_READS + 1))
def test_no_settled_read_is_torn_whichever_read_the_update_ends_after(release_after: int) -> None:
    """The update stops inside its window; the scrape's reads see it torn until read number
    ``release_after``, then whole. The raw read is torn (the race is there to catch); the scrape
    keeps only a whole read (accepted == drafted: the draft is the target), or says unsettled
    when the update never ended within its reads."""
    st = PausedStore()
    c = SpecCounters(st.factory, LABELS)
    st.release.set()
    c.observe(REQUEST)  # one whole request before the race
    st.release.clear()
    st.entered.clear()
    w, fetch = _scraper(st)
    th = threading.Thread(target=c.observe, args=(REQUEST,), daemon=True)
    th.start()
    assert st.entered.wait(timeout=10)
    raw = run.read_once("x", "specserve", fetch, 1.0)
    assert raw.draft_tokens != raw.accepted  # torn: drafted counted, accepted not yet
    n = 0

    def racing_fetch(url: str, timeout_s: float) -> str:
        nonlocal n
        if n == release_after:
            st.release.set()
            th.join(timeout=10)  # the update ends between this read and the one before
        n += 1
        return fetch(url, timeout_s)
    got, ok = run.scrape(w, "specserve", racing_fetch, 1.0, pause_s=0.0)
    st.release.set()
    th.join(timeout=10)
    if release_after + 2 < run.SETTLE_READS:  # three whole reads fit in the scrape
        assert ok
    if release_after >= run.SETTLE_READS:  # torn to the last read: said, not kept
        assert not ok
    if ok:
        assert got.draft_tokens == got.accepted == 24.0, got
