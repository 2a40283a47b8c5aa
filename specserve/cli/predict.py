"""``specserve predict``: decode roofline and speculative-decoding speedup for a model and GPU.

The math is :mod:`specserve.spec.predictor` (peers.md §3). This module parses the inputs, reads
``config.json`` / a ``specserve bench`` ``summary.json``, and with ``--measure`` times the
reference decoder's forward (:mod:`specserve.runtime.model`) on this machine instead of the
roofline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.config import read_json as _read_json
from specserve.errors import SpecserveError
from specserve.runtime.timing import STATS, measure_step_times
from specserve.spec import predictor as P

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


def _config_path(path: str) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def spec_acceptance(summary: Any, where: str) -> dict[str, Any]:
    """The acceptance dict of the speculative variant in a bench ``summary.json`` (or a plain
    ``AcceptanceStats.to_dict()``)."""
    if isinstance(summary, dict):
        variants = summary.get("variants")
        if isinstance(variants, dict) and isinstance(variants.get("spec"), dict):
            acc = variants["spec"].get("acceptance")
            if isinstance(acc, dict):
                return acc
        if isinstance(summary.get("acceptance"), dict):
            return dict(summary["acceptance"])
        if "accepted_nodes" in summary or "per_position_acceptance" in summary:
            return summary
    raise SpecserveError(f"{where}: no variants.spec.acceptance (not a specserve bench summary?)")


def _measured_speedups(summary: Any) -> dict[str, float]:
    sp = summary.get("speedup") if isinstance(summary, dict) else None
    if not isinstance(sp, dict):
        return {}
    return {m: float(v["speedup"]) for m, v in sp.items()
            if isinstance(v, dict) and isinstance(v.get("speedup"), int | float)}


def _acceptance(alpha: float | None, rates: str | None, tau: float | None, k: int | None,
                summary: Any, where: str | None) -> P.Acceptance | None:
    given = sum(x is not None for x in (alpha, rates, tau, summary))
    if given > 1:
        raise SpecserveError("give one of --alpha, --rates, --tau, --summary")
    if alpha is not None:
        P.expected_tokens(alpha, 0)  # range check
        return P.Acceptance(alpha=alpha)
    if rates is not None:
        try:
            vals = tuple(float(x) for x in rates.split(",") if x.strip())
        except ValueError as e:
            raise SpecserveError(f"--rates {rates!r}: expected numbers like 0.7,0.5,0.3") from e
        P.check_rates(vals)
        return P.Acceptance(rates=vals)
    if tau is not None:
        if k is None or tau < 1.0 or tau > k + 1:
            raise SpecserveError("--tau needs --draft-len K and 1 <= tau <= K + 1")
        return P.Acceptance(tau=tau, tau_k=k)
    if summary is not None:
        acc = spec_acceptance(summary, str(where))
        rates_s = tuple(float(x) for x in acc.get("per_position_acceptance") or ())
        if not rates_s:
            raise SpecserveError(f"{where}: the spec variant has no per_position_acceptance")
        P.check_rates(rates_s)
        return P.Acceptance(rates=rates_s)
    return None


def _shape(params: float | None, config: str | None) -> tuple[P.ModelShape, str]:
    if (params is None) == (config is None):
        raise SpecserveError("give exactly one of --params or --config")
    if params is not None:
        if params <= 0:
            raise SpecserveError(f"--params {params}: must be > 0")
        return P.ModelShape(params), "--params"
    path = _config_path(str(config))
    return P.shape_from_hf_config(_read_json(path), str(path)), str(path)


def _hardware(gpu: str, dtype: str, tp: int, bandwidth: float | None,
              flops: float | None) -> tuple[P.Hardware, str]:
    if tp < 1:
        raise SpecserveError(f"--tp {tp}: must be >= 1")
    spec = P.GPUS[gpu]
    hw = P.hardware_for(spec, dtype, tp)
    if bandwidth is not None or flops is not None:
        hw = P.Hardware(bandwidth * 1e12 if bandwidth else hw.bandwidth_bytes_per_s,
                        flops * 1e12 if flops else hw.peak_flops, tp, f"{gpu} (overridden)")
        return hw, "--bandwidth/--flops"
    return hw, spec.source


def _proposer_roofline(kind: str, work: P.Workload, hw: P.Hardware, t1: float,
                       opts: dict[str, Any]) -> tuple[P.Proposer, str]:
    """Propose cost from --draft-cost (c * T(1)) or the roofline of the draft / heads."""
    if opts["draft_cost"] is not None:
        return P.Proposer(kind, opts["draft_cost"] * t1), f"--draft-cost {opts['draft_cost']}"
    if kind == "ngram":
        return P.Proposer("ngram"), "free"
    if kind == "draft":
        if opts["draft_params"] is None and opts["draft_config"] is None:
            raise SpecserveError("--proposer draft needs --draft-params, --draft-config or "
                                 "--draft-cost")
        shape, src = _shape(opts["draft_params"], opts["draft_config"])
        dwork = P.Workload(shape, work.weight_bytes_per_param, work.kv_bytes_per_element,
                           work.batch, work.kv_len)
        label = f"roofline of a {shape.params / 1e9:.3g}B draft ({src.replace('--', '--draft-')})"
        return P.Proposer("draft", P.step_cost(dwork, hw, 1).time_s), label
    s = work.shape
    if s.hidden_size is None or s.vocab_size is None:
        return P.Proposer("medusa", 0.0), "0 (heads' size unknown without --config)"
    heads = P.medusa_head_params(opts["medusa_heads"], s.hidden_size, s.vocab_size)
    hwork = P.Workload(P.ModelShape(heads), work.weight_bytes_per_param, batch=work.batch)
    return (P.Proposer("medusa", P.step_cost(hwork, hw, 1).time_s),
            f"roofline of {opts['medusa_heads']} Medusa heads ({heads / 1e6:.1f}M params)")


def _needed_ns(acc: P.Acceptance | None, k: int | None, tree_nodes: int | None,
               max_k: int) -> list[int]:
    if acc is None:
        return [1]
    if tree_nodes is not None:
        return [1, tree_nodes + 1]
    ks = set(acc.draft_lengths(max_k)) | ({k} if k is not None else set())
    return sorted({1, *(kk + 1 for kk in ks)})


def _measured_proposer(kind: str, measured: dict[str, Any], t1: float,
                       draft_cost: float | None) -> tuple[P.Proposer, str]:
    if draft_cost is not None:
        return P.Proposer(kind, draft_cost * t1), f"--draft-cost {draft_cost}"
    if kind == "ngram":
        return P.Proposer("ngram"), "free"
    key, flag = ("draft_step_s", "--draft-config DIR") if kind == "draft" else (
        "heads_s", "--medusa-dir DIR")
    if measured[key] is None:
        raise SpecserveError(f"--measure --proposer {kind} needs {flag} or --draft-cost")
    return P.Proposer(kind, float(measured[key])), "measured"


def run_predict(o: dict[str, Any]) -> dict[str, Any]:
    """Everything ``specserve predict`` reports, from the parsed options ``o``."""
    shape, model_src = _shape(o["params"], o["config"])
    kv_elem = P.DTYPE_BYTES[o["kv_dtype"] or ("fp16" if o["dtype"] == "fp8" else o["dtype"])]
    work = P.Workload(shape, P.DTYPE_BYTES[o["dtype"]], kv_elem, o["batch"], o["kv_len"])
    if o["batch"] < 1 or o["kv_len"] < 0:
        raise SpecserveError("--batch must be >= 1 and --kv-len >= 0")
    summary = _read_json(Path(o["summary"])) if o["summary"] else None
    acc = _acceptance(o["alpha"], o["rates"], o["tau"], o["draft_len"], summary, o["summary"])
    if o["tree_nodes"] is not None and acc is not None and o["draft_len"] is None:
        o["draft_len"] = max(acc.draft_lengths(o["max_draft_len"]))  # tree depth
    ns = _needed_ns(acc, o["draft_len"], o["tree_nodes"], o["max_draft_len"])
    result: dict[str, Any] = {"model": {
        "source": model_src, "params": shape.params, "dtype": o["dtype"],
        "weight_bytes": work.weight_bytes, "kv_bytes_per_token": work.kv_bytes_per_token}}
    if o["measure"]:
        if o["config"] is None:
            raise SpecserveError("--measure needs --config DIR (a checkpoint with weights)")
        mdir = _config_path(o["config"]).parent
        m = measure_step_times(mdir, ns, batch=o["batch"], kv_len=o["kv_len"], reps=o["reps"],
                               stat=o["stat"], threads=o["threads"],
                               draft_dir=_config_path(o["draft_config"]).parent
                               if o["draft_config"] else None,
                               medusa_dir=Path(o["medusa_dir"]) if o["medusa_dir"] else None)
        times = m["step_s"]
        proposer, prop_src = _measured_proposer(o["proposer"], m, times[1], o["draft_cost"])
        result["hardware"] = {"step_times": "measured", "model_dir": str(mdir), "reps": o["reps"],
                              "stat": o["stat"], "threads": o["threads"]}
        result["decode"] = {"t1_ms": times[1] * 1e3}
    else:
        hw, hw_src = _hardware(o["gpu"], o["dtype"], o["tp"], o["bandwidth"], o["flops"])
        times = P.roofline_step_times(work, hw, ns)
        proposer, prop_src = _proposer_roofline(o["proposer"], work, hw, times[1], o)
        one = P.step_cost(work, hw, 1)
        result["hardware"] = {"step_times": "roofline", "gpu": hw.name, "tp": hw.tp_size,
                              "bandwidth_tb_s": hw.bandwidth_bytes_per_s / 1e12,
                              "peak_tflops": hw.peak_flops / 1e12, "source": hw_src}
        result["decode"] = {"t1_ms": one.time_s * 1e3, "bound": one.bound,
                            "bytes_per_gpu": one.bytes_read,
                            "verify_free_tokens": P.free_verify_tokens(work, hw)}
    result["decode"].update(batch=o["batch"], kv_len=o["kv_len"],
                            tokens_per_s_ceiling=o["batch"] / times[1],
                            per_sequence_tokens_per_s=1.0 / times[1])
    result["step_ms"] = {str(n): t * 1e3 for n, t in sorted(times.items())}
    result["speculation"] = None if acc is None else _speculation(acc, proposer, prop_src, times, o,
                                                                  summary)
    if summary is not None:
        result["measured_speedup"] = _measured_speedups(summary)
    return result


def step_overhead_s(arg: str, summary: Any, t1_s: float) -> tuple[float, str]:
    """``--step-overhead-ms``: a number, or ``auto`` = the bench baseline's mean TPOT minus
    T(1) (the serving path's fixed cost per decode step, floored at 0)."""
    if arg != "auto":
        try:
            value = float(arg)
        except ValueError as e:
            raise SpecserveError(f"--step-overhead-ms {arg!r}: a number of ms or 'auto'") from e
        if value < 0:
            raise SpecserveError(f"--step-overhead-ms {value}: must be >= 0")
        return value / 1e3, "--step-overhead-ms"
    try:
        tpot_ms = float(summary["variants"]["baseline"]["tpot_ms"]["mean"])
    except (TypeError, KeyError, ValueError) as e:
        raise SpecserveError("--step-overhead-ms auto needs --summary with a baseline variant "
                             "(variants.baseline.tpot_ms.mean)") from e
    return max(0.0, tpot_ms / 1e3 - t1_s), f"auto: baseline TPOT {tpot_ms:.4g} ms - T(1)"


def _speculation(acc: P.Acceptance, proposer: P.Proposer, prop_src: str,
                 times: dict[int, float], o: dict[str, Any], summary: Any) -> dict[str, Any]:
    overhead, overhead_src = step_overhead_s(o["step_overhead_ms"], summary, times[1])
    pred = P.predict_speedup(acc, proposer, times, batch=o["batch"], max_k=o["max_draft_len"],
                             k=o["draft_len"], tree_nodes=o["tree_nodes"], overhead_s=overhead)
    return {
        "proposer": o["proposer"], "propose_cost": prop_src, "step_overhead": overhead_src,
        "acceptance": {"alpha": acc.alpha, "rates": list(acc.rates) if acc.rates else None,
                       "tau": acc.tau},
        "tree_nodes": o["tree_nodes"],
        "points": [p.to_dict() for p in pred.points],
        "best": pred.best.to_dict(),
        "chosen": pred.chosen.to_dict() if pred.chosen else None,
    }


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
    return "\n".join(lines)


@click.command("predict", epilog=EXAMPLES,
               short_help="Predict decode time and speculative speedup (roofline or measured).")
@click.option("--params", type=float, default=None, help="Parameter count, e.g. 70e9.")
@click.option("--config", default=None, help="HF config.json (or its directory).")
@click.option("--dtype", type=click.Choice(sorted(P.DTYPE_BYTES)), default="fp16",
              show_default=True, help="Weight dtype (bytes per weight).")
@click.option("--kv-dtype", type=click.Choice(sorted(P.DTYPE_BYTES)), default=None,
              help="KV-cache dtype [default: dtype; fp16 for fp8 weights].")
@click.option("--gpu", type=click.Choice(sorted(P.GPUS)), default="h100-sxm", show_default=True)
@click.option("--bandwidth", type=float, default=None, help="Override: HBM TB/s.")
@click.option("--flops", type=float, default=None, help="Override: dense TFLOP/s.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--kv-len", type=int, default=0, show_default=True,
              help="Cached tokens per sequence (KV bytes read each step).")
@click.option("--proposer", type=click.Choice(["medusa", "draft", "ngram"]), default="medusa",
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
@FORMAT_OPTION
def command(fmt: str, **opts: Any) -> None:
    """Predict decode time per step, tokens/s ceiling and speculative speedup."""
    emit(run_predict(opts), fmt, _text)
