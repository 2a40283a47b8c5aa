"""The ``specserve predict`` flow: decode roofline and speculative speedup for a model and GPU.

:func:`predict` takes a :class:`PredictConfig` (one field per CLI option, same names and
defaults), reads ``config.json`` / a ``specserve bench`` ``summary.json``, takes ``T(n)`` from the
roofline of :mod:`specserve.spec.predictor` or, with ``measure``, from timing the reference
decoder's forward on this machine (:mod:`specserve.runtime.timing`; torch is imported only
then), and returns the JSON-ready report ``specserve predict`` prints. The math is
:mod:`specserve.spec.predictor`. Bad input raises :class:`SpecserveError` naming
the option (``--rates``, ``--summary``, ...) or the file.

Context length (verification cost grows with context,
e.g. one verify step at 5.2x a decode step at 16k in kekzl/imp #964): ``kv_len`` is the context
each step attends over, and ``T(n)`` depends on it through the KV bytes read (roofline) or the
attention of the timed forward (``measure``). ``context_lengths`` predicts T(1), T(verify), their
ratio and the speedup at each context; ``sweep`` (the served step against a measured ``bench
--sweep --input-lengths`` summary, cell by cell) is :mod:`specserve.predict_sweep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.config import read_json
from specserve.errors import SpecserveError
from specserve.runtime.timing import STATS, measure_step_times
from specserve.spec import predictor as P

PROPOSERS = ("medusa", "draft", "ngram")


@dataclass(frozen=True)
class PredictConfig:
    """Inputs of :func:`predict`; field ``x_y`` is the CLI option ``--x-y``."""

    params: float | None = None  # parameter count (or config)
    config: str | None = None  # HF config.json or its directory
    dtype: str = "fp16"  # weight dtype, a key of P.DTYPE_BYTES
    kv_dtype: str | None = None  # KV-cache dtype [dtype; fp16 for fp8 weights]
    gpu: str = "h100-sxm"  # a key of P.GPUS
    bandwidth: float | None = None  # override: HBM TB/s
    flops: float | None = None  # override: dense TFLOP/s
    tp: int = 1
    batch: int = 1
    kv_len: int = 0  # cached tokens per sequence
    proposer: str = "medusa"  # one of PROPOSERS
    medusa_heads: int = 4
    medusa_dir: str | None = None  # heads timed with measure
    draft_params: float | None = None
    draft_config: str | None = None
    draft_cost: float | None = None  # propose cost as a fraction of T(1)
    draft_len: int | None = None  # K (chain) or tree depth
    max_draft_len: int = 16  # K sweep limit
    tree_nodes: int | None = None  # Medusa tree size (verify N + 1)
    alpha: float | None = None  # i.i.d. acceptance
    rates: str | None = None  # per-position acceptance, comma separated
    tau: float | None = None  # measured tokens per step at draft_len
    summary: str | None = None  # bench summary.json
    step_overhead_ms: str = "0"  # a number of ms, or "auto"
    measure: bool = False
    reps: int = 10
    stat: str = "min"  # a key of STATS
    threads: int = 1  # torch threads for measure
    schedule_batches: str | None = None  # "1,2,4,8,16": the best K at each batch -> a schedule
    context_lengths: str | None = None  # "128,512,2048": T(1), T(verify), speedup per context
    sweep: str | None = None  # a bench --sweep --input-lengths summary: verify cost per cell
    tolerance: float = 0.2  # sweep: the relative error a cell may have

    def __post_init__(self) -> None:
        for name, value, allowed in (("--dtype", self.dtype, P.DTYPE_BYTES),
                                     ("--gpu", P.gpu_name(self.gpu), P.GPUS),
                                     ("--proposer", self.proposer, PROPOSERS),
                                     ("--stat", self.stat, STATS)):
            if value not in allowed:
                raise SpecserveError(f"{name} {value!r}: expected one of {sorted(allowed)}")
        if self.kv_dtype is not None and self.kv_dtype not in P.DTYPE_BYTES:
            raise SpecserveError(f"--kv-dtype {self.kv_dtype!r}: expected one of "
                                 f"{sorted(P.DTYPE_BYTES)}")


def config_path(path: str) -> Path:
    """``path``, or ``path/config.json`` when it is a directory."""
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def model_shape(params: float | None, config: str | None) -> tuple[P.ModelShape, str]:
    """The model's shape from a parameter count or an HF ``config.json``, and its source."""
    if (params is None) == (config is None):
        raise SpecserveError("give exactly one of --params or --config")
    if params is not None:
        if params <= 0:
            raise SpecserveError(f"--params {params}: must be > 0")
        return P.ModelShape(params), "--params"
    path = config_path(str(config))
    return P.shape_from_hf_config(read_json(path), str(path)), str(path)


