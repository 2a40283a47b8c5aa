"""``specserve predict --sweep``: the served step predicted against a measured ``specserve bench
--sweep --input-lengths`` summary, cell by cell.

The measured step is what a request sees, ``(E2E - TTFT) / steps``
(:func:`specserve.client.context.step_ms`), at concurrency ``c``, input length ``L`` and ``M``
new tokens. Its model, for a verify step of ``n`` tokens per row (``n = 1``: the baseline)::

    step(n) = T(n; c, ctx) + K * T_d(c, ctx) + o(c) + (c - 1) * P(L) / S

- ``T(n; c, ctx)``: one forward of ``n`` new tokens per row at batch ``c`` over
  ``ctx = L + M // 2`` cached tokens (the mean context over the answer). The context term: the
  forward is timed at the sweep's shortest and longest context and interpolated linearly in
  between (:class:`ContextFit`; attention reads every cached key, so its cost grows with
  ``ctx``). Without ``--measure``: the roofline at each context.
- ``K * T_d(c, ctx)``, the propose term of a draft model (``--proposer draft``): the draft runs
  K forwards per step, one after another (a catch-up of the pending token, then one per draft;
  ``runtime/proposers/draft.py``; Leviathan et al. 2023 §3.4 count the draft's cost as ``c``
  times a target forward, per draft),
  each a one-token forward at batch ``c`` over the same context with its LM head, timed here
  like the target's (the draft in its served decode layout, at the shortest and longest context,
  linear between) or, without ``--measure``, its roofline. 0 for n-gram (the lookup was measured
  at under 0.2 ms per step on the toy model) and for the baseline (``n = 1``); Medusa's one
  heads pass is not modelled per cell (0).
- With a draft model a newcomer's prompt is also fed through the draft (``admit``: one forward
  of ``L - 1`` tokens, not chunked), inside the running step too: the speculative step's
  prefill share is ``(c - 1) * (P(L) + P_d(L)) / S`` (``P_d`` timed here, or its roofline).
- ``o(c)``: the serving path's fixed cost per step outside the forward (Triton responses, the
  batcher's Python loop), the same for both variants: the cell's baseline step minus its own
  forward and its prefill share (:func:`baseline_overhead`).
- ``(c - 1) * P(L) / S``, the prefill share (:func:`prefill_share`): the in-flight batcher
  prefills a newcomer before the running rows' next token (``Scheduler.schedule``; a prompt over
  ``prefill_chunk`` tokens one chunk per step), so every running row waits for it (Sarathi-Serve's
  generation stalls, Agrawal et al. 2024). In a closed loop at concurrency ``c`` the other
  ``c - 1`` requests each start about once while one request decodes: ``c - 1`` prefills of
  ``P(L)`` spread over that request's
  ``S`` steps. ``S`` is about ``M - 1`` for the baseline and ``(M - 1) / tau`` with speculation,
  so a speculative step carries tau times the baseline's share: the term that makes the verify
  cost ratio grow with both concurrency and input length. ``P(L)`` is the prefill as the
  cell's baseline phase paid it (:func:`served_prefill`: its mean step minus its median step,
  times its steps, over ``c - 1``), or, without that, the prefill timed here
  (``prefill_chunk`` chunks at batch 1, as served; both are reported).

With the served ``P`` the prediction reads: the baseline's stall-free (median) step, plus the
verify forward's extra cost ``T(n) - T(1)``, plus the baseline's stall per step scaled by
``S_base / S_spec``.

Each cell is predicted twice: ``per_cell`` (``o`` from that cell's baseline) and
``from_shortest`` (``o`` from the shortest length's baseline at the same concurrency: how the step
grows with context, out of sample). Pure parts: :class:`ContextFit`, :func:`propose_s`,
:func:`prefill_share`, :func:`baseline_overhead`, :func:`cell_steps`, :func:`cell_prediction`;
the I/O is :func:`cell_times` (timing here or the roofline) and :func:`verify_check` (reads
the summary).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.config import read_json
from specserve.errors import SpecserveError
from specserve.predict import PredictConfig, config_path, hardware, model_shape, predict
from specserve.runtime.timing import measure_step_times
from specserve.spec import predictor as P

#: the served batcher's prompt tokens per prefill forward
#: (serving.engine_params.DEFAULT_PREFILL_CHUNK)
PREFILL_CHUNK = 256


@dataclass(frozen=True)
class ContextFit:
    """T at two contexts, linear in between and beyond (the attention / KV-read term)."""

    ctx_lo: int
    t_lo_s: float
    ctx_hi: int
    t_hi_s: float

    @property
    def per_token_s(self) -> float:
        """Seconds per cached token (the slope; 0 from a single context)."""
        span = self.ctx_hi - self.ctx_lo
        return (self.t_hi_s - self.t_lo_s) / span if span else 0.0

    def at(self, ctx: int) -> float:
        return self.t_lo_s + self.per_token_s * (ctx - self.ctx_lo)


def propose_s(proposer: str, k: int, draft_step_s: float) -> float:
    """Seconds the proposer adds to one verify step of ``k`` drafts: ``k`` sequential draft
    forwards of ``draft_step_s`` each for a draft model
    (:meth:`specserve.spec.predictor.Proposer.propose_s`); 0 for any other proposer."""
    return P.Proposer("draft", draft_step_s).propose_s(k) if proposer == "draft" else 0.0


def prefill_share(prefill_s: float, concurrency: int, steps: float) -> float:
    """Seconds per step a request waits for the other ``concurrency - 1`` requests' prefills
    of ``prefill_s`` each, spread over its ``steps`` steps."""
    return (concurrency - 1) * prefill_s / steps if steps > 0 else 0.0


def baseline_overhead(base_step_s: float, t1_s: float, prefill_s: float, concurrency: int,
                      base_steps: float) -> float:
    """``o``: the measured baseline step minus its forward ``T(1)`` and its prefill share,
    floored at 0."""
    return max(0.0, base_step_s - t1_s - prefill_share(prefill_s, concurrency, base_steps))


def cell_steps(cell: dict[str, Any], variant: str, max_tokens: int) -> float:
    """Steps per request after the first token: the cell's measured ``steps_mean``, else
    ``M - 1`` (baseline) or ``(M - 1) / tau`` (speculation)."""
    v = cell[variant]
    if v.get("steps_mean"):
        return float(v["steps_mean"])
    tau = float(v.get("tau") or 1.0) if variant == "spec" else 1.0
    return max(1.0, (max_tokens - 1) / tau)


def served_prefill(cell: dict[str, Any], max_tokens: int, timed_s: float) -> tuple[float, str]:
    """``P(L)`` as the cell's baseline phase paid it, and where it came from: the baseline's
    stall per step (mean step minus median step, ``step_ms_p50``) times its steps, shared by
    the other ``c - 1`` requests' prefills; else (``c`` = 1, or a summary without the median)
    the prefill timed here, ``timed_s``. On a machine shared with other jobs a prefill of
    30-120 ms of CPU is stretched (it cannot finish inside one scheduler slice, a 2 ms decode
    step can), so the served stall is the one to spread over the speculative steps."""
    c, base = int(cell["concurrency"]), cell["baseline"]
    if c < 2 or base.get("step_ms_p50") is None or base.get("step_ms") is None:
        return timed_s, "timed"
    stall_s = max(0.0, float(base["step_ms"]) - float(base["step_ms_p50"])) / 1e3
    return stall_s * cell_steps(cell, "baseline", max_tokens) / (c - 1), "served"


@dataclass(frozen=True)
class CellTimes:
    """What one cell's prediction needs from the target, in seconds."""

    t1_s: float        # T(1; c, ctx)
    t_verify_s: float  # T(n_verify; c, ctx)
    prefill_s: float   # P(L): one prompt's prefill at batch 1
    propose_s: float = 0.0  # K * T_d(c, ctx): the draft's forwards of one step (0: n-gram)
    draft_step_s: float = 0.0  # T_d(c, ctx): one draft forward
    draft_prefill_s: float = 0.0  # P_d(L): the draft's own prefill of a newcomer's prompt


