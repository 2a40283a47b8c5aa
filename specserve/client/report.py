"""The report of a benchmark run: ``summary.json``, ``summary.csv``, plots and ``README.md``.

Every file but ``requests.jsonl`` (written record by record while the run goes) is written to a
temporary name and renamed into place, so a report is never half-written.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specserve.client.acceptance import EngineAcceptance
from specserve.client.metrics import RequestRecord
from specserve.client.prediction import prediction_summary
from specserve.client.summary import Slo, Speedup, by_category, summarize
from specserve.config import write_json_atomic, write_text_atomic

DIST_METRICS = (("ttft_ms", "ms"), ("tpot_ms", "ms"), ("itl_ms", "ms"), ("itl_chunk_ms", "ms"),
                ("e2e_ms", "ms"), ("per_user_tok_s", "tok/s"))
SCALARS = (("request_throughput_rps", "req/s"), ("output_token_throughput_tok_s", "tok/s"),
           ("goodput_rps", "req/s"), ("goodput_fraction", "fraction"),
           ("completed", "requests"), ("errors", "requests"), ("cancelled", "requests"))


def build_summary(records: Sequence[RequestRecord], duration_s: float, slo: Slo | None,
                  sp: dict[str, Speedup], extra: dict[str, Any],
                  counters: dict[str, EngineAcceptance] | None = None) -> dict[str, Any]:
    """Everything in ``summary.json`` (``sp`` from :func:`summary.speedups`; ``counters``:
    variant -> acceptance from its server's Prometheus counters)."""
    variants = sorted({r.variant for r in records}, key=lambda v: v != "spec")
    meas = [r for r in records if r.phase == "measure"]
    summary = {
        **extra,
        "measure_duration_s": duration_s,
        "slo": asdict(slo) if slo else None,
        "records": {
            "total": len(records), "warmup": sum(r.phase == "warmup" for r in records),
            **{s: sum(r.status == s for r in meas) for s in ("completed", "error", "cancelled")},
        },
        "token_count_sources": dict(Counter(r.token_count_source for r in meas
                                            if r.status == "completed")),
        "variants": {v: summarize(records, v, duration_s, slo, (counters or {}).get(v),
                                  interleaved=len(variants) > 1).to_dict() for v in variants},
        "combined": _combined(meas, duration_s) if len(variants) > 1 else None,
        "speedup": {m: asdict(s) for m, s in sp.items()},
        "categories": by_category(records, seed=int((extra.get("config") or {}).get("seed", 0))),
    }
    summary["flags"] = [f for v in summary["variants"].values() for f in v["flags"]]
    pred = prediction_summary(records)
    if pred is not None:  # only runs whose prompts carried predictions
        summary["prediction"] = pred
    return summary


def prediction_lines(summary: dict[str, Any]) -> list[str]:
    """Predicted Outputs, a few lines ([] when no request carried a prediction)."""
    pred = summary.get("prediction")
    if not pred:
        return []
    p = pred["spec"]
    lines = [f"Predicted Outputs: {p['requests']} requests with a prediction; server counts "
             f"accepted {p['accepted_prediction_tokens']}, rejected "
             f"{p['rejected_prediction_tokens']} (not returned by {p['not_returned']})."]
    if p["recounted"]:
        lines.append(f"Client recount: accepted {p['recount_accepted']} over {p['recounted']} "
                     f"requests; server != recount in {p['mismatches']} of {p['compared']}.")
    for note in p["recount_notes"]:
        lines.append(f"No recount: {note}.")
    vb = pred.get("vs_baseline")
    if vb:
        lines.append(f"Against the same requests without it ({vb['pairs']} pairs): per-user "
                     f"tok/s x{_fmt(vb['per_user_tok_s_ratio_median'])} (median), E2E "
                     f"x{_fmt(vb['e2e_ratio_median'])} (median); outputs equal in "
                     f"{vb['outputs_equal']} of {vb['pairs']}.")
    return lines


def replica_split(records: Sequence[RequestRecord], urls: Sequence[str], duration_s: float,
                  slo: Slo | None) -> dict[str, Any]:
    """Per replica (``--url A --url B ...``): its request counts and each variant's figures over
    the requests it served (throughput over the whole run; ``variants`` above is the pool)."""
    out: dict[str, Any] = {}
    interleaved = len({r.variant for r in records}) > 1
    for url in urls:
        mine = [r for r in records if r.url == url]
        meas = [r for r in mine if r.phase == "measure"]
        out[url] = {
            "records": {"total": len(mine), "warmup": len(mine) - len(meas),
                        **{s: sum(r.status == s for r in meas)
                           for s in ("completed", "error", "cancelled")}},
            "variants": {v: summarize(mine, v, duration_s, slo,
                                      interleaved=interleaved).to_dict()
                         for v in sorted({r.variant for r in meas}, key=lambda v: v != "spec")},
        }
    return out


def replica_table(summary: dict[str, Any]) -> str:
    """A Markdown table, one row per replica and variant ("" when the run had one server)."""
    reps = summary.get("replicas")
    if not reps:
        return ""
    lines = ["| replica | variant | requests | completed | errors | cancelled | req/s | "
             "output tok/s | TTFT p50 (ms) | E2E p50 (ms) | acceptance_rate | tau_stream |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for url, rep in reps.items():
        if not rep["variants"]:
            lines.append(f"| {url} | – | 0 | 0 | 0 | 0 | – | – | – | – | – | – |")
        for v, vs in rep["variants"].items():
            acc = vs["acceptance"]
            lines.append(
                f"| {url} | {v} | {vs['requests']} | {vs['completed']} | {vs['errors']} | "
                f"{vs['cancelled']} | {_fmt(vs['request_throughput_rps'], 3)} | "
                f"{_fmt(vs['output_token_throughput_tok_s'], 1)} | {_fmt(vs['ttft_ms']['p50'])} | "
                f"{_fmt(vs['e2e_ms']['p50'])} | {_fmt(acc['acceptance_rate'], 3)} | "
                f"{_fmt(acc['tau_stream'], 3)} |")
    return "\n".join(lines)


def _combined(meas: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """Throughput of an interleaved run, both variants together (the only honest figure)."""
    done = [r for r in meas if r.status == "completed"]
    dur = max(duration_s, 1e-9)
    return {"request_throughput_rps": len(done) / dur,
            "output_token_throughput_tok_s": sum(r.output_tokens for r in done) / dur,
            "note": "spec and baseline interleaved on one machine: per-variant throughput is "
                    "not measured; run `specserve bench --sweep` for each in its own phase"}


def csv_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows: one per (variant, metric), plus one per speedup."""
    rows: list[dict[str, Any]] = []
    for v, vs in summary["variants"].items():
        for name, unit in DIST_METRICS:
            d = vs[name]
            rows.append({"variant": v, "metric": name, "unit": unit, **{
                k: d[k] for k in ("n", "mean", "p50", "p90", "p99", "min", "max")}})
        for name, unit in SCALARS:
            rows.append({"variant": v, "metric": name, "unit": unit, "value": vs[name]})
        acc = vs["acceptance"]
        for name in ("acceptance_rate", "tau_stream", "tau_server"):
            rows.append({"variant": v, "metric": name, "unit": "", "value": acc[name]})
    for m, s in summary["speedup"].items():
        rows.append({"variant": "speedup", "metric": m, "unit": "x", "value": s["speedup"],
                     "ci_low": s["ci_low"], "ci_high": s["ci_high"], "n": s["n_spec"]})
    rows += prediction_rows(summary.get("prediction"))
    for r in rows:
        r["category"] = "all"
    return rows + category_rows(summary.get("categories") or {})


def prediction_rows(pred: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Flat rows of Predicted Outputs (none without predictions; "not returned" kept as is)."""
    if not pred:
        return []
    p = pred["spec"]
    rows = [{"variant": "spec", "metric": name, "unit": "tokens", "value": p[name],
             "n": p["requests"]} for name in ("accepted_prediction_tokens",
                                              "rejected_prediction_tokens", "recount_accepted")]
    rows.append({"variant": "spec", "metric": "prediction_recount_mismatches", "unit": "requests",
                 "value": p["mismatches"], "n": p["compared"]})
    vb = pred.get("vs_baseline")
    if vb:
        rows += [{"variant": "speedup", "metric": f"prediction_{name}", "unit": "x",
                  "value": vb[name], "n": vb["pairs"]}
                 for name in ("per_user_tok_s_ratio_median", "e2e_ratio_median")]
    return rows


CATEGORY_CSV = (("tau", ""), ("acceptance_rate", ""), ("ttft_ms_p50", "ms"),
                ("tpot_ms_p50", "ms"), ("e2e_ms_p50", "ms"), ("per_user_tok_s_mean", "tok/s"))


def category_rows(cats: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows of the per-category split: one per (category, variant, figure) and one per
    (category, speedup)."""
    rows: list[dict[str, Any]] = []
    for cat, c in cats.items():
        for v, fig in c["variants"].items():
            rows += [{"category": cat, "variant": v, "metric": name, "unit": unit,
                      "value": fig[name], "n": fig["completed"]} for name, unit in CATEGORY_CSV]
        rows += [{"category": cat, "variant": "speedup", "metric": m, "unit": "x",
                  "value": s["speedup"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                  "n": s["n_spec"]} for m, s in c["speedup"].items()]
    return rows


CSV_FIELDS = ("variant", "metric", "unit", "n", "mean", "p50", "p90", "p99", "min", "max",
              "value", "ci_low", "ci_high", "category")


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def text_table(summary: dict[str, Any]) -> str:
    """A Markdown table of the main figures, one column per variant."""
    vs = summary["variants"]
    names = list(vs)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for name, unit in DIST_METRICS:
        for stat in ("mean", "p50", "p90", "p99"):
            cells = [_fmt(vs[v][name][stat]) for v in names]
            lines.append(f"| {name.rsplit('_', 1)[0]} {stat} ({unit}) | " + " | ".join(cells)
                         + " |")
    for name, unit in SCALARS:
        lines.append(f"| {name} ({unit}) | " + " | ".join(_fmt(vs[v][name], 3) for v in names)
                     + " |")
    for name in ("acceptance_rate", "tau_stream", "tau_server"):
        lines.append(f"| {name} | " + " | ".join(
            _fmt(vs[v]["acceptance"][name], 3) for v in names) + " |")
    lines.append("| acceptance from | " + " | ".join(
        "; ".join(vs[v]["acceptance"].get("sources") or []) or "–" for v in names) + " |")
    if any(vs[v].get("engine_counters") for v in names):
        for key in ("tau", "acceptance_rate"):
            lines.append(f"| {key} (server counters) | " + " | ".join(
                _fmt((vs[v].get("engine_counters") or {}).get(key), 3) for v in names) + " |")
        lines.append("| counters from | " + " | ".join(
            (vs[v].get("engine_counters") or {}).get("source", "–") for v in names) + " |")
    return "\n".join(lines)


def category_table(summary: dict[str, Any]) -> str:
    """A Markdown table of the per-category split: one row per (category, variant); with a
    baseline the spec rows carry the per-user tok/s and TPOT speedups ("" without categories)."""
    cats = summary.get("categories") or {}
    if not cats:
        return ""
    lines = ["| category | variant | requests | tau | acceptance | TTFT p50 ms | TPOT p50 ms | "
             "E2E p50 ms | tok/s/user | speedup tok/s/user [95% CI] | speedup TPOT |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cat, c in cats.items():
        for v, f in c["variants"].items():
            sp = c["speedup"] if v == "spec" else {}
            pu, tp = sp.get("per_user_tok_s"), sp.get("tpot_s")
            ci = (f"{pu['speedup']:.2f} [{pu['ci_low']:.2f}, {pu['ci_high']:.2f}]"
                  if pu else "–")
            lines.append(
                f"| {cat} | {v} | {f['completed']} | {_fmt(f['tau'])} | "
                f"{_fmt(f['acceptance_rate'])} | {_fmt(f['ttft_ms_p50'])} | "
                f"{_fmt(f['tpot_ms_p50'])} | {_fmt(f['e2e_ms_p50'])} | "
                f"{_fmt(f['per_user_tok_s_mean'], 1)} | {ci} | "
                f"{_fmt(tp['speedup']) if tp else '–'} |")
    return "\n".join(lines)


def flag_lines(summary: dict[str, Any]) -> list[str]:
    """The report's warnings, one line each (empty when there are none)."""
    return [f"WARNING: {f}" for f in summary.get("flags") or []]


def speedup_table(sp: dict[str, Any]) -> str:
    lines = ["| metric | spec mean | baseline mean | speedup | 95% CI |", "|---|---|---|---|---|"]
    for m, s in sp.items():
        scale, unit = (1e3, "ms") if m != "per_user_tok_s" else (1.0, "tok/s")
        lines.append(f"| {m.removesuffix('_s')} | {s['spec_mean'] * scale:.2f} {unit} | "
                     f"{s['baseline_mean'] * scale:.2f} {unit} | {s['speedup']:.3f}x | "
                     f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}] |")
    return "\n".join(lines)


def _setup_line(cfg: dict[str, Any]) -> str:
    base = ""
    if cfg.get("baseline_model") or cfg.get("baseline_url"):
        base = (f", baseline `{cfg.get('baseline_model') or cfg.get('model')}` at "
                f"`{cfg.get('baseline_url') or cfg.get('url')}`")
    load = (f"open loop at {cfg['request_rate']} req/s" if cfg.get("request_rate")
            else f"closed loop at concurrency {cfg.get('concurrency') or 1}")
    return (f"Server `{cfg.get('url')}` ({cfg.get('protocol')}), model `{cfg.get('model')}`"
            f"{base}; {load}, max_tokens {cfg.get('max_tokens')}, stream {cfg.get('stream')}.")


def readme(summary: dict[str, Any], plots: list[str]) -> str:
    r = summary["records"]
    parts = [
        "# specserve bench report", "", _setup_line(summary.get("config", {})), "",
        f"Requests measured: {r['completed']} completed, {r['error']} errors, "
        f"{r['cancelled']} cancelled ({r['warmup']} warmup not counted). "
        f"Token counts from: {summary['token_count_sources']}.",
    ]
    if summary.get("aborted"):
        parts += ["", f"**Run aborted:** {summary['aborted']}"]
    parts += [f"\n**{line}**" for line in flag_lines(summary)]
    parts += ["", "## Summary", "", text_table(summary)]
    if summary.get("replicas"):
        parts += ["", "## Per replica (the table above pools them)", "", replica_table(summary)]
    if summary.get("combined"):
        c = summary["combined"]
        parts += ["", f"Throughput, both variants together: "
                  f"{c['output_token_throughput_tok_s']:.1f} output tok/s, "
                  f"{c['request_throughput_rps']:.2f} req/s ({c['note']})."]
    if summary.get("prediction"):
        parts += ["", "## Predicted Outputs", "", *prediction_lines(summary)]
    if summary["speedup"]:
        parts += ["", "## Speedup vs baseline (ratio of means, >1 = speculation better)", "",
                  speedup_table(summary["speedup"])]
    if summary.get("categories"):
        parts += ["", "## By category", "", category_table(summary)]
    parts += ["", "ITL is per token: a chunk's gap divided over the tokens it carries; "
              "`itl_chunk` is the naive per-chunk gap. TPOT = (E2E - TTFT) / (tokens - 1).", ""]
    parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots]
    parts += ["", "Files: `requests.jsonl` (one record per request), `summary.json`, "
              "`summary.csv`.", ""]
    return "\n".join(parts)


def write_report(out: Path, summary: dict[str, Any], records: Sequence[RequestRecord],
                 sp: dict[str, Speedup], plots: bool = True) -> list[str]:
    """Write summary.json/csv, the plots and README.md into ``out``; return the file names."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "summary.json", summary, default=str)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(csv_rows(summary))
    write_text_atomic(out / "summary.csv", buf.getvalue())
    names: list[str] = []
    if plots:
        from specserve.client.plots import write_plots

        names = write_plots(records, sp, out, summary.get("categories"))
    write_text_atomic(out / "README.md", readme(summary, names))
    return ["requests.jsonl", "summary.json", "summary.csv", *names, "README.md"]