def acceptance_from(alpha: float | None, rates: str | None, tau: float | None, k: int | None,
                    summary: Any, where: str | None) -> P.Acceptance | None:
    """At most one of ``alpha``, ``rates`` (``"0.7,0.5"``), ``tau`` (at draft length ``k``)
    or a parsed bench ``summary`` (its per_position_acceptance); None when none is given."""
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
        return P.acceptance_from_summary(summary, str(where))
    return None


def hardware(gpu: str, dtype: str, tp: int, bandwidth: float | None,
             flops: float | None) -> tuple[P.Hardware, str]:
    """The GPU's roofline figures for ``dtype`` under TP ``tp`` (TB/s, TFLOP/s overrides)."""
    if tp < 1:
        raise SpecserveError(f"--tp {tp}: must be >= 1")
    spec = P.GPUS[P.gpu_name(gpu)]
    hw = P.hardware_for(spec, dtype, tp)
    if bandwidth is not None or flops is not None:
        hw = P.Hardware(bandwidth * 1e12 if bandwidth else hw.bandwidth_bytes_per_s,
                        flops * 1e12 if flops else hw.peak_flops, tp, f"{gpu} (overridden)")
        return hw, "--bandwidth/--flops"
    return hw, spec.source


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


def _proposer_roofline(cfg: PredictConfig, work: P.Workload, hw: P.Hardware,
                       t1: float) -> tuple[P.Proposer, str]:
    """Propose cost from ``draft_cost`` (c * T(1)) or the roofline of the draft / heads."""
    kind = cfg.proposer
    if cfg.draft_cost is not None:
        return P.Proposer(kind, cfg.draft_cost * t1), f"--draft-cost {cfg.draft_cost}"
    if kind == "ngram":
        return P.Proposer("ngram"), "free"
    if kind == "draft":
        if cfg.draft_params is None and cfg.draft_config is None:
            raise SpecserveError("--proposer draft needs --draft-params, --draft-config or "
                                 "--draft-cost")
        shape, src = model_shape(cfg.draft_params, cfg.draft_config)
        dwork = P.Workload(shape, work.weight_bytes_per_param, work.kv_bytes_per_element,
                           work.batch, work.kv_len)
        label = f"roofline of a {shape.params / 1e9:.3g}B draft ({src.replace('--', '--draft-')})"
        return P.Proposer("draft", P.step_cost(dwork, hw, 1).time_s), label
    s = work.shape
    if s.hidden_size is None or s.vocab_size is None:
        return P.Proposer("medusa", 0.0), "0 (heads' size unknown without --config)"
    heads = P.medusa_head_params(cfg.medusa_heads, s.hidden_size, s.vocab_size)
    hwork = P.Workload(P.ModelShape(heads), work.weight_bytes_per_param, batch=work.batch)
    return (P.Proposer("medusa", P.step_cost(hwork, hw, 1).time_s),
            f"roofline of {cfg.medusa_heads} Medusa heads ({heads / 1e6:.1f}M params)")


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