def cell_prediction(cell: dict[str, Any], n_verify: int, times: CellTimes, max_tokens: int,
                    overhead_s: float | None = None) -> dict[str, Any]:
    """One sweep cell: the predicted speculative step ``T(n_verify) + K * T_d + o + prefill
    share`` against the measured one (``spec.step_ms``); ``o`` is ``overhead_s`` when given, else
    :func:`baseline_overhead` of this cell. Pure."""
    base, spec = cell["baseline"].get("step_ms"), cell["spec"].get("step_ms")
    if base is None or spec is None:
        raise SpecserveError(f"sweep cell c={cell.get('concurrency')} "
                             f"L={cell.get('input_length')}: no measured step_ms")
    c = int(cell["concurrency"])
    s_spec, s_base = cell_steps(cell, "spec", max_tokens), cell_steps(cell, "baseline",
                                                                       max_tokens)
    pre, src = served_prefill(cell, max_tokens, times.prefill_s)
    o = overhead_s if overhead_s is not None else baseline_overhead(
        base / 1e3, times.t1_s, pre, c, s_base)
    share = prefill_share(pre + times.draft_prefill_s, c, s_spec)
    pred = (times.t_verify_s + times.propose_s + o + share) * 1e3
    return {"input_length": cell["input_length"], "concurrency": c, "n_verify": n_verify,
            "t1_ms": times.t1_s * 1e3, "t_verify_ms": times.t_verify_s * 1e3,
            "draft_step_ms": times.draft_step_s * 1e3, "propose_ms": times.propose_s * 1e3,
            "prefill_timed_ms": times.prefill_s * 1e3, "prefill_ms": pre * 1e3,
            "prefill_source": src, "draft_prefill_ms": times.draft_prefill_s * 1e3,
            "steps_spec": s_spec, "steps_baseline": s_base,
            "overhead_ms": o * 1e3, "prefill_share_ms": share * 1e3,
            "predicted_step_ms": pred, "measured_step_ms": spec,
            "measured_baseline_step_ms": base, "relative_error": (pred - spec) / spec}


