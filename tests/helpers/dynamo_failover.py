"""Kill one of two Dynamo workers in the middle of a ``specserve bench`` run:
the harness of ``tests/frontends/test_dynamo_failover.py`` and ``benchmarks/dynamo_failover.py``.

What Dynamo promises (ai-dynamo/dynamo ``docs/architecture/request_migration.md`` @90220105;
the flag in ai-dynamo 1.6.1 ``dynamo/frontend/frontend_args.py``: ``--migration-limit``,
``DYN_MIGRATION_LIMIT``, default 0 = off, "enables migration after worker disconnects, response
timeouts, incomplete streams, and worker-local overload rejection"): a request whose stream
breaks is re-sent to another worker with the prompt *plus the tokens already streamed* and the
remaining token budget, so the client sees one continuous stream. The frontend counts them in
``dynamo_frontend_model_migration_total`` (``prometheus_names.py``: ``model_migration_total``).

One run: the bench (greedy, ``ignore_eos``, closed loop) against the frontend; half a request's
time after ``kill_after`` requests have finished, worker ``#0`` gets SIGKILL (its process group,
from a thread so the client's event loop never waits on it). Each record is then classified:
completed with the reference text (the same prompt's greedy text from a run without a kill),
completed with another text, failed (an error the client saw), or hung (the client's own
per-request timeout fired: Dynamo neither finished nor failed it).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specserve.client.acceptance import parse_prometheus
from specserve.client.config import BenchmarkConfig
from specserve.client.metrics import RequestRecord
from specserve.client.run import run_benchmark

MIGRATIONS = "dynamo_frontend_model_migration_total"


def bench_config(url: str, model: str, out: Path, requests: int, concurrency: int,
                 max_tokens: int, timeout_s: float = 120.0, dataset: str | None = None
                 ) -> BenchmarkConfig:
    """Greedy, exactly ``max_tokens`` tokens each, no warmup, never aborted on errors (every
    request is sent, so every one must show up in the report), no counter scrape (a killed
    worker's /metrics is gone)."""
    return BenchmarkConfig(
        url=url.removeprefix("http://"), out=str(out), protocol="openai", model=model,
        requests=requests, warmup=0, concurrency=concurrency, max_tokens=max_tokens,
        temperature=0.0, ignore_eos=True, seed=0, dataset=dataset,
        prompts=None if dataset else "builtin-code",
        scrape_metrics=False, timeout_s=timeout_s, abort_after_errors=requests + 1,
        bootstrap=0)


def migrations(frontend: str) -> dict[str, float]:
    """The frontend's ``dynamo_frontend_model_migration_total`` by its ``migration_type`` and
    ``outcome`` labels (``"type/outcome" -> count``)."""
    with urllib.request.urlopen(frontend.rstrip("/") + "/metrics", timeout=10) as r:
        samples = parse_prometheus(r.read().decode())
    out: dict[str, float] = {}
    for (name, labels), v in samples.items():
        if name == MIGRATIONS:
            lab = dict(labels)
            key = f"{lab.get('migration_type', '?')}/{lab.get('outcome', '?')}"
            out[key] = out.get(key, 0.0) + v
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


@dataclass
class Killer:
    """Calls ``kill()`` (once, on its own thread) when ``after`` records have been made, and
    keeps each record's arrival time (a failed record has no e2e)."""

    after: int | None
    kill: Any
    kill_unix_s: float | None = None
    done: list[float] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    thread: threading.Thread | None = None

    def __call__(self, rec: RequestRecord) -> None:
        self.done.append(time.time())
        self.records.append(rec)
        if self.after is not None and self.thread is None and len(self.done) >= self.after:
            e2e = [r.e2e_s for r in self.records if r.e2e_s]
            delay = 0.5 * sum(e2e) / len(e2e) if e2e else 0.0
            self.thread = threading.Thread(target=self._kill_in, args=(delay,), daemon=True)
            self.thread.start()

    def _kill_in(self, delay_s: float) -> None:
        """Half a request's time after the ``after``-th record: the requests that replaced
        the finished ones are mid-stream (equal lengths finish in waves, so a kill right at a
        finish would catch the rest of the wave at their last token and the new ones before
        their first)."""
        time.sleep(delay_s)
        self.kill_unix_s = time.time()
        self.kill()


@dataclass(frozen=True)
class FailoverRun:
    """One run's records (in completion order), what was in flight at the kill, the migrations
    the frontend counted, and the bench summary (``summary.json``)."""

    records: tuple[RequestRecord, ...]
    finished_unix_s: tuple[float, ...]
    kill_unix_s: float | None
    migrations: dict[str, float]
    summary: dict[str, Any]
    timeout_s: float

    @property
    def in_flight_at_kill(self) -> int:
        t = self.kill_unix_s
        if t is None:
            return 0
        return sum(1 for r, end in zip(self.records, self.finished_unix_s, strict=True)
                   if r.send_time_unix_s <= t < end)

    def hung(self) -> list[RequestRecord]:
        """Records the client gave up on at its own timeout."""
        return [r for r, end in zip(self.records, self.finished_unix_s, strict=True)
                if r.status != "completed" and end - r.send_time_unix_s >= self.timeout_s - 1]

    def texts(self) -> dict[int, str]:
        """prompt index -> text of each completed request."""
        return {r.prompt_index: r.output_text for r in self.records if r.status == "completed"}

    def outcome(self, reference: dict[int, str], max_tokens: int) -> dict[str, Any]:
        """Counts for the report: completed (equal to the reference text or not, with the
        requested token count or not), failed, hung; the error messages seen."""
        done = [r for r in self.records if r.status == "completed"]
        failed = [r for r in self.records if r.status != "completed"]
        hung = self.hung()
        errors: dict[str, int] = {}
        for r in failed:
            key = (r.error or r.status)[:160]
            errors[key] = errors.get(key, 0) + 1
        return {
            "requests": len(self.records),
            "reference_completed": len(reference),
            "recorded_in_summary": int(self.summary.get("records", {}).get("total", -1)),
            "completed": len(done),
            "completed_equal_reference": sum(1 for r in done
                                             if reference.get(r.prompt_index) == r.output_text),
            "completed_full_length": sum(1 for r in done if r.output_tokens == max_tokens),
            "failed": len(failed) - len(hung), "hung": len(hung),
            "in_flight_at_kill": self.in_flight_at_kill,
            "completed_at_kill": sum(1 for t in self.finished_unix_s
                                     if self.kill_unix_s is not None and t <= self.kill_unix_s),
            "migrations": self.migrations, "errors": errors,
            "duration_s": round(self.finished_unix_s[-1] - self.records[0].send_time_unix_s, 2)
            if self.records else 0.0,
        }


def run(dep: Any, cfg: BenchmarkConfig, kill_after: int | None) -> FailoverRun:
    """The bench of ``cfg`` against deployment ``dep``
    (:class:`specserve.frontends.dynamo_serve.DynamoDeployment`), killing worker 0 after
    ``kill_after`` records (None: no kill)."""
    before = migrations(dep.url)
    killer = Killer(kill_after, lambda: dep.kill_worker(0))
    outcome = run_benchmark(cfg, progress=False, plots=False, observe=killer)
    if killer.thread is not None:
        killer.thread.join(timeout=30)
    return FailoverRun(tuple(killer.records), tuple(killer.done), killer.kill_unix_s,
                       _delta(migrations(dep.url), before), outcome.summary, cfg.timeout_s)

