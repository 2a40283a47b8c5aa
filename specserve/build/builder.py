"""``specserve build`` as a library call: validate, resolve, plan, then build all-or-nothing.

Order: (1) validate every input from headers and small JSON files, (2) resolve defaults,
(3) make the plan (exact TensorRT-LLM 1.2.1 argv, or the torch engine's parts), (4) unless
``dry_run``, build into a staging directory and rename it to ``--out``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from specserve.build import llmapi, llmapi_plan, trtllm
from specserve.build.config import BuildConfig, resolve
from specserve.build.llmapi_validate import validate_pytorch_config
from specserve.build.plan import BuildPlan, staging_dir
from specserve.build.record import cli_argv, make_record
from specserve.build.runner import preflight, run_plan
from specserve.build.torch_engine import copy_tokenizer
from specserve.build.validate import (
    MedusaInfo,
    validate_eagle,
    validate_eagle3,
    validate_medusa,
    validate_mtp,
    validate_parallelism,
    validate_target,
)
from specserve.checkpoint import check_tokenizers_match, read_json
from specserve.config import write_json_atomic as write_json
from specserve.config import write_text_atomic as write_text
from specserve.cpu_dtype import DtypeChoice, choose_dtype
from specserve.errors import SpecserveError
from specserve.interrupts import sigterm_as_interrupt
from specserve.outputs import check_replaceable, staged_output

HOPPER = (9, 0)
WRITER = "specserve build"


@dataclass(frozen=True)
class Prepared:
    """A validated, resolved build and its plan."""

    cfg: BuildConfig
    target_cfg: dict[str, Any]
    medusa: MedusaInfo | None
    plan: BuildPlan
    trtllm_inputs: trtllm.PlanInputs | None = None  # the engine flow's facts of the inputs


def resolve_backend(name: str) -> str:
    """``auto`` = trtllm when ``tensorrt_llm`` is installed and a CUDA GPU is present."""
    if name != "auto":
        return name
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "torch"
    import torch

    return "trtllm" if torch.cuda.is_available() else "torch"


def default_dtype(backend: str) -> str:
    """``specserve build`` without ``--dtype``: ``auto`` on the torch engine (float32 or
    bfloat16 by this CPU: float16 is emulated on a CPU, slow and off the float32 answer by
    ~2e-3 in log-probabilities between a verify and a one-token step), float16 on TensorRT-LLM
    (its converters' usual dtype)."""
    return "auto" if backend == "torch" else "float16"


def resolve_dtype(name: str, backend: str) -> tuple[str, DtypeChoice | None]:
    """``--dtype auto``: what :mod:`specserve.cpu_dtype` finds fast where the engine runs (the
    torch engine: this CPU; TensorRT-LLM: a GPU, bfloat16), with the evidence for
    ``build_config.json``; any other name as given."""
    if name != "auto":
        return name, None
    choice = choose_dtype("auto", "cpu" if backend == "torch" else "cuda")
    return choice.dtype, choice


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of GPU 0 from ``nvidia-smi`` (works in a CPU-only venv inside the
    container), else from torch; None without a GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            res = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, check=True)
            smi_major, smi_minor = res.stdout.splitlines()[0].strip().split(".")
            return int(smi_major), int(smi_minor)
        except (subprocess.SubprocessError, OSError, ValueError, IndexError):
            pass
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return int(major), int(minor)


