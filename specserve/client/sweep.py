"""``specserve bench --sweep 1,2,4,...``: speculation and its baseline at each concurrency, each
in its own phase, and where speculation stops paying.

Per level ``c`` two closed-loop phases at concurrency ``c`` (spec then baseline, the order
swapped at every other level so drift hits both alike), each a complete run with its own warmup
and report under ``OUT/c{c}-{variant}/``: throughput is only meaningful for a configuration that
had the machine to itself (an interleaved run mixes both). The sweep's ``summary.json`` has, per
level, both variants' figures, the per-user tok/s speedup (ratio of means with the seeded
bootstrap CI of :func:`specserve.client.summary.bootstrap_speedup`) and the output tok/s ratio;
the crossover is the lowest level where speculation stops paying (speedup < 1). Plots: output
tok/s against per-user tok/s (one curve per variant, points labelled by concurrency) and the
speedups against concurrency with the crossover marked.

With ``--input-lengths L1,L2,...`` (:mod:`specserve.client.context`) every (input length,
concurrency) cell is such a pair of phases, on prompts of exactly ``L`` tokens of the served
tokenizer (``OUT/prompts-L{L}.jsonl``), in ``OUT/L{L}-c{c}-{variant}/``; each row then also
carries the measured step cost of both variants (``step_ms``: a verify step, proposal included,
against a decode step; ``verify_cost_ratio``) and the crossovers are given per length
(``crossover_by_length``); ``sweep_context.png`` draws step cost and tau against input length.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.client.config import BenchmarkConfig
from specserve.client.context import step_ms, step_ms_p50, steps_mean
from specserve.client.metrics import RequestRecord
from specserve.client.summary import bootstrap_speedup, per_request_values
from specserve.config import write_json_atomic, write_text_atomic
from specserve.errors import SpecserveError

VARIANTS = ("spec", "baseline")
LEVEL_KEYS = ("output_token_throughput_tok_s", "request_throughput_rps")


def parse_levels(text: str) -> list[int]:
    """``1,2,4,8`` -> [1, 2, 4, 8] (positive, increasing, no repeats)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise SpecserveError(f"--sweep: '{text}' is not a list of concurrencies like 1,2,4,8")\
            from e
    if not levels or min(levels) < 1 or levels != sorted(set(levels)):
        raise SpecserveError(f"--sweep: '{text}': give increasing concurrencies >= 1, e.g. 1,4,8")
    return levels


@dataclass(frozen=True)
class Context:
    """One input length of the context axis and the prompts file built for it."""

    length: int
    dataset: Path


def phase_config(cfg: BenchmarkConfig, level: int, variant: str, out: Path,
                 context: Context | None = None) -> BenchmarkConfig:
    """The single-variant run of one phase: ``variant``'s server and model at ``level`` (and
    on ``context``'s prompts); the baseline's phase is sent no predictions."""
    model = cfg.model if variant == "spec" else (cfg.baseline_model or cfg.model)
    url = cfg.url if variant == "spec" else (cfg.baseline_url or cfg.url)
    replicas = cfg.replicas if variant == "spec" or not cfg.baseline_url else ()
    name = f"c{level}-{variant}" if context is None else f"L{context.length}-c{level}-{variant}"
    extra: dict[str, Any] = {} if context is None else {"dataset": str(context.dataset),
                                                        "prompts": None}
    return dataclasses.replace(cfg, url=url, replicas=replicas, model=model, baseline_model=None,
                               baseline_url=None, concurrency=level, request_rate=None,
                               out=str(out / name),
                               send_prediction=cfg.send_prediction and variant == "spec", **extra)


@dataclass(frozen=True)
class Phase:
    level: int
    variant: str
    summary: dict[str, Any]        # that run's summary.json
    records: tuple[RequestRecord, ...]


