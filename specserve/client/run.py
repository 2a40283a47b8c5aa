"""``run_benchmark``: one call from a :class:`BenchmarkConfig` to a report directory."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.client.benchmark import JsonlSink, run_load
from specserve.client.config import BenchmarkConfig
from specserve.client.metrics import RequestRecord
from specserve.client.report import build_summary, replica_split, write_report
from specserve.client.summary import parse_slo, speedups


@dataclass(frozen=True)
class BenchOutcome:
    """The summary (as in ``summary.json``), the files written and the exit code.

    ``exit_code`` is 0 when every measured request completed, 1 when the report is partial
    (errors, cancellations, an aborted or interrupted run)."""

    summary: dict[str, Any]
    out: Path
    files: tuple[str, ...]
    exit_code: int


def _progress_bar(total: int, enabled: bool) -> tuple[Callable[[RequestRecord], None] | None,
                                                     Any]:
    if not enabled:
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)
    task = prog.add_task("requests", total=total, status="")
    counts = {"ok": 0, "err": 0}

    def advance(rec: RequestRecord) -> None:
        counts["ok" if rec.status == "completed" else "err"] += 1
        prog.update(task, advance=1, status=f"ok {counts['ok']} failed {counts['err']}")

    return advance, prog


def run_benchmark(cfg: BenchmarkConfig, progress: bool | None = None, plots: bool = True,
                  observe: Callable[[RequestRecord], None] | None = None) -> BenchOutcome:
    """Run the benchmark of ``cfg`` and write its report into ``cfg.out``; ``observe(rec)``
    sees each record as it is made (the fault-injection harnesses act on it)."""
    cfg.validate()
    slo = parse_slo(cfg.slo) if cfg.slo else None
    out = Path(cfg.out)
    per_variant = 2 if cfg.has_baseline else 1
    show = sys.stderr.isatty() if progress is None else progress
    bar, prog = _progress_bar((cfg.requests + cfg.warmup) * per_variant, show)
    hooks = [h for h in (bar, observe) if h is not None]

    def advance(rec: RequestRecord) -> None:
        for hook in hooks:
            hook(rec)
    sink = JsonlSink(out / "requests.jsonl")
    started = time.time()
    try:
        if prog is not None:
            prog.start()
        result = run_load(cfg, sink, advance)
    finally:
        if prog is not None:
            prog.stop()
        sink.close()
    records = result.records
    sp = speedups(records, seed=cfg.seed, n_boot=cfg.bootstrap) if cfg.has_baseline else {}
    summary = build_summary(records, result.measure_duration_s, slo, sp, {
        "config": cfg.to_dict(), "started_unix_s": started, "aborted": result.aborted,
        "interrupted": result.interrupted, "inputs_declared": result.inputs_declared,
    }, result.counters)
    if cfg.replicas:
        summary["replicas"] = replica_split(records, cfg.urls, result.measure_duration_s, slo)
    partial = bool(result.aborted or result.interrupted
                   or any(rec.status != "completed" for rec in records))
    summary["status"] = "partial" if partial else "ok"
    summary["exit_code"] = 1 if partial else 0
    files = write_report(out, summary, records, sp, plots=plots)
    return BenchOutcome(summary, out, tuple(files), summary["exit_code"])