def validate_inputs(cfg: BuildConfig) -> tuple[dict[str, Any], MedusaInfo | None]:
    """Every check that needs the input files; returns the target config and heads facts."""
    pytorch = cfg.flow == "pytorch"
    target_cfg = validate_target(cfg.model, any_architecture=pytorch)
    validate_parallelism(target_cfg, cfg.tp_size, cfg.pp_size,
                         source=str(Path(cfg.model) / "config.json"))
    if pytorch:
        _validate_pytorch_inputs(cfg, target_cfg)
        return target_cfg, None
    medusa = None
    if cfg.spec_mode == "medusa":
        assert cfg.medusa is not None
        medusa = validate_medusa(cfg.medusa, target_cfg, cfg.medusa_choices)
    elif cfg.spec_mode == "draft":
        assert cfg.draft is not None
        draft_cfg = validate_target(cfg.draft)
        # TensorRT-LLM's engine flow accepts a draft padded to another vocab_size by token ids
        # (use_draft_logits false); the torch engine compares the draft's distribution with
        # the target's row for row, so it needs equal widths
        trtllm_flow = cfg.backend == "trtllm"
        check_tokenizers_match(cfg.model, cfg.draft, same_vocab_size=not trtllm_flow, why=(
            "the torch engine compares the draft's probabilities with the target's row for row; "
            "--backend trtllm serves such a pair (acceptance by token ids)"))
        _check_llama_converter(cfg, draft_cfg, cfg.draft)
    elif cfg.spec_mode == "eagle":
        assert cfg.eagle is not None
        validate_eagle(cfg.eagle, target_cfg)
    elif cfg.spec_mode == "eagle3":  # the torch backend (the engine flow refused it)
        assert cfg.eagle3 is not None
        validate_eagle3(cfg.eagle3, target_cfg, reference=True)
        return target_cfg, None
    if cfg.spec_mode != "medusa":
        _check_llama_converter(cfg, target_cfg, cfg.model)
    return target_cfg, medusa


def _validate_pytorch_inputs(cfg: BuildConfig, target_cfg: dict[str, Any]) -> None:
    """The PyTorch route's inputs: the EAGLE-3 head or draft fits the target; MTP layers."""
    if cfg.spec_mode == "eagle3":
        assert cfg.eagle3 is not None
        validate_eagle3(cfg.eagle3, target_cfg)
    elif cfg.spec_mode == "draft":
        assert cfg.draft is not None
        validate_target(cfg.draft, any_architecture=True)
        check_tokenizers_match(cfg.model, cfg.draft, same_vocab_size=False)  # token-id accept
    elif cfg.spec_mode == "mtp":
        layers = validate_mtp(target_cfg, str(Path(cfg.model) / "config.json"))
        if cfg.max_draft_len is not None and cfg.max_draft_len < 1:
            raise SpecserveError(f"--max-draft-len {cfg.max_draft_len}: MTP needs >= 1 "
                                 f"(the checkpoint has {layers} MTP layers)")


def _check_llama_converter(cfg: BuildConfig, model_cfg: dict[str, Any], model_dir: str) -> None:
    """The trtllm plan converts non-Medusa checkpoints with their family's converter
    (:data:`specserve.build.trtllm.ENGINE_CONVERTERS`)."""
    if cfg.backend == "trtllm":
        trtllm.check_engine_family(cfg, str(model_cfg.get("model_type")),
                                   str(Path(model_dir) / "config.json"))


def validate_for_route(cfg: BuildConfig) -> None:
    """Every check of ``cfg`` that needs no files: the common ones (:meth:`BuildConfig.validate`)
    and the chosen route's (the LLM-API route's live in :mod:`specserve.build.llmapi_validate`)."""
    cfg.validate()
    if cfg.flow == "pytorch":
        validate_pytorch_config(cfg)


def absolute_paths(cfg: BuildConfig) -> BuildConfig:
    """The PyTorch route's paths made absolute: the YAML, ``model.yaml`` and the manifests are
    read from other working directories (a pod, a Slurm task, Triton's Python stub), where a
    relative ``speculative_model`` that does not exist is taken for a Hugging Face Hub id
    (llm_args.py: "accepts a HuggingFace Hub model ID ... or a local path")."""
    def absolute(path: str | None) -> str | None:
        return None if path is None else os.path.abspath(path)

    return replace(cfg, model=os.path.abspath(cfg.model), out=os.path.abspath(cfg.out),
                   draft=absolute(cfg.draft), eagle3=absolute(cfg.eagle3))


