"""``specserve tune-schedule``: a load-aware draft schedule from ``bench --sweep`` results.

Parses the options into a :class:`specserve.tune_schedule.TuneScheduleConfig`, calls
:func:`specserve.tune_schedule.tune_schedule` and prints the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit

EXAMPLES = """
\b
Examples:
  # two sweeps of the same model, engines drafting 4 and 2 tokens
  specserve bench --url 127.0.0.1:8001 --baseline-model ensemble_baseline \\
      --sweep 1,2,4,8,16 --out reports/sweep-k4
  specserve tune-schedule --from 4=reports/sweep-k4 --from 2=reports/sweep-k2 \\
      --out schedule.json
  specserve build --model M --draft D --draft-len-schedule "$(jq -r .schedule schedule.json)" \\
      --backend torch --out engines/scheduled

At each swept concurrency the fastest option by output tok/s wins (no speculation included).
Prints the schedule for `specserve build --draft-len-schedule`, TensorRT-LLM's PyTorch route
(1.2 lower-bound keys, and the upper-bound form of later releases) and vLLM's single
num_speculative_tokens, and flags fixed budgets slower than no speculation.
"""


def _text(r: dict[str, Any]) -> str:
    ctx = "context" in r
    lines = [("| input tokens " if ctx else "") + "| concurrency | best | output tok/s by "
             "budget (0 = none) |", "|---" * (3 + ctx) + "|"]
    for lv in r["levels"]:
        opts = ", ".join(f"{k}: {v:.1f}" for k, v in lv["output_tok_s"].items())
        lines.append((f"| {lv['input_length']} " if ctx else "")
                     + f"| {lv['concurrency']} | {lv['best'] or 'off'} | {opts} |")
    if ctx:
        lines += ["", "schedule per input length: " + "; ".join(
            f"{n}: {f['schedule']}" for n, f in r["by_context"].items()),
            f"deploying the {r['context']['input_length']}-token schedule; "
            f"{r['context']['caveat']}"]
    t = r["trtllm_pytorch"]
    lines += ["", f"specserve build {r['build_option']}",
              f"TensorRT-LLM 1.2 speculative_config: max_draft_len {t['1.2']['max_draft_len']}, "
              f"draft_len_schedule {t['1.2']['draft_len_schedule']} ({t['1.2']['note']})",
              f"TensorRT-LLM later: draft_len_schedule {t['later']['draft_len_schedule']} "
              f"({t['later']['note']})", f"vLLM: {r['vllm']}",
              f"vLLM 0.32 speculative_config: {json.dumps(r['vllm_config'])}",
              "SGLang (one static setting): " + ", ".join(
                  f"c={c}: {v}" for c, v in r["sglang"].items())]
    lines += [f"WARNING: {f}" for f in r["flags"]]
    if r["files"]:
        lines.append("wrote " + ", ".join(r["files"]))
    return "\n".join(lines)


@click.command("tune-schedule", epilog=EXAMPLES,
               short_help="Load-aware draft schedule from measured sweeps.")
@click.option("--from", "sources", multiple=True, required=True, metavar="K=SWEEP",
              help="A sweep's draft budget and its folder or summary.json (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the report (JSON) here.")
@click.option("--context", type=click.IntRange(1), default=None, metavar="TOKENS",
              help="Sweeps with --input-lengths: the input length the deployment expects "
                   "(its schedule is the smallest measured length at or above it; default the "
                   "longest).")
@FORMAT_OPTION
def command(sources: tuple[str, ...], out: str | None, context: int | None, fmt: str) -> None:
    """Choose the draft budget per concurrency from `specserve bench --sweep` summaries."""
    from specserve.tune_schedule import TuneScheduleConfig, parse_source, tune_schedule

    cfg = TuneScheduleConfig(tuple(parse_source(s) for s in sources),
                             Path(out) if out else None, context)
    emit(tune_schedule(cfg), fmt, _text)
