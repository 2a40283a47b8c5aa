"""``specserve demo-model``: build the embedded demo checkpoint (tokenizer, target, draft, Medusa
heads, EAGLE-3 head, eval.json) from the Python standard library, offline, on CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from specserve.cli._options import TRAIN_DTYPE_OPTION
from specserve.cli._output import FORMAT_OPTION, emit
from specserve.config import read_json

PHASES = ("data", "target", "distill", "draft", "medusa", "eagle3", "eval", "decoder-eval",
          "total")
METHODS = ("medusa", "medusa_tuned", "draft", "eagle3", "ngram")


def _summary(data: dict[str, Any]) -> str:
    ev = data.get("eval", {})
    med, dr = ev.get("medusa", {}), ev.get("draft", {})
    lines = [f"{'reused' if data.get('reused') else 'built'}: {data['out']}"]
    if med:
        acc = ", ".join(f"{a:.2f}" for a in med.get("top1_accuracy", []))
        lines.append(f"medusa  top-1 per head [{acc}]  tau {_tau(med)} ({med.get('tree')})")
    if dr:
        lines.append(f"draft   greedy agreement {dr.get('greedy_agreement')}  tau {_tau(dr)}"
                     f" (K={dr.get('k')})")
    measured = [m for m in METHODS if "tokens_per_s" in ev.get(m, {})]
    if measured:
        lines.append(f"decoder T=0, K=4 (plain {ev.get('baseline_tokens_per_s', 0):.0f} tok/s): "
                     + "  ".join(f"{m} tau {ev[m]['tau']:.2f} {ev[m]['tokens_per_s']:.0f} tok/s"
                                 for m in measured))
    if ev.get("fastest_method"):
        lines.append(f"fastest {ev['fastest_method']} (measured; what `make engine` builds)")
    if ev.get("dtype"):
        lines.append(f"dtype   {ev['dtype']['dtype']} ({ev['dtype']['reason']})")
    times = ev.get("timings_s", {})
    if times:
        order = [p for p in PHASES if p in times] + sorted(set(times) - set(PHASES))
        lines.append("time    " + "  ".join(f"{p} {times[p]:.0f}s" for p in order))
    return "\n".join(lines)


def _tau(section: dict[str, Any]) -> str:
    if "tau" in section:
        return f"{section['tau']:.2f} (decoder)"
    return f"{section.get('tau_replay', float('nan')):.2f} (replay)"


@click.command("demo-model",
               short_help="Build the demo target, draft, Medusa and EAGLE-3 heads on CPU.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("checkpoints/demo"),
              show_default=True,
              help="Output directory (tokenizer/, target/, draft/, medusa/, eagle3/).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for everything.")
@click.option("--minutes", type=float, default=5.0, show_default=True,
              help="Training budget; step counts scale with it, the same on every CPU "
                   "(calibrated on 2 cores in the dtype --dtype auto picks).")
@click.option("--threads", type=click.IntRange(1, 256), default=2, show_default=True,
              help="torch CPU threads (part of the result's reproducibility).")
@TRAIN_DTYPE_OPTION
@click.option("--force", is_flag=True, help="Rebuild even if OUT already holds a checkpoint.")
@FORMAT_OPTION
def command(out: Path, seed: int, minutes: float, threads: int, dtype: str, force: bool,
            fmt: str) -> None:
    """Train a small Llama code model on the standard library's .py files, a distilled draft on
    the same tokenizer, Medusa-1 heads and an EAGLE-3 head (self-distillation), then measure
    them and n-gram lookup on held-out files (tau and tokens/s; eval.json names the fastest).
    Deterministic for a seed and budget. An existing OUT/eval.json is reused.

    \b
    Example:
      specserve demo-model --out checkpoints/demo --seed 0 --minutes 5
    """
    if (out / "eval.json").is_file() and not force:
        emit({"out": str(out), "reused": True,
              "eval": read_json(out / "eval.json")}, fmt, _summary)
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared CPUs: no spinning threads
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from specserve.train.demo import DemoConfig, build_demo
    from specserve.train.progress import RichReporter

    _quiet_transformers()
    cfg = DemoConfig.for_minutes(minutes, seed=seed, threads=threads, dtype=dtype)
    with RichReporter() as rep:
        result = build_demo(cfg, out, rep, force=force)
    emit({"out": str(result.out), "reused": False, "eval": result.eval}, fmt, _summary)


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