def predict(cfg: PredictConfig) -> dict[str, Any]:
    """Everything ``specserve predict`` reports: ``model``, ``hardware``, ``decode``,
    ``step_ms`` (``{"n": T(n) ms}``), ``speculation`` (None without an acceptance) and, with a
    summary, ``measured_speedup``."""
    shape, model_src = model_shape(cfg.params, cfg.config)
    kv_elem = P.DTYPE_BYTES[cfg.kv_dtype or ("fp16" if cfg.dtype == "fp8" else cfg.dtype)]
    work = P.Workload(shape, P.DTYPE_BYTES[cfg.dtype], kv_elem, cfg.batch, cfg.kv_len)
    if cfg.batch < 1 or cfg.kv_len < 0:
        raise SpecserveError("--batch must be >= 1 and --kv-len >= 0")
    summary = read_json(Path(cfg.summary)) if cfg.summary else None
    acc = acceptance_from(cfg.alpha, cfg.rates, cfg.tau, cfg.draft_len, summary, cfg.summary)
    draft_len = cfg.draft_len
    if cfg.tree_nodes is not None and acc is not None and draft_len is None:
        draft_len = max(acc.draft_lengths(cfg.max_draft_len))  # tree depth
    ns = P.needed_step_sizes(acc, draft_len, cfg.tree_nodes, cfg.max_draft_len)
    result: dict[str, Any] = {"model": {
        "source": model_src, "params": shape.params, "dtype": cfg.dtype,
        "weight_bytes": work.weight_bytes, "kv_bytes_per_token": work.kv_bytes_per_token}}
    if cfg.measure:
        if cfg.config is None:
            raise SpecserveError("--measure needs --config DIR (a checkpoint with weights)")
        mdir = config_path(cfg.config).parent
        m = measure_step_times(mdir, ns, batch=cfg.batch, kv_len=cfg.kv_len, reps=cfg.reps,
                               stat=cfg.stat, threads=cfg.threads,
                               draft_dir=config_path(cfg.draft_config).parent
                               if cfg.draft_config else None,
                               medusa_dir=Path(cfg.medusa_dir) if cfg.medusa_dir else None)
        times = m["step_s"]
        proposer, prop_src = _measured_proposer(cfg.proposer, m, times[1], cfg.draft_cost)
        result["hardware"] = {"step_times": "measured", "model_dir": str(mdir), "reps": cfg.reps,
                              "stat": cfg.stat, "threads": cfg.threads}
        result["decode"] = {"t1_ms": times[1] * 1e3}
    else:
        hw, hw_src = hardware(cfg.gpu, cfg.dtype, cfg.tp, cfg.bandwidth, cfg.flops)
        times = P.roofline_step_times(work, hw, ns)
        proposer, prop_src = _proposer_roofline(cfg, work, hw, times[1])
        one = P.step_cost(work, hw, 1)
        result["hardware"] = {"step_times": "roofline", "gpu": hw.name, "tp": hw.tp_size,
                              "bandwidth_tb_s": hw.bandwidth_bytes_per_s / 1e12,
                              "peak_tflops": hw.peak_flops / 1e12, "source": hw_src}
        result["decode"] = {"t1_ms": one.time_s * 1e3, "bound": one.bound,
                            "bytes_per_gpu": one.bytes_read,
                            "verify_free_tokens": P.free_verify_tokens(work, hw)}
    result["decode"].update(batch=cfg.batch, kv_len=cfg.kv_len,
                            tokens_per_s_ceiling=cfg.batch / times[1],
                            per_sequence_tokens_per_s=1.0 / times[1])
    result["step_ms"] = {str(n): t * 1e3 for n, t in sorted(times.items())}
    result["speculation"] = None if acc is None else _speculation(
        cfg, acc, draft_len, proposer, prop_src, times, summary)
    if summary is not None:
        result["measured_speedup"] = P.measured_speedups(summary)
    if cfg.schedule_batches:
        result["schedule"] = predict_schedule(cfg)
    if cfg.context_lengths:
        result["context"] = predict_contexts(cfg)
    return result