def level_summary(spec: Phase, base: Phase, seed: int, n_boot: int) -> dict[str, Any]:
    """One level: both variants' main figures, the per-user speedup with its CI, the output
    throughput ratio (pure)."""
    def figures(p: Phase) -> dict[str, Any]:
        v = p.summary["variants"]["spec"]  # each phase runs its model as the only variant
        acc = v["acceptance"]
        return {"model": v["model"], "completed": v["completed"], "errors": v["errors"],
                **{k: v[k] for k in LEVEL_KEYS},
                "per_user_tok_s_mean": v["per_user_tok_s"]["mean"],
                "ttft_ms_p50": v["ttft_ms"]["p50"], "ttft_ms_p99": v["ttft_ms"]["p99"],
                "tpot_ms_p50": v["tpot_ms"]["p50"],
                "tau": (v.get("engine_counters") or {}).get("tau") or acc["tau_server"]
                or acc["tau_stream"], "report": p.summary["config"]["out"],
                "step_ms": step_ms(p.records), "steps_mean": steps_mean(p.records),
                "step_ms_p50": step_ms_p50(p.records),
                "input_tokens_mean": _mean([r.input_tokens for r in p.records
                                            if r.phase == "measure" and r.input_tokens]),
                "tau_by_category": {c: (f["variants"].get("spec") or {}).get("tau") for c, f in
                                    (p.summary.get("categories") or {}).items()}}

    sp = bootstrap_speedup(per_request_values(spec.records, "per_user_tok_s"),
                           per_request_values(base.records, "per_user_tok_s"), True,
                           "per_user_tok_s", n_boot=n_boot, seed=seed + spec.level)
    fs, fb = figures(spec), figures(base)
    ratio = (fs["output_token_throughput_tok_s"] / fb["output_token_throughput_tok_s"]
             if fb["output_token_throughput_tok_s"] else None)
    cost = (fs["step_ms"] / fb["step_ms"] if fs["step_ms"] and fb["step_ms"] else None)
    return {"concurrency": spec.level, "spec": fs, "baseline": fb,
            "per_user_speedup": dataclasses.asdict(sp) if sp else None,
            "output_throughput_ratio": ratio, "verify_cost_ratio": cost}