def _roofline_work(cfg: PredictConfig, batch: int, kv_len: int) -> P.Workload:
    shape, _ = model_shape(cfg.params, cfg.config)
    kv_elem = P.DTYPE_BYTES[cfg.kv_dtype or ("fp16" if cfg.dtype == "fp8" else cfg.dtype)]
    return P.Workload(shape, P.DTYPE_BYTES[cfg.dtype], kv_elem, batch, kv_len)


def _draft_work(cfg: PredictConfig, batch: int, kv_len: int) -> P.Workload:
    shape, _ = model_shape(cfg.draft_params, cfg.draft_config)
    kv_elem = P.DTYPE_BYTES[cfg.kv_dtype or ("fp16" if cfg.dtype == "fp8" else cfg.dtype)]
    return P.Workload(shape, P.DTYPE_BYTES[cfg.dtype], kv_elem, batch, kv_len)


def cell_times(cfg: PredictConfig, concurrencies: list[int], lengths: list[int], offset: int,
               n_verify: int) -> dict[tuple[int, int], CellTimes]:
    """:class:`CellTimes` of every (concurrency, length) cell at context ``length + offset``.
    ``cfg.measure``: the forwards (the target's, and with ``--proposer draft`` the draft's
    one-token forward) timed here at the shortest and longest context per concurrency
    (:class:`ContextFit` in between) and each length's prefill timed once; else the roofline
    of ``cfg``'s models at every cell."""
    ns = sorted({1, n_verify})
    k = n_verify - 1
    drafting = cfg.proposer == "draft"
    if drafting and cfg.draft_config is None and (cfg.measure or cfg.draft_params is None):
        raise SpecserveError("--sweep --proposer draft needs --draft-config DIR (with "
                             "--measure: the draft checkpoint, timed like the target)")
    out: dict[tuple[int, int], CellTimes] = {}
    if not cfg.measure:
        hw, _ = hardware(cfg.gpu, cfg.dtype, cfg.tp, cfg.bandwidth, cfg.flops)
        for n in lengths:
            pre = P.step_cost(_roofline_work(cfg, 1, n // 2), hw, n).time_s
            dpre = P.step_cost(_draft_work(cfg, 1, n // 2), hw, n).time_s if drafting else 0.0
            for c in concurrencies:
                t = P.roofline_step_times(_roofline_work(cfg, c, n + offset), hw, ns)
                td = P.step_cost(_draft_work(cfg, c, n + offset), hw, 1).time_s \
                    if drafting else 0.0
                out[(c, n)] = CellTimes(t[1], t[n_verify], pre,
                                        propose_s(cfg.proposer, k, td), td, dpre)
        return out
    if cfg.config is None:
        raise SpecserveError("--measure needs --config DIR (a checkpoint with weights)")
    mdir = config_path(cfg.config).parent
    ddir = config_path(cfg.draft_config).parent if drafting and cfg.draft_config else None
    ends = sorted({lengths[0] + offset, lengths[-1] + offset})
    prefill: dict[int, float] = {}
    dprefill: dict[int, float] = {n: 0.0 for n in lengths}
    if ddir is not None:  # the draft feeds a newcomer's prompt in one forward (admit)
        dprefill.update(measure_step_times(ddir, [1], batch=1, kv_len=1, reps=cfg.reps,
                                           stat=cfg.stat, threads=cfg.threads,
                                           prefill_chunk=max(lengths),
                                           prefill_lens=lengths)["prefill_s"])
    for i, c in enumerate(concurrencies):
        fits: dict[str, list[float]] = {key: [] for key in [*map(str, ns), "draft"]}
        for j, ctx in enumerate(ends):
            m = measure_step_times(mdir, ns, batch=c, kv_len=ctx, reps=cfg.reps, stat=cfg.stat,
                                   draft_dir=ddir, threads=cfg.threads,
                                   prefill_chunk=PREFILL_CHUNK,
                                   prefill_lens=lengths if i == j == 0 else ())
            prefill.update(m["prefill_s"])
            for n in ns:
                fits[str(n)].append(float(m["step_s"][n]))
            fits["draft"].append(float(m["draft_step_s"] or 0.0))
        fit = {key: ContextFit(ends[0], v[0], ends[-1], v[-1]) for key, v in fits.items()}
        for n in lengths:
            td = fit["draft"].at(n + offset)
            out[(c, n)] = CellTimes(fit["1"].at(n + offset), fit[str(n_verify)].at(n + offset),
                                    prefill[n], propose_s(cfg.proposer, k, td), td,
                                    dprefill[n])
    return out


def verify_check(cfg: PredictConfig) -> dict[str, Any]:
    """Each cell of the ``bench --sweep --input-lengths`` summary ``cfg.sweep`` predicted by
    :func:`cell_prediction` from :func:`cell_times` (``n_verify`` = ``cfg.draft_len + 1``;
    tree: ``tree_nodes + 1``), ``per_cell`` and ``from_shortest``; cells off by more than
    ``cfg.tolerance`` are listed in ``outside``."""
    data = read_json(Path(cfg.sweep or ""))
    cells = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(cells, list) or not cells or "input_length" not in cells[0]:
        raise SpecserveError(f"{cfg.sweep}: not a `specserve bench --sweep --input-lengths` "
                             "summary (no levels with input_length)")
    if cfg.draft_len is None and cfg.tree_nodes is None:
        raise SpecserveError("--sweep needs --draft-len K (or --tree-nodes N): the verify step "
                             "scores K + 1 tokens")
    n_verify = (cfg.tree_nodes + 1) if cfg.tree_nodes is not None else int(cfg.draft_len or 0) + 1
    max_tokens = int(data.get("config", {}).get("max_tokens", 0))
    half = max_tokens // 2
    concs = sorted({int(x["concurrency"]) for x in cells})
    lengths = sorted({int(x["input_length"]) for x in cells})
    times = cell_times(cfg, concs, lengths, half, n_verify)
    per_cell, from_short = [], []
    for cell in cells:
        c, n = int(cell["concurrency"]), int(cell["input_length"])
        per_cell.append(cell_prediction(cell, n_verify, times[(c, n)], max_tokens))
        ref = next(x for x in cells if int(x["concurrency"]) == c
                   and int(x["input_length"]) == lengths[0])
        ref_t = times[(c, lengths[0])]
        o = baseline_overhead(ref["baseline"]["step_ms"] / 1e3, ref_t.t1_s,
                              served_prefill(ref, max_tokens, ref_t.prefill_s)[0], c,
                              cell_steps(ref, "baseline", max_tokens))
        from_short.append(cell_prediction(cell, n_verify, times[(c, n)], max_tokens, o))
    return {"sweep": cfg.sweep, "n_verify": n_verify, "context_offset": half,
            "step_times": "measured" if cfg.measure else "roofline", "tolerance": cfg.tolerance,
            "context_fit": "measured at the shortest and longest context, linear between"
            if cfg.measure else "roofline at each context",
            "per_cell": per_cell, "from_shortest": from_short,
            "outside": [f"{m}: c={r['concurrency']} L={r['input_length']}: predicted "
                        f"{r['predicted_step_ms']:.3g} ms, measured {r['measured_step_ms']:.3g} "
                        f"ms ({r['relative_error']:+.0%})"
                        for m, rows in (("per_cell", per_cell), ("from_shortest", from_short))
                        for r in rows if abs(r["relative_error"]) > cfg.tolerance]}


def predict_report(cfg: PredictConfig) -> dict[str, Any]:
    """What ``specserve predict`` prints: :func:`specserve.predict.predict`, plus
    ``verify_check`` with ``cfg.sweep``."""
    result = predict(cfg)
    if cfg.sweep:
        result["verify_check"] = verify_check(cfg)
    return result