def prepare(cfg: BuildConfig, *, force: bool = False) -> Prepared:
    """Validate and resolve ``cfg`` and make its plan; touches nothing."""
    validate_for_route(cfg)
    check_replaceable(Path(cfg.out), force, WRITER)
    target_cfg, medusa = validate_inputs(cfg)
    resolved = resolve(cfg, target_cfg, medusa.num_heads if medusa else None)
    if resolved.flow == "pytorch":
        resolved = absolute_paths(resolved)
    validate_for_route(resolved)
    inputs: trtllm.PlanInputs | None = None
    if resolved.flow == "pytorch":
        plan = llmapi_plan.make_pytorch_plan(resolved)
    elif resolved.backend == "trtllm":
        inputs = trtllm.PlanInputs(
            model_type=str(target_cfg.get("model_type", "llama")),
            num_medusa_heads=medusa.num_heads if medusa else 0,
            num_medusa_layers=medusa.num_layers if medusa else 0,
            examples_dir=trtllm.examples_dir(),
            **_draft_facts(resolved, target_cfg))
        plan = trtllm.make_trtllm_plan(resolved, inputs)
    else:
        plan = _torch_plan(resolved)
    return Prepared(resolved, target_cfg, medusa, plan, inputs)


def _draft_facts(cfg: BuildConfig, target_cfg: dict[str, Any]) -> dict[str, Any]:
    """The draft's model_type and both vocab sizes (:class:`trtllm.PlanInputs`), draft-target
    only."""
    if cfg.spec_mode != "draft" or not cfg.draft:
        return {}
    draft_cfg = read_json(Path(cfg.draft) / "config.json")
    return {"draft_model_type": str(draft_cfg.get("model_type")),
            "target_vocab_size": target_cfg.get("vocab_size"),
            "draft_vocab_size": draft_cfg.get("vocab_size")}


def draft_target_summary(inputs: trtllm.PlanInputs | None) -> dict[str, Any] | None:
    """How a TensorRT-LLM draft-target engine accepts drafts (``build_config.json`` and the
    dry run's summary): by token ids always, with the draft's logits (``use_draft_logits``)
    only where the draft's vocab_size is the target's."""
    if inputs is None or inputs.draft_vocab_size is None:
        return None
    return {"acceptance": "token_ids or draft_logits" if inputs.draft_logits else "token_ids",
            "draft_logits": inputs.draft_logits,
            "target_vocab_size": inputs.target_vocab_size,
            "draft_vocab_size": inputs.draft_vocab_size}


def _torch_plan(cfg: BuildConfig) -> BuildPlan:
    fp8 = ", weights fp8 e4m3 + per-channel scales" if cfg.quantize == "fp8" else ""
    notes = [f"write target/ ({cfg.dtype}{fp8}) from {cfg.model}"]
    if cfg.spec_mode in ("medusa", "draft", "eagle3"):
        src = {"medusa": cfg.medusa, "draft": cfg.draft, "eagle3": cfg.eagle3}[cfg.spec_mode]
        notes.append(f"write {cfg.spec_mode}/ ({cfg.dtype}"
                     f"{fp8 if cfg.spec_mode == 'draft' else ''}) from {src}")
    notes.append(f"copy tokenizer/ from {cfg.model}; write build_config.json")
    return BuildPlan(backend="torch", out=cfg.out, staging=staging_dir(cfg.out), steps=(),
                     world_size=1, notes=tuple(notes))


def build_engine(cfg: BuildConfig, *, dry_run: bool = False, force: bool = False,
                 console: Console | None = None,
                 dtype_choice: DtypeChoice | None = None) -> dict[str, Any]:
    """Build (or with ``dry_run`` only plan) an engine; return a summary for printing.
    ``dtype_choice`` (``--dtype auto``) is recorded in ``build_config.json`` as
    ``dtype_choice``: the serving dtype and why."""
    prep = prepare(cfg, force=force)
    summary: dict[str, Any] = {"dry_run": dry_run, "out": prep.cfg.out,
                               "config": prep.cfg.to_dict(), "plan": prep.plan.to_dict()}
    if prep.cfg.flow == "pytorch":
        summary["llm_api"] = _llm_api_summary(prep.cfg)
    draft_target = draft_target_summary(prep.trtllm_inputs)
    if draft_target is not None:
        summary["draft_target"] = draft_target
    if dry_run:
        return summary
    if prep.cfg.flow == "pytorch" and prep.plan.steps:
        _check_fp8_gpu(prep.cfg)
        preflight(prep.plan)
    elif prep.cfg.flow == "engine" and prep.cfg.backend == "trtllm":
        _check_fp8_gpu(prep.cfg)
        preflight(prep.plan)
    out = Path(prep.cfg.out)
    with sigterm_as_interrupt(), staged_output(out, force, WRITER) as stage:
        if prep.cfg.flow == "pytorch":
            record = _build_pytorch(prep, stage, console)
        elif prep.cfg.backend == "trtllm":
            record = _build_trtllm(prep, stage, console)
        else:
            record = _build_torch(prep, stage)
        if dtype_choice is not None:
            record["dtype_choice"] = dtype_choice.to_dict()
        write_json(stage / "build_config.json", record)
    summary["build_config"] = str(out / "build_config.json")
    return summary


