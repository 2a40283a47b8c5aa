"""``specserve predict``: decode roofline and speculative-decoding speedup for a model and GPU.

Parses the options into a :class:`specserve.predict.PredictConfig`, calls
:func:`specserve.predict.predict` (reads ``config.json`` / a bench ``summary.json``, roofline or,
with ``--measure``, times measured here; math in :mod:`specserve.spec.predictor`) and prints the
report.
"""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._options import GPU_CHOICES
from specserve.cli._output import FORMAT_OPTION, emit
from specserve.predict import PROPOSERS, PredictConfig
from specserve.predict_sweep import predict_report
from specserve.runtime.timing import STATS
from specserve.spec.predictor import DTYPE_BYTES

EXAMPLES = """
\b
Examples:
  # memory-bound decode time of a 70B fp16 model on one H100 (41.8 ms per step)
  specserve predict --params 70e9 --dtype fp16 --gpu h100-sxm
\b
  # draft model of 1B params, i.i.d. acceptance 0.8, K = 5, plus the best K
  specserve predict --config llama70b/config.json --dtype fp8 --gpu h200 \\
      --proposer draft --draft-params 1e9 --alpha 0.8 --draft-len 5 --format json
\b
  # check a benchmark here: measured T(n) and the acceptance of a bench run
  specserve predict --config checkpoints/demo/target --measure --proposer medusa \\
      --medusa-dir checkpoints/demo/medusa --summary reports/x/summary.json --tree-nodes 63

Acceptance: --alpha (i.i.d.), --rates (P(draft position k accepted) over all steps, e.g.
0.7,0.5,0.3), --tau with --draft-len, or --summary (variants.spec.acceptance of a bench run:
per_position_acceptance and tau_server). --tree-nodes N: a Medusa tree verifies N + 1 tokens.
"""


def _text(r: dict[str, Any]) -> str:
    m, d, h = r["model"], r["decode"], r["hardware"]
    kv = m["kv_bytes_per_token"]
    lines = [f"model: {m['params'] / 1e9:.3g}B params, {m['dtype']} -> "
             f"{m['weight_bytes'] / 1e9:.4g} GB of weights"
             + (f", KV {kv / 1024:.4g} KiB/token" if kv else ""),
             (f"hardware: {h['gpu']} x{h['tp']} ({h['bandwidth_tb_s']:.4g} TB/s, "
              f"{h['peak_tflops']:.4g} TFLOP/s) [{h['source']}]" if h["step_times"] == "roofline"
              else f"step times measured on this machine ({h['model_dir']}, {h['stat']} of "
                   f"{h['reps']})"),
             f"decode step T(1): {d['t1_ms']:.4g} ms at batch {d['batch']}"
             + (f" ({d['bound']}-bound)" if "bound" in d else "")
             + f" -> ceiling {d['tokens_per_s_ceiling']:.4g} tok/s"]
    if "verify_free_tokens" in d:
        lines.append(f"verify stays memory-bound up to ~{d['verify_free_tokens']:.4g} tokens "
                     "per sequence per step")
    s = r["speculation"]
    if s is not None:
        lines.append(f"proposer: {s['proposer']} (propose cost: {s['propose_cost']}; step "
                     f"overhead {s['points'][0]['overhead_ms']:.4g} ms, {s['step_overhead']})")
        lines.append("   K  n_verify   tau   T_prop ms  T_ver ms  speedup")
        for p in s["points"]:
            lines.append(f"{p['k']:>4} {p['n_verify']:>8} {p['tau']:>6.3f} {p['propose_ms']:>10.4g}"
                         f" {p['verify_ms']:>9.4g} {p['speedup']:>8.3f}")
        b = s["best"]
        lines.append(f"best K = {b['k']}: speedup {b['speedup']:.3f}, tau {b['tau']:.3f}")
    for metric, v in (r.get("measured_speedup") or {}).items():
        lines.append(f"measured speedup ({metric}): {v:.3f}")
    if r.get("schedule"):
        sch = r["schedule"]
        lines.append("load-aware: " + ", ".join(
            f"batch {lv['batch']}: K={lv['k']} ({lv['speedup']:.3f}x)" for lv in sch["levels"]))
        lines.append(f"schedule: --draft-len-schedule {sch['schedule']}")
    for row in r.get("context") or []:
        lines.append(f"context {row['context']}: T(1) {row['t1_ms']:.4g} ms"
                     + (f", verify (K={row['k']}) {row['verify_ms']:.4g} ms = "
                        f"{row['verify_cost_ratio']:.3g}x, speedup {row['speedup']:.3f}"
                        if "k" in row else ""))
    vc = r.get("verify_check")
    if vc:
        lines.append(f"verify step per sweep cell (n = {vc['n_verify']}, {vc['step_times']} "
                     f"T(n); predicted / measured ms):")
        for a, b in zip(vc["per_cell"], vc["from_shortest"], strict=True):
            lines.append(f"  L={a['input_length']:>5} c={a['concurrency']:>3}: "
                         f"{a['predicted_step_ms']:.3g} / {a['measured_step_ms']:.3g} "
                         f"({a['relative_error']:+.0%}) = T {a['t_verify_ms']:.3g}"
                         + (f" + K T_d {a['propose_ms']:.3g}" if a.get("propose_ms") else "")
                         + f" + o {a['overhead_ms']:.3g} + prefill share "
                         f"{a['prefill_share_ms']:.3g}; "
                         f"o from the shortest length: {b['predicted_step_ms']:.3g} "
                         f"({b['relative_error']:+.0%})")
        lines += [f"OUTSIDE {vc['tolerance']:.0%}: {x}" for x in vc["outside"]]
    return "\n".join(lines)


