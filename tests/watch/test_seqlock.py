"""The seqlock around each request's counter update (``specserve.triton.spec_counters``) and
the watch's settled read (``specserve.watch.run.scrape``): a scrape that lands between one
request's drafted and accepted increments must not reach an interval (the healthy-server watch
read 0.98 acceptance once with the draft equal to the target, docs/reliability.md §7)."""

from __future__ import annotations

import threading
import time
from typing import Any

from specserve.triton import spec_counters as sc
from specserve.triton.spec_counters import SpecCounters
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


def test_no_settled_read_is_torn_while_updates_race_the_scrapes() -> None:
    """A writer thread with a 1 ms window between increments against back-to-back scrapes:
    every read the watch keeps has accepted == drafted (the draft is the target)."""
    st = Store(pause_s=0.001)
    c = SpecCounters(st.factory, LABELS)
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            c.observe(REQUEST)
            time.sleep(0.003)  # until the next request ends
    w, fetch = _scraper(st)
    th = threading.Thread(target=write, daemon=True)
    th.start()
    torn = kept = 0
    t0 = time.monotonic()
    try:
        # until the race was seen and some reads were kept (under load a slow scrape may need
        # longer than a quiet machine's 0.5 s), at most 10 s
        while (torn == 0 or kept < 5) and time.monotonic() - t0 < 10.0:
            raw = run.read_once("x", "specserve", fetch, 1.0)
            torn += raw.draft_tokens != raw.accepted
            got, ok = run.scrape(w, "specserve", fetch, 1.0, pause_s=0.0005)
            if ok:
                kept += 1
                assert got.draft_tokens == got.accepted, got
    finally:
        stop.set()
        th.join(timeout=5)
    assert torn > 0 and kept >= 5  # the race was there to be caught
