"""The watch loop (the I/O half of :mod:`specserve.watch`): scrape every worker each interval,
judge the summed interval, hand each event to ``emit``.

Events (plain dicts, ``event`` first): ``start`` (engine, workers, baseline, thresholds, rule),
``interval`` (figures, ``status`` idle/ok/low, ``streak``), ``alarm``, ``recovered``,
``counter-reset`` (a worker's counters went back: restart or model reload), ``unsettled-read``
(a worker whose counter updates kept landing between reads, see :func:`scrape`), ``scrape-error``
(a worker that did not answer this time: left out of the interval, judged again next time),
``end``. Bad input is found before the loop: the baseline file, then one scrape of every URL
(unreachable, no speculative series, several engines) gives one line, non-zero exit.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specserve.client.acceptance import parse_prometheus
from specserve.errors import SpecserveError
from specserve.watch import series
from specserve.watch.baseline import Baseline, read_baseline
from specserve.watch.interval import Delta, combine, delta
from specserve.watch.rule import Rule, State, Thresholds, judge, thresholds
from specserve.watch.series import Totals

METRICS_PATHS = ("/metrics", "/prometheus/metrics")  # vLLM/SGLang/Triton; trtllm-serve
Emit = Callable[[dict[str, Any]], None]
Fetch = Callable[[str, float], str]


@dataclass(frozen=True)
class WatchConfig:
    urls: tuple[str, ...]
    baseline: str
    interval_s: float
    duration_s: float | None = None
    engine: str = "auto"
    rule: Rule = field(default_factory=Rule)
    variant: str | None = None
    exit_on_alarm: bool = False
    timeout_s: float = 5.0


class ScrapeError(SpecserveError):
    """A worker did not answer with metrics."""


def http_get(url: str, timeout_s: float) -> str:
    """The body of ``GET url``; ScrapeError with the reason otherwise."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (http only)
            return str(r.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        raise ScrapeError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ScrapeError(f"{url}: unreachable ({reason})") from None


def candidates(url: str) -> list[str]:
    """``url`` itself, or its metrics paths when it names no path."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecserveError(f"--metrics-url {url!r}: not an http(s) URL")
    if parts.path in ("", "/"):
        return [url.rstrip("/") + p for p in METRICS_PATHS]
    return [url]


def _no_series(u: str, engine: str) -> SpecserveError:
    what = f"no {engine} speculative-decoding series" if engine != "auto" else \
        f"no speculative-decoding series (looked for {series.searched()})"
    if engine in ("trtllm", "auto"):
        what += ("; TensorRT-LLM 1.2.1 exports none on /prometheus/metrics (1.3 does, with "
                 "enable_iter_perf_stats and return_perf_metrics)")
    return SpecserveError(f"{u}: {what}; is speculation on?")


def resolve(url: str, engine: str, fetch: Fetch, timeout_s: float) -> tuple[str, str, Totals]:
    """(the URL that answers with speculative series, its engine, first totals)."""
    unreachable: ScrapeError | None = None
    empty: SpecserveError | None = None  # answered, but without speculative series
    for u in candidates(url):
        try:
            samples = parse_prometheus(fetch(u, timeout_s))
        except ScrapeError as e:
            unreachable = e
            continue
        found = series.detect(samples) if engine == "auto" else \
            [engine] if series.read_totals(samples, engine) else []
        if len(found) > 1:
            raise SpecserveError(f"{u}: series of several engines ({', '.join(found)}); "
                                 "name one with --engine")
        if found:
            totals = series.read_totals(samples, found[0])
            assert totals is not None
            return u, found[0], totals
        empty = empty or _no_series(u, engine)
    err = empty or unreachable
    assert err is not None
    raise err


@dataclass
class Worker:
    url: str
    last: Totals


SETTLE_READS = 8      # reads per scrape at most while updates keep landing in between
SETTLE_PAUSE_S = 0.01


def read_once(url: str, engine: str, fetch: Fetch, timeout_s: float) -> Totals:
    totals = series.read_totals(parse_prometheus(fetch(url, timeout_s)), engine)
    if totals is None:
        raise ScrapeError(f"{url}: the {engine} speculative series are gone")
    return totals


def scrape(w: Worker, engine: str, fetch: Fetch, timeout_s: float,
           pause_s: float = SETTLE_PAUSE_S) -> tuple[Totals, bool]:
    """One read of ``w`` and whether it is settled. With a seqlock (:func:`series.settled`):
    the middle of three reads in a row whose first ``done`` equals the last's ``begun`` (more
    reads, up to ``SETTLE_READS``, while updates land in between; then the last middle one,
    unsettled); without, one read, taken as settled. A read between two series' updates of
    one request would put its drafted tokens in this interval and its accepted ones in the
    next."""
    reads = [read_once(w.url, engine, fetch, timeout_s)]
    if reads[0].begun is None:
        return reads[0], True
    reads += [read_once(w.url, engine, fetch, timeout_s) for _ in range(2)]
    while not series.settled(reads[-3], reads[-1]) and len(reads) < SETTLE_READS:
        time.sleep(pause_s)
        reads.append(read_once(w.url, engine, fetch, timeout_s))
    return reads[-2], series.settled(reads[-3], reads[-1])


@dataclass
class Loop:
    """One watch: the workers, the rule's state and what it has counted so far."""

    cfg: WatchConfig
    base: Baseline
    th: Thresholds
    engine: str
    workers: list[Worker]
    emit: Emit
    fetch: Fetch
    state: State = field(default_factory=State)
    intervals: int = 0
    alarms: int = 0

    def tick(self, t_s: float) -> bool:
        """Scrape, judge and emit one interval; True when the watch should stop now."""
        deltas: list[Delta] = []
        for w in self.workers:
            try:
                cur, ok = scrape(w, self.engine, self.fetch, self.cfg.timeout_s)
            except ScrapeError as e:
                self.emit({"event": "scrape-error", "url": w.url, "error": str(e)})
                continue
            if not ok:
                self.emit({"event": "unsettled-read", "url": w.url,
                           "note": f"a counter update was in progress in each of "
                                   f"{SETTLE_READS} reads: this interval may hold part of "
                                   "one request's update (the next holds the rest)"})
            d = delta(w.last, cur)
            if d.reset:
                self.emit({"event": "counter-reset", "url": w.url,
                           "note": "counters went back (restart or model reload): this "
                                   "interval counts from 0"})
            w.last = cur
            deltas.append(d)
        self.intervals += 1
        iv = combine(deltas)
        v = judge(iv, self.th, self.cfg.rule, self.state)
        self.state = v.state
        self.emit({"event": "interval", "index": self.intervals, "t_s": round(t_s, 3),
                   **iv.to_dict(), "status": v.status, "low": list(v.low),
                   "streak": v.state.streak})
        if v.alarm:
            self.alarms += 1
            self.emit(self._alarm(iv.acceptance_rate, iv.tau, v.low))
        if v.recovered:
            self.emit({"event": "recovered", "index": self.intervals,
                       "acceptance_rate": iv.acceptance_rate, "tau": iv.tau})
        return v.alarm and self.cfg.exit_on_alarm

    def _alarm(self, rate: float | None, tau: float | None, low: tuple[str, ...]
               ) -> dict[str, Any]:
        r = self.cfg.rule
        return {"event": "alarm", "index": self.intervals, "engine": self.engine,
                "figures": list(low), "acceptance_rate": rate, "tau": tau,
                "thresholds": self.th.to_dict(), "baseline": self.base.to_dict(),
                "workers": [w.url for w in self.workers],
                "message": f"{' and '.join(low)} below baseline x (1 - {r.tolerance:g}) for "
                           f"{r.consecutive} interval(s) of {self.cfg.interval_s:g} s with at "
                           f"least {r.min_activity:g} draft tokens: speculation has "
                           "(silently) stopped paying; check the draft weights, "
                           "quantization and sampler settings"}


