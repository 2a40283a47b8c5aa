"""PNG plots of a benchmark run (matplotlib, Agg backend): latency CDFs, ITL histogram,
tokens-per-step histogram, spec vs baseline bars with bootstrap 95% confidence intervals."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specserve.client.metrics import RequestRecord
from specserve.client.summary import Speedup, per_request_values

COLORS = {"spec": "tab:blue", "baseline": "tab:orange"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _by_variant(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.phase == "measure" and r.status == "completed":
            out.setdefault(r.variant, []).append(r)
    return out


def latency_cdfs(records: Sequence[RequestRecord], path: Path) -> None:
    plt = _plt()
    groups = _by_variant(records)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    panels = (("ttft_s", "Time to first token"), ("tpot_s", "Time per output token"),
              ("itl_s", "Inter-token latency (request mean)"), ("e2e_s", "End-to-end latency"))
    for ax, (metric, title) in zip(axes.flat, panels, strict=True):
        for variant, rs in groups.items():
            vals = sorted(v * 1e3 for v in per_request_values(rs, metric))
            if vals:
                ys = [(i + 1) / len(vals) for i in range(len(vals))]
                ax.step(vals, ys, where="post", color=COLORS.get(variant),
                        label=f"{variant} (n={len(vals)})")
        ax.set_title(title)
        ax.set_xlabel("milliseconds")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="lower right")
    fig.suptitle("Latency CDFs (completed requests)")
    _save(plt, fig, path)


def itl_histogram(records: Sequence[RequestRecord], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    groups = {v: [x * 1e3 for r in rs for x in r.itl_token_s]
              for v, rs in _by_variant(records).items()}
    every = [x for vals in groups.values() for x in vals]
    if every:
        lo, hi = min(every), max(every)
        bins = [lo + (hi - lo) * i / 50 for i in range(51)] if hi > lo else 10
        for variant, vals in groups.items():
            if vals:
                ax.hist(vals, bins=bins, alpha=0.55, color=COLORS.get(variant),
                        label=f"{variant} (n={len(vals)} tokens)")
    ax.set_title("Inter-token latency per token (chunk gap / tokens in the chunk)")
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("tokens")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend()
    _save(plt, fig, path)


def tokens_per_step(records: Sequence[RequestRecord], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    groups = _by_variant(records)
    width = 0.8 / max(len(groups), 1)
    ticks: set[int] = set()
    for j, (variant, rs) in enumerate(groups.items()):
        hist = Counter(k for r in rs if r.streaming for k in r.tokens_per_step)
        total = sum(hist.values())
        if total:
            ks = sorted(hist)
            ticks.update(ks)
            mean = sum(k * c for k, c in hist.items()) / total
            ax.bar([k + (j - (len(groups) - 1) / 2) * width for k in ks],
                   [hist[k] / total for k in ks], width=width, color=COLORS.get(variant),
                   label=f"{variant}: mean {mean:.2f} tokens/step ({total} steps)")
    ax.set_xticks(sorted(ticks))
    ax.set_title("Tokens per streamed step (chunk size)")
    ax.set_xlabel("tokens in one streamed response")
    ax.set_ylabel("fraction of steps")
    ax.grid(alpha=0.3, axis="y")
    if ax.has_data():
        ax.legend()
    _save(plt, fig, path)


def speedup_bars(speedups: dict[str, Speedup], path: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5))
    lat = [m for m in ("ttft_s", "tpot_s", "itl_s", "e2e_s") if m in speedups]
    xs = range(len(lat))
    ax1.bar([x - 0.2 for x in xs], [speedups[m].spec_mean * 1e3 for m in lat], 0.4,
            color=COLORS["spec"], label="spec")
    ax1.bar([x + 0.2 for x in xs], [speedups[m].baseline_mean * 1e3 for m in lat], 0.4,
            color=COLORS["baseline"], label="baseline")
    ax1.set_xticks(list(xs), [m.removesuffix("_s").upper() for m in lat])
    ax1.set_yscale("log")
    ax1.set_ylabel("mean latency (ms, log scale)")
    ax1.set_title("Mean latency: spec vs baseline")
    ax1.legend()
    names = list(speedups)
    pts = [speedups[m].speedup for m in names]
    err = [[p - speedups[m].ci_low for m, p in zip(names, pts, strict=True)],
           [speedups[m].ci_high - p for m, p in zip(names, pts, strict=True)]]
    ax2.bar(range(len(names)), pts, yerr=err, capsize=6, color="tab:green")
    ax2.axhline(1.0, color="black", lw=1, ls="--")
    ax2.set_xticks(range(len(names)), [m.removesuffix("_s") for m in names], rotation=20)
    ax2.set_ylabel("speedup (x, >1 = speculation better)")
    ax2.set_title("Speedup with bootstrap 95% CI")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
    _save(plt, fig, path)


def category_bars(cats: dict[str, Any], path: Path) -> None:
    """tau per category and variant (left) and, with a baseline, the per-user tok/s speedup per
    category with its bootstrap 95% CI (right)."""
    plt = _plt()
    names = list(cats)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    variants = sorted({v for c in cats.values() for v in c["variants"]}, key=lambda v: v != "spec")
    width = 0.8 / max(len(variants), 1)
    for j, v in enumerate(variants):
        taus = [(cats[c]["variants"].get(v) or {}).get("tau") or 0.0 for c in names]
        ax1.bar([i + (j - (len(variants) - 1) / 2) * width for i in range(len(names))], taus,
                width, color=COLORS.get(v), label=v)
    ax1.set_xticks(range(len(names)), names, rotation=15)
    ax1.set_ylabel("tau (tokens per step)")
    ax1.set_title("tau by category")
    ax1.legend()
    sp = [cats[c]["speedup"].get("per_user_tok_s") for c in names]
    pts = [s["speedup"] if s else float("nan") for s in sp]
    err = [[p - s["ci_low"] if s else 0.0 for p, s in zip(pts, sp, strict=True)],
           [s["ci_high"] - p if s else 0.0 for p, s in zip(pts, sp, strict=True)]]
    ax2.bar(range(len(names)), pts, yerr=err, capsize=6, color="tab:green")
    ax2.axhline(1.0, color="black", lw=1, ls="--")
    ax2.set_xticks(range(len(names)), names, rotation=15)
    ax2.set_ylabel("per-user tok/s speedup (x)")
    ax2.set_title("speedup by category (95% CI)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
    _save(plt, fig, path)


def write_plots(records: Sequence[RequestRecord], speedups: dict[str, Speedup],
                out: Path, categories: dict[str, Any] | None = None) -> list[str]:
    """Write every plot that has data into ``out``; return their file names."""
    names = ["latency_cdf.png", "itl_histogram.png", "tokens_per_step.png"]
    latency_cdfs(records, out / names[0])
    itl_histogram(records, out / names[1])
    tokens_per_step(records, out / names[2])
    if speedups:
        names.append("speedup.png")
        speedup_bars(speedups, out / names[3])
    if categories:
        names.append("category.png")
        category_bars(categories, out / "category.png")
    return names


def sweep_plots(summary: dict[str, Any], out: Path) -> list[str]:
    """``sweep_throughput.png`` (output tok/s against per-user tok/s, one curve per variant,
    points labelled by concurrency) and ``sweep_speedup.png`` (speedups against concurrency,
    the crossover marked); the file names."""
    plt = _plt()
    levels = summary["levels"]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for v in ("spec", "baseline"):
        xs = [lv[v]["per_user_tok_s_mean"] or 0.0 for lv in levels]
        ys = [lv[v]["output_token_throughput_tok_s"] or 0.0 for lv in levels]
        ax.plot(xs, ys, "o-", color=COLORS[v], label=v)
        for lv, x, y in zip(levels, xs, ys, strict=True):
            ax.annotate(f"c={lv['concurrency']}", (x, y), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
    ax.set_xlabel("per-user tok/s (mean)")
    ax.set_ylabel("output tok/s")
    ax.set_title("throughput against per-user speed")
    ax.legend()
    _save(plt, fig, out / "sweep_throughput.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    cs = [lv["concurrency"] for lv in levels]
    sp = [lv["per_user_speedup"]["speedup"] if lv["per_user_speedup"] else float("nan")
          for lv in levels]
    lo = [s - lv["per_user_speedup"]["ci_low"] if lv["per_user_speedup"] else 0.0
          for s, lv in zip(sp, levels, strict=True)]
    hi = [lv["per_user_speedup"]["ci_high"] - s if lv["per_user_speedup"] else 0.0
          for s, lv in zip(sp, levels, strict=True)]
    ax.errorbar(cs, sp, yerr=[lo, hi], fmt="o-", capsize=3, label="per-user tok/s speedup")
    ax.plot(cs, [lv["output_throughput_ratio"] or float("nan") for lv in levels], "s--",
            label="output tok/s ratio")
    ax.axhline(1.0, color="grey", lw=1)
    for key, style in (("crossover_per_user", "r:"), ("crossover_output_throughput", "m:")):
        if summary.get(key) is not None:
            ax.axvline(summary[key], color=style[0], ls=":", label=f"{key.split('_', 1)[1]}"
                       f" crossover (c={summary[key]})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("spec / baseline")
    ax.legend(fontsize=8)
    _save(plt, fig, out / "sweep_speedup.png")
    return ["sweep_throughput.png", "sweep_speedup.png"]


def context_plots(summary: dict[str, Any], out: Path) -> list[str]:
    """``sweep_context.png``: against input length, one line per concurrency, the measured step
    cost of both variants (spec solid: a verify step with its proposal; baseline dashed: a decode
    step), tau, and the per-user tok/s speedup; the file names."""
    plt = _plt()
    rows = summary["levels"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4.2))
    for c in sorted({r["concurrency"] for r in rows}):
        mine = sorted((r for r in rows if r["concurrency"] == c), key=lambda r: r["input_length"])
        xs = [r["input_length"] for r in mine]
        line = a1.plot(xs, [r["spec"]["step_ms"] or float("nan") for r in mine], "o-",
                       label=f"c={c} spec")[0]
        a1.plot(xs, [r["baseline"]["step_ms"] or float("nan") for r in mine], "s--",
                color=line.get_color(), label=f"c={c} baseline")
        a2.plot(xs, [r["spec"]["tau"] or float("nan") for r in mine], "o-", label=f"c={c}")
        a3.plot(xs, [(r["per_user_speedup"] or {}).get("speedup", float("nan")) for r in mine],
                "o-", label=f"c={c}")
    a3.axhline(1.0, color="grey", lw=1)
    for ax, title, ylabel in ((a1, "step cost against context", "ms per step"),
                              (a2, "tau against context", "tokens per verify step"),
                              (a3, "speedup against context", "per-user tok/s spec / baseline")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input tokens")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, out / "sweep_context.png")
    return ["sweep_context.png"]
