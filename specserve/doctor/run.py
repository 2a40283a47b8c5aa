"""``specserve doctor``'s driver: resolve the inputs (directories, or an engine directory's
``build_config.json`` through :func:`specserve.engine_record.read_engine_record`), read each side
(:mod:`specserve.doctor.sides`), run the static checks (:mod:`specserve.doctor.checks`), the
memory budget (:mod:`specserve.doctor.memory`) and the acceptance probe
(:mod:`specserve.doctor.probe`), and return the report as plain data. With ``roofline``: this
machine's measured limits and the target's step against them (:mod:`specserve.doctor.roofline`),
alone when no proposer is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.doctor.checks import static_checks, weight_dtype
from specserve.doctor.findings import Finding, error, exit_code, info, sort_findings
from specserve.doctor.memory import (
    GIB,
    GPU_MEMORY_BYTES,
    Footprint,
    MemoryPlan,
    check_memory,
    dtype_bytes,
    footprint,
)
from specserve.doctor.probe import ProbeConfig, check_probe, run_probe
from specserve.doctor.roofline import Machine, measure, params_read, roofline
from specserve.doctor.sides import Kind, Side, read_side
from specserve.engine_record import EngineRecord, read_engine_record
from specserve.errors import SpecserveError
from specserve.spec.predictor import gpu_name

DEFAULT_DRAFT_LEN = 4


@dataclass(frozen=True)
class DoctorConfig:
    """The options of ``specserve doctor`` (names as the CLI's)."""

    model: str | None = None
    draft: str | None = None
    medusa: str | None = None
    eagle3: str | None = None
    engine: str | None = None
    gpu: str = "h100-sxm"
    gpu_memory_gib: float | None = None  # overrides the GPU's memory size
    memory_fraction: float = 0.9
    batch: int | None = None  # default: the engine's max_batch_size, else 1
    max_seq_len: int | None = None  # default: the engine's, else the target's positions
    num_draft_tokens: int | None = None  # default: the engine's max_draft_len, else 4
    kv_dtype: str | None = None  # default: the engine's kv_cache_dtype, else the target's dtype
    probe: bool = True
    probe_tokens: int = 32
    probe_device: str = "cpu"
    threads: int | None = None
    min_acceptance: float = 0.1
    strict: bool = False
    roofline: bool = False  # measure this machine, print the target's step roofline
    roofline_mb: int = 512  # the read-bandwidth GEMV's matrix (MB)


@dataclass(frozen=True)
class Pairing:
    """The resolved inputs: which directories, at what batch, context and draft length."""

    target: Path
    tokenizer: Path
    kind: Kind
    proposer: Path
    batch: int
    max_seq_len: int | None
    draft_len: int
    tp: int
    kv_dtype: str | None
    record: EngineRecord | None


def _engine_proposer(record: EngineRecord) -> tuple[Kind, Path]:
    d = record.engine_dir
    kinds: dict[str, Kind] = {"draft": "draft", "medusa": "medusa", "eagle3": "eagle3"}
    if record.backend != "torch" or record.spec_mode not in kinds:
        raise SpecserveError(f"{record.path}: spec_mode {record.spec_mode!r} ({record.backend}) "
                             "has no draft, Medusa or EAGLE-3 checkpoint here to check; pass "
                             "--draft, --medusa or --eagle3")
    kind = kinds[record.spec_mode]
    return kind, d / kind


def resolve(cfg: DoctorConfig) -> Pairing:
    """Directories and sizes from the options, the engine record filling what is unset."""
    record = read_engine_record(cfg.engine) if cfg.engine else None
    options: tuple[tuple[Kind, str | None], ...] = (
        ("draft", cfg.draft), ("medusa", cfg.medusa), ("eagle3", cfg.eagle3))
    given = [(k, path) for k, path in options if path]
    if len(given) > 1:
        raise SpecserveError("choose one of --draft, --medusa, --eagle3")
    if cfg.model:
        target = Path(cfg.model)
    elif record is not None and record.backend == "torch":
        target = record.engine_dir / "target"
    elif record is not None:
        raise SpecserveError(f"{record.path}: a {record.backend} engine holds no HF checkpoint; "
                             "pass --model and --draft/--medusa/--eagle3 (what it was built "
                             "from) with --engine")
    else:
        raise SpecserveError("--model or --engine is required")
    if given:
        kind, proposer = given[0][0], Path(given[0][1])
    elif record is not None:
        kind, proposer = _engine_proposer(record)
    else:
        raise SpecserveError("doctor checks a pairing: pass --draft, --medusa or --eagle3")
    tok = record.engine_dir / "tokenizer" if record is not None and not cfg.model else target
    draft_len = cfg.num_draft_tokens or (record.max_draft_len if record else 0) \
        or DEFAULT_DRAFT_LEN
    return Pairing(target=target, tokenizer=tok if tok.is_dir() else target, kind=kind,
                   proposer=proposer, batch=cfg.batch or (record.max_batch_size if record else 1),
                   max_seq_len=cfg.max_seq_len or (record.max_seq_len if record else None),
                   draft_len=draft_len, tp=record.tp_size if record else 1,
                   kv_dtype=cfg.kv_dtype or (record.kv_cache_dtype if record else None),
                   record=record)


def verify_tokens(p: Pairing, proposer: Side) -> int:
    """Tokens one sequence verifies per step: a chain's K + 1, a tree's nodes + 1."""
    tree = p.record.get("medusa_choices") or p.record.get("eagle_choices") \
        if p.record is not None else None
    if tree:
        return len(tree) + 1
    if proposer.kind == "medusa":
        from specserve.spec.tree import MC_SIM_7B_63  # torch: imported only when needed

        heads = int(proposer.config.get("medusa_num_heads") or 1)
        return sum(1 for c in MC_SIM_7B_63 if len(c) <= heads) + 1
    return p.draft_len + 1


def memory_plan(cfg: DoctorConfig, p: Pairing, target: Side, proposer: Side) -> MemoryPlan:
    gpu = gpu_name(cfg.gpu)
    if gpu not in GPU_MEMORY_BYTES:
        raise SpecserveError(f"--gpu {cfg.gpu!r}: expected one of {sorted(GPU_MEMORY_BYTES)}")
    memory = int(cfg.gpu_memory_gib * GIB) if cfg.gpu_memory_gib else GPU_MEMORY_BYTES[gpu]
    act = dtype_bytes(weight_dtype(target))
    kv = dtype_bytes(p.kv_dtype) if p.kv_dtype else act
    t = footprint(target.config, target.weight_bytes, kv)
    if proposer.kind == "medusa":
        d = Footprint(proposer.weight_bytes, 0, 0, 0, 0)
    else:
        cfg_d = {**proposer.config, "num_hidden_layers": 1} if proposer.kind == "eagle3" \
            else proposer.config
        d = footprint(cfg_d, proposer.weight_bytes, kv)
    context = p.max_seq_len or int(target.config.get("max_position_embeddings") or 4096)
    return MemoryPlan(gpu=gpu, memory_bytes=memory, memory_fraction=cfg.memory_fraction,
                      batch=p.batch, context=context, tp=p.tp,
                      verify_tokens=verify_tokens(p, proposer),
                      draft_len=0 if proposer.kind == "medusa" else p.draft_len,
                      act_bytes=act, target=t, draft=d)


def probe(cfg: DoctorConfig, p: Pairing, findings: list[Finding]) -> tuple[dict[str, Any],
                                                                          list[Finding]]:
    """Run the probe; a pairing that does not load is an error unless one is already found."""
    if not cfg.probe:
        return {"status": "off"}, []
    pc = ProbeConfig(target=p.target, tokenizer=p.tokenizer, draft_len=p.draft_len,
                     tokens=cfg.probe_tokens, device=cfg.probe_device, threads=cfg.threads,
                     **{p.kind: p.proposer})
    try:
        result = run_probe(pc)
    except SpecserveError as e:
        if any(f.severity == "error" for f in findings):
            return {"status": "skipped", "reason": str(e)}, [
                info("probe-skipped", f"probe not run, the pairing does not load: {e}")]
        return {"status": "failed", "reason": str(e)}, [
            error("probe-failed", f"probe: the pairing does not load: {e}")]
    return result.to_dict(), check_probe(result, cfg.min_acceptance)


def roofline_report(target: Side, batch: int, verify_tokens: int,
                    machine: Machine) -> tuple[dict[str, Any], list[Finding]]:
    """float32 steps of the target on ``machine``: plain (``batch`` rows) and verify
    (``batch`` x ``verify_tokens`` rows)."""
    tied = bool(target.config.get("tie_word_embeddings", False))
    params = params_read(target.tensors, tied)
    if params == 0:
        raise SpecserveError(f"{target.path}: no safetensors weights to size a step from")
    steps = {name: roofline(params, 4, batch * t, machine.read_gbs, machine.gflops)
             for name, t in (("plain", 1), ("verify", verify_tokens))}
    findings = [info("machine", f"{machine.cpu}, {machine.cpus} CPU(s), SMT siblings "
                                f"{'yes' if machine.smt_siblings else 'no'}: read "
                                f"{machine.read_gbs:g} GB/s, {machine.gflops:g} GFLOP/s "
                                f"({machine.method})")]
    for name, r in steps.items():
        findings.append(info("roofline", (
            f"{name} step, float32, {r.rows} row(s): {r.bytes_per_step / 1e6:.0f} MB -> "
            f"{r.bandwidth_ms:.1f} ms at the read bandwidth, {r.compute_ms:.1f} ms at the FMA "
            f"rate: {r.bound}-bound, at least {r.step_ms:.3g} ms (balance at "
            f"{r.rows_at_balance:g} rows)")))
    return ({"machine": machine.to_dict(), "params": params, "tied": tied,
             "steps": {k: r.to_dict() for k, r in steps.items()}}, findings)


def _roofline_only(cfg: DoctorConfig) -> dict[str, Any]:
    """``--roofline`` with a target and no proposer: the machine and the target's step."""
    assert cfg.model is not None
    target = read_side(cfg.model, "target")
    k = cfg.num_draft_tokens or DEFAULT_DRAFT_LEN
    out, findings = roofline_report(target, cfg.batch or 1, k + 1, measure(cfg.roofline_mb))
    return {"inputs": {"target": cfg.model, "batch": cfg.batch or 1, "draft_len": k},
            "findings": [f.to_dict() for f in findings], "roofline": out,
            "errors": 0, "warnings": 0, "exit_code": 0}


def doctor(cfg: DoctorConfig) -> dict[str, Any]:
    """Every finding on the pairing, the memory plan and the probe, as one JSON-able dict."""
    if cfg.roofline and cfg.model and not (cfg.draft or cfg.medusa or cfg.eagle3 or cfg.engine):
        return _roofline_only(cfg)
    p = resolve(cfg)
    target = read_side(p.target, "target", p.tokenizer)
    proposer = read_side(p.proposer, p.kind)
    plan = memory_plan(cfg, p, target, proposer)
    findings = static_checks(target, proposer, plan.context) + check_memory(plan)
    probe_out, probe_findings = probe(cfg, p, findings)
    roof: dict[str, Any] | None = None
    if cfg.roofline:
        roof, roof_findings = roofline_report(target, p.batch, plan.verify_tokens,
                                              measure(cfg.roofline_mb))
        probe_findings += roof_findings
    findings = sort_findings(findings + probe_findings)
    return {"inputs": {"target": str(p.target), p.kind: str(p.proposer),
                       "tokenizer": str(p.tokenizer), "engine": cfg.engine, "batch": p.batch,
                       "context": plan.context, "draft_len": p.draft_len},
            "findings": [f.to_dict() for f in findings], "memory": plan.to_dict(),
            "probe": probe_out, **({"roofline": roof} if roof is not None else {}),
            "errors": sum(f.severity == "error" for f in findings),
            "warnings": sum(f.severity == "warning" for f in findings),
            "exit_code": exit_code(findings, cfg.strict)}