def start(cfg: WatchConfig, emit: Emit, fetch: Fetch = http_get) -> Loop:
    """Check the input (baseline, every URL once) and return the loop, ``start`` emitted."""
    if not cfg.urls:
        raise SpecserveError("--metrics-url: give at least one")
    if cfg.interval_s <= 0:
        raise SpecserveError(f"--interval {cfg.interval_s}: must be positive")
    base = read_baseline(cfg.baseline, cfg.variant)
    th = thresholds(base, cfg.rule)
    workers, engines = [], set()
    for url in cfg.urls:
        u, engine, totals = resolve(url, cfg.engine, fetch, cfg.timeout_s)
        w = Worker(u, totals)
        if totals.begun is not None:  # a seqlock: the first interval starts from a settled read
            w.last = scrape(w, engine, fetch, cfg.timeout_s)[0]
        workers.append(w)
        engines.add(engine)
    if len(engines) > 1:
        raise SpecserveError(f"--metrics-url: workers of different engines ({sorted(engines)}); "
                             "watch one deployment at a time")
    engine = engines.pop()
    r = cfg.rule
    emit({"event": "start", "engine": engine, "workers": [w.url for w in workers],
          "baseline": base.to_dict(), "thresholds": th.to_dict(),
          "rule": {"tolerance": r.tolerance, "consecutive": r.consecutive,
                   "min_activity": r.min_activity, "interval_s": cfg.interval_s}})
    return Loop(cfg, base, th, engine, workers, emit, fetch)


def watch(cfg: WatchConfig, emit: Emit, fetch: Fetch = http_get,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """Run until ``duration_s`` (forever without it; ``exit_on_alarm``: the first alarm);
    the exit code: 1 if an alarm was raised, else 0."""
    loop = start(cfg, emit, fetch)
    t0 = clock()
    n = 0
    while cfg.duration_s is None or (n + 1) * cfg.interval_s <= cfg.duration_s + 1e-9:
        n += 1
        sleep(max(0.0, t0 + n * cfg.interval_s - clock()))
        if loop.tick(clock() - t0):
            break
    code = 1 if loop.alarms else 0
    emit({"event": "end", "intervals": loop.intervals, "alarms": loop.alarms,
          "exit_code": code})
    return code