def _mean(xs: Sequence[float | int | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def crossover(levels: Sequence[dict[str, Any]], key: str) -> int | None:
    """The lowest concurrency at which ``key`` (a speedup) falls below 1, else None."""
    for lv in levels:
        v = lv[key]["speedup"] if key == "per_user_speedup" and lv[key] else lv.get(key)
        if isinstance(v, (int, float)) and v < 1.0:
            return int(lv["concurrency"])
    return None


def _records(out: Path) -> tuple[RequestRecord, ...]:
    path = out / "requests.jsonl"
    if not path.exists():
        return ()
    return tuple(RequestRecord.from_dict(json.loads(x))
                 for x in path.read_text().split("\n") if x.strip())


RunPhase = Callable[[BenchmarkConfig], dict[str, Any]]


def build_contexts(cfg: BenchmarkConfig, lengths: list[int], engine: str | None,
                   ) -> tuple[BenchmarkConfig, list[Context], str]:
    """The prompts of every input length, written to ``OUT/prompts-L{L}.jsonl`` from the run's
    prompt set (``--dataset`` / ``--prompts``), counted with the served tokenizer (``--tokenizer``,
    else ``ENGINE/tokenizer``); lengths the engine's record cannot hold are refused. Returns the
    config (its tokenizer set, so records count their input tokens), the contexts, and where the
    limits came from."""
    from specserve.client.context import (
        ContextLimits,
        check_lengths,
        long_prompts,
        tokenizer_ends,
    )
    from specserve.client.datasets import dump_jsonl, load_prompts
    from specserve.engine_record import read_engine_record

    limits, tok = None, cfg.tokenizer
    if engine is not None:
        rec = read_engine_record(engine)
        limits = ContextLimits(rec.max_input_len, rec.max_seq_len,
                               str(Path(engine) / "build_config.json"))
        if tok is None and (Path(engine) / "tokenizer").is_dir():
            tok = str(Path(engine) / "tokenizer")
    if tok is None:
        raise SpecserveError("--input-lengths counts tokens with the served tokenizer: give "
                             "--tokenizer DIR or --engine DIR (its tokenizer/)")
    check_lengths(lengths, cfg.max_tokens, limits)
    ends = tokenizer_ends(tok)
    n = cfg.warmup + cfg.requests
    pool = load_prompts(cfg.dataset, cfg.prompts, max(n, 64), cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    contexts = []
    for length in lengths:
        path = out / f"prompts-L{length}.jsonl"
        write_text_atomic(path, dump_jsonl(long_prompts(pool, length, n, ends)))
        contexts.append(Context(length, path))
    note = (f"checked against {limits.source} (max_input_len {limits.max_input_len}, "
            f"max_seq_len {limits.max_seq_len})" if limits else
            "not checked (no --engine DIR): the server refuses what it cannot hold")
    return dataclasses.replace(cfg, tokenizer=tok), contexts, note


def run_sweep(cfg: BenchmarkConfig, levels: list[int], run_phase: RunPhase,
              plots: bool = True, contexts: Sequence[Context] = (),
              context_limits: str | None = None) -> dict[str, Any]:
    """Run every phase with ``run_phase(cfg) -> summary`` and write the sweep's report into
    ``cfg.out``; the sweep summary (``exit_code`` 1 when some phase was partial). ``contexts``:
    the input lengths (outer loop), each over every level."""
    if not cfg.has_baseline:
        raise SpecserveError("--sweep compares speculation with a baseline: give "
                             "--baseline-model or --baseline-url")
    out = Path(cfg.out)
    rows: list[dict[str, Any]] = []
    partial = stopped = False
    axis: list[Context | None] = [*contexts] or [None]
    cells = [(c, lv) for c in axis for lv in levels]
    for i, (ctx, level) in enumerate(cells):
        done: dict[str, Phase] = {}
        for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
            pcfg = phase_config(cfg, level, variant, out, ctx)
            s = run_phase(pcfg)
            partial = partial or s.get("status") != "ok"
            done[variant] = Phase(level, variant, s, _records(Path(pcfg.out)))
            if s.get("aborted"):
                break
        if len(done) < 2:
            stopped = True
            break
        row = level_summary(done["spec"], done["baseline"], cfg.seed, cfg.bootstrap)
        rows.append({"input_length": ctx.length, **row} if ctx else row)
    summary = {"config": cfg.to_dict(), "sweep": levels, "levels": rows,
               "crossover_per_user": None if contexts else crossover(rows, "per_user_speedup"),
               "crossover_output_throughput": None if contexts else
               crossover(rows, "output_throughput_ratio"),
               "status": "partial" if partial or stopped else "ok"}
    if contexts:
        summary["input_lengths"] = [c.length for c in contexts]
        summary["context_limits"] = context_limits
        summary["crossover_by_length"] = {
            str(c.length): {k: crossover([r for r in rows if r["input_length"] == c.length], k)
                            for k in ("per_user_speedup", "output_throughput_ratio")}
            for c in contexts}
    summary["exit_code"] = 0 if summary["status"] == "ok" else 1
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "summary.json", summary)
    names: list[str] = []
    if plots and rows:
        from specserve.client.plots import context_plots, sweep_plots

        names = context_plots(summary, out) if contexts else sweep_plots(summary, out)
    write_text_atomic(out / "README.md", sweep_readme(summary, names))
    return summary


def sweep_table(summary: dict[str, Any]) -> str:
    ctx = "input_lengths" in summary
    head = (("| input tokens " if ctx else "")
            + "| concurrency | per-user tok/s spec / baseline | speedup [95% CI] | output tok/s "
            "spec / baseline | ratio | TTFT p50 ms spec / baseline | tau |"
            + (" step ms spec / baseline | verify cost ratio |" if ctx else "") + "\n"
            + "|---" * (7 + 3 * ctx) + "|")
    lines = [head]
    for lv in summary["levels"]:
        s, b, sp = lv["spec"], lv["baseline"], lv["per_user_speedup"]
        ci = f"{sp['speedup']:.2f} [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]" if sp else "–"
        ratio = lv["output_throughput_ratio"]
        tail = (f" {_f(s.get('step_ms'), 2)} / {_f(b.get('step_ms'), 2)} | "
                f"{_f(lv.get('verify_cost_ratio'), 2)} |" if ctx else "")
        lines.append(
            (f"| {lv['input_length']} " if ctx else "")
            + f"| {lv['concurrency']} | {_f(s['per_user_tok_s_mean'])} / "
            f"{_f(b['per_user_tok_s_mean'])} | {ci} | {_f(s['output_token_throughput_tok_s'])} / "
            f"{_f(b['output_token_throughput_tok_s'])} | {_f(ratio, 2)} | "
            f"{_f(s['ttft_ms_p50'])} / {_f(b['ttft_ms_p50'])} | {_f(s['tau'], 2)} |" + tail)
    return "\n".join(lines)


def _f(v: Any, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def crossover_line(summary: dict[str, Any]) -> str:
    if "crossover_by_length" in summary:
        return " ".join(f"{length} tokens: " + crossover_line(
            {"crossover_per_user": c["per_user_speedup"],
             "crossover_output_throughput": c["output_throughput_ratio"]})
            for length, c in summary["crossover_by_length"].items())
    cu, ct = summary["crossover_per_user"], summary["crossover_output_throughput"]
    if cu is None and ct is None:
        return "Speculation pays at every swept concurrency."
    parts = []
    if cu is not None:
        parts.append(f"per-user tok/s from concurrency {cu}")
    if ct is not None:
        parts.append(f"output tok/s from concurrency {ct}")
    return "Speculation stops paying: " + "; ".join(parts) + "."


def sweep_readme(summary: dict[str, Any], plots: list[str]) -> str:
    ctx = summary.get("input_lengths")
    where = (f"input lengths {ctx} tokens x concurrencies; reports in the "
             "`L{tokens}-c{N}-{variant}/` folders" if ctx else
             "reports in the `c{N}-{variant}/` folders")
    parts = ["# specserve bench --sweep", "",
             f"Concurrencies {summary['sweep']}; each variant in its own phase per level "
             f"({where}).", "", sweep_table(summary), "",
             crossover_line(summary), ""]
    parts += [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"