def _int_list(text: str, option: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as e:
        raise SpecserveError(f"{option} {text!r}: expected token counts like 128,512,2048") from e
    if not vals or vals[0] < 0:
        raise SpecserveError(f"{option} {text!r}: token counts >= 0")
    return vals


def predict_contexts(cfg: PredictConfig) -> list[dict[str, Any]]:
    """:func:`predict` at each context of ``cfg.context_lengths`` (``kv_len`` = that context):
    T(1), the verify step of the chosen (else best) draft length, their ratio and the speedup."""
    from dataclasses import replace

    rows = []
    for n in _int_list(cfg.context_lengths or "", "--context-lengths"):
        r = predict(replace(cfg, kv_len=n, context_lengths=None, schedule_batches=None))
        row: dict[str, Any] = {"context": n, "t1_ms": r["decode"]["t1_ms"]}
        spec = r["speculation"]
        if spec is not None:
            p = spec["chosen"] or spec["best"]
            row.update(k=p["k"], verify_ms=p["verify_ms"], speedup=p["speedup"],
                       verify_cost_ratio=p["verify_ms"] / row["t1_ms"])
        rows.append(row)
    return rows


def predict_schedule(cfg: PredictConfig) -> dict[str, Any]:
    """:func:`predict` at each batch of ``cfg.schedule_batches`` (measured or roofline T(n, b),
    the same acceptance): the best draft length per batch, 0 where no K speeds up, as a
    load-aware schedule (:class:`specserve.spec.schedule.DraftSchedule`, lower bounds)."""
    from dataclasses import replace

    from specserve.spec.schedule import DraftSchedule

    try:
        batches = sorted({int(b) for b in (cfg.schedule_batches or "").split(",") if b.strip()})
    except ValueError as e:
        raise SpecserveError(f"--schedule-batches {cfg.schedule_batches!r}: expected batch "
                             "sizes like 1,2,4,8,16") from e
    if not batches or batches[0] < 1:
        raise SpecserveError(f"--schedule-batches {cfg.schedule_batches!r}: batch sizes >= 1")
    levels = []
    for b in batches:
        r = predict(replace(cfg, batch=b, schedule_batches=None))
        if r["speculation"] is None:
            raise SpecserveError("--schedule-batches needs an acceptance (--alpha, --rates, "
                                 "--tau with --draft-len, or --summary)")
        best = r["speculation"]["best"]
        k = int(best["k"]) if best["speedup"] > 1.0 else 0
        levels.append({"batch": b, "k": k, "speedup": best["speedup"],
                       "t1_ms": r["decode"]["t1_ms"]})
    pts: list[tuple[int, int]] = []
    for i, lv in enumerate(levels):
        if not pts or pts[-1][1] != lv["k"]:
            pts.append((1 if i == 0 else lv["batch"], lv["k"]))
    return {"levels": levels, "schedule": DraftSchedule(tuple(pts)).text()}


def _speculation(cfg: PredictConfig, acc: P.Acceptance, draft_len: int | None,
                 proposer: P.Proposer, prop_src: str, times: dict[int, float],
                 summary: Any) -> dict[str, Any]:
    overhead, overhead_src = step_overhead_s(cfg.step_overhead_ms, summary, times[1])
    pred = P.predict_speedup(acc, proposer, times, batch=cfg.batch, max_k=cfg.max_draft_len,
                             k=draft_len, tree_nodes=cfg.tree_nodes, overhead_s=overhead)
    return {
        "proposer": cfg.proposer, "propose_cost": prop_src, "step_overhead": overhead_src,
        "acceptance": {"alpha": acc.alpha, "rates": list(acc.rates) if acc.rates else None,
                       "tau": acc.tau},
        "tree_nodes": cfg.tree_nodes,
        "points": [p.to_dict() for p in pred.points],
        "best": pred.best.to_dict(),
        "chosen": pred.chosen.to_dict() if pred.chosen else None,
    }