@click.command("predict", epilog=EXAMPLES,
               short_help="Predict decode time and speculative speedup (roofline or measured).")
@click.option("--params", type=float, default=None, help="Parameter count, e.g. 70e9.")
@click.option("--config", default=None, help="HF config.json (or its directory).")
@click.option("--dtype", type=click.Choice(sorted(DTYPE_BYTES)), default="fp16",
              show_default=True, help="Weight dtype (bytes per weight).")
@click.option("--kv-dtype", type=click.Choice(sorted(DTYPE_BYTES)), default=None,
              help="KV-cache dtype [default: dtype; fp16 for fp8 weights].")
@click.option("--gpu", type=GPU_CHOICES, default="h100-sxm", show_default=True,
              help="h100 = h100-sxm, a100 = a100-80g.")
@click.option("--bandwidth", type=float, default=None, help="Override: HBM TB/s.")
@click.option("--flops", type=float, default=None, help="Override: dense TFLOP/s.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--kv-len", type=int, default=0, show_default=True,
              help="Cached tokens per sequence (KV bytes read each step).")
@click.option("--proposer", type=click.Choice(PROPOSERS), default="medusa",
              show_default=True)
@click.option("--medusa-heads", type=int, default=4, show_default=True)
@click.option("--medusa-dir", default=None, help="Medusa heads dir (timed with --measure).")
@click.option("--draft-params", type=float, default=None, help="Draft model parameter count.")
@click.option("--draft-config", default=None, help="Draft HF config.json (or its directory).")
@click.option("--draft-cost", type=float, default=None,
              help="Propose cost as a fraction c of T(1) (per draft step for --proposer draft).")
@click.option("--draft-len", type=int, default=None, help="K (chain) or tree depth.")
@click.option("--max-draft-len", type=int, default=16, show_default=True, help="K sweep limit.")
@click.option("--tree-nodes", type=int, default=None, help="Medusa tree size (verify N+1).")
@click.option("--alpha", type=float, default=None, help="i.i.d. acceptance probability.")
@click.option("--rates", default=None, help="Per-position acceptance, comma separated.")
@click.option("--tau", type=float, default=None, help="Measured tokens per step at --draft-len.")
@click.option("--summary", default=None, help="summary.json of specserve bench.")
@click.option("--step-overhead-ms", default="0", show_default=True,
              help="Fixed cost per decode step outside the model (serving path), added to "
                   "T(1) and to every speculative step; 'auto' = bench baseline TPOT - T(1).")
@click.option("--measure", is_flag=True, help="Time T(n) with the reference decoder here.")
@click.option("--reps", type=int, default=10, show_default=True, help="Timed calls per n.")
@click.option("--stat", type=click.Choice(sorted(STATS)), default="min", show_default=True,
              help="Statistic over the timed calls (min: least disturbed by other load).")
@click.option("--threads", type=int, default=1, show_default=True,
              help="torch threads for --measure (the Triton reference model's default is 1).")
@click.option("--schedule-batches", default=None, metavar="B1,B2,...",
              help="Also predict at each batch size and give the best K per batch as a "
                   "load-aware schedule (build --draft-len-schedule).")
@click.option("--context-lengths", default=None, metavar="L1,L2,...",
              help="Also predict at each context length (--kv-len = L): T(1), the verify "
                   "step, their ratio and the speedup.")
@click.option("--sweep", default=None, metavar="SUMMARY",
              help="A `bench --sweep --input-lengths` summary.json: predicted against "
                   "measured verify step per (length, concurrency) cell (needs --draft-len).")
@click.option("--tolerance", type=float, default=0.2, show_default=True,
              help="--sweep: the relative error a cell may have.")
@FORMAT_OPTION
def command(fmt: str, **opts: Any) -> None:
    """Predict decode time per step, tokens/s ceiling and speculative speedup."""
    emit(predict_report(PredictConfig(**opts)), fmt, _text)