def _llm_api_summary(cfg: BuildConfig) -> dict[str, Any]:
    """What ``--dry-run`` prints for the PyTorch route: the YAML and the commands."""
    return {"options_file": llmapi_plan.options_path(cfg), "yaml": llmapi.render_options(cfg),
            "options": llmapi.llm_api_options(cfg), "model": llmapi_plan.served_model(cfg),
            "serve": llmapi_plan.serve_argv(cfg), "bench": llmapi_plan.bench_commands(cfg)}


def _build_pytorch(prep: Prepared, stage: Path, console: Console | None) -> dict[str, Any]:
    """Run the ModelOpt step (if any), then write the YAML; the record names both."""
    if prep.plan.steps:
        _run_logged(prep, stage, console)
    write_text(stage / llmapi.LLMAPI_FILE, llmapi.render_options(prep.cfg))
    copy_tokenizer(Path(prep.cfg.model), stage / "tokenizer")
    info = _llm_api_summary(prep.cfg)
    info.pop("yaml")
    extra: dict[str, Any] = {"trtllm": {**prep.plan.pin}, "llm_api": info}
    return make_record(prep.cfg, [cli_argv(prep.cfg), *prep.plan.commands()], extra)


def _check_fp8_gpu(cfg: BuildConfig) -> None:
    if cfg.quantize != "fp8" and cfg.kv_cache_dtype != "fp8":
        return
    cap = gpu_capability()
    if cap is None or cap < HOPPER:
        found = "no CUDA GPU" if cap is None else f"a GPU of compute capability {cap[0]}.{cap[1]}"
        raise SpecserveError(f"--quantize fp8: needs a Hopper (sm90) or newer GPU, found {found}"
                             " (--dry-run still prints the plan)")


def _build_torch(prep: Prepared, stage: Path) -> dict[str, Any]:
    from specserve.build.torch_engine import write_torch_engine

    write_torch_engine(prep.cfg, stage, prep.medusa)
    extra: dict[str, Any] = {}
    if prep.medusa is not None:
        extra["medusa"] = {"num_heads": prep.medusa.num_heads,
                           "num_layers": prep.medusa.num_layers}
    return make_record(prep.cfg, [cli_argv(prep.cfg)], extra)


def _run_logged(prep: Prepared, stage: Path, console: Console | None) -> None:
    """Run the plan's steps into ``stage/build.log``; on failure the log is kept beside the
    output (``NAME.build-failed.log``) before the staging directory goes."""
    log = stage / "build.log"
    try:
        run_plan(prep.plan, log, console)
    except BaseException:
        if log.exists():
            shutil.copyfile(log, Path(prep.cfg.out).parent / f"{Path(prep.cfg.out).name}"
                                                             ".build-failed.log")
        raise


def _build_trtllm(prep: Prepared, stage: Path, console: Console | None) -> dict[str, Any]:
    _run_logged(prep, stage, console)
    shutil.rmtree(stage / "_checkpoints", ignore_errors=True)
    copy_tokenizer(Path(prep.cfg.model), stage / "tokenizer")
    extra: dict[str, Any] = {"trtllm": {**prep.plan.pin,
                                        "examples_dir": trtllm.examples_dir()}}
    if prep.medusa is not None:
        extra["medusa"] = {"num_heads": prep.medusa.num_heads,
                           "num_layers": prep.medusa.num_layers}
    draft_target = draft_target_summary(prep.trtllm_inputs)
    if draft_target is not None:
        extra.update({"draft_world_size": 1, "draft_logits": draft_target["draft_logits"],
                      "draft_target": draft_target})
    return make_record(prep.cfg, [cli_argv(prep.cfg), *prep.plan.commands()], extra)
