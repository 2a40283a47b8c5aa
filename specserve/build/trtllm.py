"""TensorRT-LLM engine-flow commands for the pinned release (the pin itself is named in
:mod:`specserve.build.pins`).

Pinned: **TensorRT-LLM 1.2.1** (PyPI 2026-04-20), shipped in
``nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3``. It is the newest stable release that
still ships ``trtllm-build``, ``examples/medusa/convert_checkpoint.py``, the Medusa arguments of
``examples/quantization/quantize.py`` and the C++ ``tensorrtllm`` Triton backend (all removed
from main in June/July 2026). Choices made here:

- Medusa: ``--num_medusa_heads``/``--num_medusa_layers`` always explicit (the converter ignores
  the heads' config.json); ``max_draft_len`` = tree nodes on both the converter
  (``--max_medusa_token_len``) and ``trtllm-build``. FP8: ``quantize.py --qformat fp8
  [--kv_cache_dtype fp8]`` with the Medusa arguments; heads stay fp16 (``--quant_medusa_head``
  is never passed: it quantizes nothing and breaks builds).
- Families (:data:`ENGINE_CONVERTERS`): Llama and Mistral go through the Llama converter, Qwen3
  dense through ``examples/models/core/qwen/convert_checkpoint.py``, whose ``QWenForCausalLM``
  takes ``model_type`` qwen3 (q/k layernorm, no qkv bias) since NVIDIA/TensorRT-LLM PR #5650
  (merged 2025-07-10). Stored copies read: ``tensorrt_llm/models/__init__.py`` @
  02267d3d4fd886c3ad036f6580beb0847eac6e4b (MODEL_MAP ``Qwen3ForCausalLM``),
  ``tensorrt_llm/models/qwen/config.py`` and ``convert.py`` @
  0428c18828880e7c60c13cc5cc0794bbbc05c0a3 (qwen_type qwen3, ``q_norm``/``k_norm`` converted),
  the converter's argparse @ 0df9aaf38338424867a1ca1faa71173501205001; the v1.2.1 tag itself
  could not be read. Qwen3 with Medusa (the Medusa converter asserts
  ``--model_type`` llama, mixtral or qwen2), EAGLE (Llama targets only) or FP8 (``quantize.py``'s
  Qwen3 export not verified) is refused with a pointer to the PyTorch route (``--flow pytorch``).
- Draft-target: each model through its family's converter (a Llama draft for a Llama target as
  upstream's draft-target README does); target built with ``draft_tokens_external``; both
  with paged context FMHA; the draft gathers generation logits so ``use_draft_logits`` works
  (not for a draft padded to another vocab_size: acceptance by token ids only).
  The draft is one rank (tp=pp=1), served as its own ``tensorrt_llm_draft`` model.
- Qwen2 + Medusa needs tp = pp = 1 (or the FP8 ``quantize.py`` path): the qwen2 branch of
  ``examples/medusa/convert_checkpoint.py`` builds the base model with
  ``QWenForCausalLM.from_hugging_face(args.model_dir, args.dtype)`` (no ``mapping``) and saves
  ``convert_args['hf_model'].named_parameters()`` unsplit into every ``rank{r}.safetensors``
  (only the Medusa heads are split), so TP/PP > 1 engines would not be sharded.
- EAGLE: ``examples/eagle/convert_checkpoint.py`` (pp must be 1), mode ``eagle``. Triton's
  default ``eagle_choices`` is ``mc_sim_7b_63`` (63 nodes); below 63 draft tokens
  ``specserve repo`` sets ``eagle_choices`` to that tree cut to ``max_draft_len`` nodes.
- Lookahead (``--lookahead W,N,G``): the target alone through its family's converter, built with
  ``lookahead_decoding`` and ``--max_draft_len`` = upstream's formula of (W, N, G)
  (:mod:`specserve.spec.lookahead`); the repository writes the same (W, N, G) as Triton's
  ``lookahead_*`` parameters.
- N-gram: the target alone with ``draft_tokens_external``; the C++ backend has no n-gram
  proposer, so specserve's BLS proposes by prompt lookup and sends ``draft_input_ids`` (the
  repository sets KV reuse on, as the prompt-lookup README requires, and a non-decoupled target).
- TP/PP: chosen at conversion (``--tp_size``/``--pp_size``, one ``rank{r}`` per GPU);
  ``trtllm-build --workers`` = world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from specserve.build.config import (
    EAGLE_MAX_DRAFT_LEN,
    EAGLE_MAX_NON_LEAVES,
    EAGLE_NUM_LAYERS,
    BuildConfig,
)
from specserve.build.pins import TRTLLM_IMAGE, TRTLLM_VERSION
from specserve.build.plan import BuildPlan, BuildStep, staging_dir
from specserve.errors import SpecserveError

#: Where the TensorRT-LLM ``examples/`` tree is; override with $TRTLLM_EXAMPLES_DIR.
DEFAULT_EXAMPLES_DIR = "/app/tensorrt_llm/examples"
PYTHON = "python3"
TRTLLM_BUILD = "trtllm-build"
SCRIPTS = {
    "medusa": "medusa/convert_checkpoint.py",
    "llama": "models/core/llama/convert_checkpoint.py",
    "qwen": "models/core/qwen/convert_checkpoint.py",
    "eagle": "eagle/convert_checkpoint.py",
    "quantize": "quantization/quantize.py",
}
FP8_CALIB_SIZE = 512
#: HF model_type -> the :data:`SCRIPTS` converter that turns a draft, or a target without Medusa
#: or EAGLE, into a TensorRT-LLM checkpoint at the pin (sources: the module docstring).
ENGINE_CONVERTERS = {"llama": "llama", "mistral": "llama", "qwen3": "qwen"}
#: Families the engine flow converts only without Medusa, EAGLE or FP8; the reason for each.
_PLAIN_ONLY = {"qwen3": {
    "medusa": "examples/medusa/convert_checkpoint.py takes --model_type llama, mixtral or qwen2",
    "eagle": "examples/eagle/convert_checkpoint.py builds Llama targets only",
    "fp8": "examples/quantization/quantize.py's Qwen3 export is not verified at the pin"}}


#: What to do instead, per refused option: only FP8 has a PyTorch-route path; the PyTorch
#: backend has no Medusa (MedusaDecodingConfig.supports_backend excludes pytorch) and serves
#: EAGLE-3 heads, not EAGLE-1/2 ones.
_INSTEAD = {
    "--medusa": "TensorRT-LLM 1.2.1 has no Qwen3 Medusa path on either route (the PyTorch "
                "backend has no Medusa); use --backend torch, or train an EAGLE-3 head "
                "(specserve train-eagle3) and use --eagle3 --flow pytorch",
    "--eagle": "EAGLE-1/2 heads have no Qwen3 path; train an EAGLE-3 head (specserve "
               "train-eagle3) and use --eagle3 --flow pytorch",
    "--quantize fp8": "use the PyTorch route: --flow pytorch (ModelOpt FP8)",
}


@dataclass(frozen=True)
class PlanInputs:
    """Facts about the validated inputs that the commands depend on."""

    model_type: str  # the target's HF model_type (llama, mistral, qwen2, qwen3)
    num_medusa_heads: int = 0
    num_medusa_layers: int = 0
    examples_dir: str = DEFAULT_EXAMPLES_DIR
    draft_model_type: str | None = None  # the draft's HF model_type (None: the target's)
    # draft-target: the target's and the draft's config.json vocab_size. Equal widths let the
    # draft's logits go to the target (use_draft_logits); a draft whose embeddings are padded to
    # another width (same tokenizer: Qwen2.5-0.5B's 151936 rows for Qwen2.5-7B's 152064) is
    # accepted by token ids, as upstream's tensorrt_llm_bls does with use_draft_logits false
    target_vocab_size: int | None = None
    draft_vocab_size: int | None = None

    @property
    def draft_logits(self) -> bool:
        """Whether the draft's logits can go to the target (their widths match)."""
        return self.draft_vocab_size == self.target_vocab_size


def pin() -> dict[str, str]:
    return {"tensorrt_llm": TRTLLM_VERSION, "image": TRTLLM_IMAGE}


def examples_dir() -> str:
    return os.environ.get("TRTLLM_EXAMPLES_DIR", DEFAULT_EXAMPLES_DIR)


def check_engine_family(cfg: BuildConfig, model_type: str, where: str) -> None:
    """Refuse a target or draft family (HF ``model_type``, from ``where``) that the pinned
    release's engine-flow converters do not handle for this build (one SpecserveError line)."""
    reasons = _PLAIN_ONLY.get(model_type, {})
    why = reasons.get(cfg.spec_mode) or (reasons.get("fp8") if cfg.quantize == "fp8" else None)
    if why is not None:
        opt = f"--{cfg.spec_mode}" if cfg.spec_mode in reasons else "--quantize fp8"
        raise SpecserveError(f"{where}: model_type {model_type!r} with {opt} is not planned for "
                             f"the trtllm engine flow (TensorRT-LLM {TRTLLM_VERSION}: {why}); "
                             f"{_INSTEAD[opt]}")
    if cfg.spec_mode == "medusa":
        return
    if model_type not in ENGINE_CONVERTERS or (
            cfg.spec_mode == "eagle" and ENGINE_CONVERTERS[model_type] != "llama"):
        raise SpecserveError(f"{where}: model_type {model_type!r} with --{cfg.spec_mode} is not "
                             "planned for trtllm (the engine flow converts llama and mistral "
                             "with the Llama converter, qwen3 with the Qwen converter)")


def check_buildable(cfg: BuildConfig, inputs: PlanInputs) -> None:
    """Refuse what the pinned release's scripts cannot build (one SpecserveError line)."""
    check_engine_family(cfg, inputs.model_type, os.path.join(cfg.model, "config.json"))
    if cfg.draft is not None and cfg.spec_mode == "draft":
        check_engine_family(cfg, inputs.draft_model_type or inputs.model_type,
                            os.path.join(cfg.draft, "config.json"))
    if (cfg.spec_mode == "medusa" and cfg.quantize is None and inputs.model_type == "qwen2"
            and cfg.world_size > 1):
        raise SpecserveError(
            f"{os.path.join(cfg.model, 'config.json')}: model_type 'qwen2' with --medusa and "
            f"--tp {cfg.tp_size} --pp {cfg.pp_size}: the pinned TensorRT-LLM's "
            "examples/medusa/convert_checkpoint.py does not shard a Qwen2 base model (its qwen2 "
            "branch loads QWenForCausalLM.from_hugging_face(model_dir, dtype) without a mapping "
            "and writes the full weights into every rank); use --tp 1 --pp 1")


def make_trtllm_plan(cfg: BuildConfig, inputs: PlanInputs) -> BuildPlan:
    """The convert/quantize and ``trtllm-build`` steps for a resolved config (pure)."""
    check_buildable(cfg, inputs)
    stage = staging_dir(cfg.out)
    ckpt = os.path.join(stage, "_checkpoints")
    steps = [_convert_target(cfg, inputs, os.path.join(ckpt, "target"))]
    steps.append(_build(cfg, os.path.join(ckpt, "target"), os.path.join(stage, "target"),
                        target=True))
    notes = [f"run inside {TRTLLM_IMAGE} (TensorRT-LLM {TRTLLM_VERSION}) on the GPUs that will "
             f"serve it; examples from {inputs.examples_dir}"]
    if cfg.spec_mode == "draft":
        assert cfg.draft is not None
        draft_ckpt = os.path.join(ckpt, "draft")
        steps.insert(1, _convert_plain(cfg, inputs, cfg.draft, draft_ckpt, "draft", 1, 1,
                                       inputs.draft_model_type or inputs.model_type))
        steps.append(_build(cfg, draft_ckpt, os.path.join(stage, "draft"), target=False,
                            gather_logits=inputs.draft_logits))
        if not inputs.draft_logits:
            notes.append(_token_id_note(inputs))
        notes.append("the draft is one rank; `specserve repo` writes tensorrt_llm and "
                     "tensorrt_llm_draft non-decoupled with KV reuse and "
                     "kv_cache_free_gpu_mem_fraction 0.5 each on a shared GPU, and `specserve "
                     "serve` starts them in orchestrator mode (TRTLLM_ORCHESTRATOR=1, world "
                     "size 1), as in upstream's draft-target recipe")
    if cfg.spec_mode == "ngram":
        notes.append("the C++ backend has no n-gram proposer: `specserve repo` writes a "
                     "non-decoupled tensorrt_llm with KV reuse (the prompt-lookup README: "
                     "\"must be specified\"), and its BLS proposes by prompt lookup and sends "
                     "draft_input_ids; the ensemble alone does not speculate")
    if cfg.spec_mode == "eagle" and (cfg.max_draft_len or 0) < EAGLE_MAX_DRAFT_LEN:
        notes.append(f"max_draft_len {cfg.max_draft_len} < {EAGLE_MAX_DRAFT_LEN}: Triton's "
                     f"default eagle_choices (mc_sim_7b_63, {EAGLE_MAX_DRAFT_LEN} nodes) does not "
                     f"fit; specserve repo sets eagle_choices to its first {cfg.max_draft_len} "
                     "nodes")
    if cfg.spec_mode == "lookahead":
        notes.append(f"lookahead (W,N,G) = ({cfg.lookahead}): max_draft_len {cfg.max_draft_len} "
                     "= (N-2) + (W-1+G)*(N-1); `specserve repo` writes decoding_mode lookahead "
                     "and lookahead_window_size / lookahead_ngram_size / "
                     "lookahead_verification_set_size (examples/lookahead/README.md)")
    if cfg.quantize == "fp8":
        notes.append(f"FP8 calibration reads cnn_dailymail ({FP8_CALIB_SIZE} samples) and needs "
                     "a Hopper (sm90) or newer GPU")
    return BuildPlan(backend="trtllm", out=cfg.out, staging=stage, steps=tuple(steps),
                     world_size=cfg.world_size, notes=tuple(notes), pin=pin())


def _token_id_note(inputs: PlanInputs) -> str:
    return (f"the draft's vocab_size {inputs.draft_vocab_size} differs from the target's "
            f"{inputs.target_vocab_size} (same tokenizer, padded embeddings): drafts are accepted "
            "by token ids (use_draft_logits false, as upstream's tensorrt_llm_bls); the draft "
            "engine gathers no generation logits and `specserve repo` tells the BLS to refuse "
            "use_draft_logits")


def _script(inputs: PlanInputs, key: str) -> str:
    return os.path.join(inputs.examples_dir, SCRIPTS[key])


def _parallel(tp: int, pp: int) -> list[str]:
    return ["--tp_size", str(tp), "--pp_size", str(pp)]


def _convert_target(cfg: BuildConfig, inputs: PlanInputs, out: str) -> BuildStep:
    if cfg.spec_mode == "medusa":
        return _convert_medusa(cfg, inputs, out)
    if cfg.spec_mode == "eagle":
        assert cfg.eagle is not None
        argv = [PYTHON, _script(inputs, "eagle"), "--model_dir", cfg.model,
                "--eagle_model_dir", cfg.eagle, "--output_dir", out, "--dtype", cfg.dtype,
                "--tp_size", str(cfg.tp_size), "--max_draft_len", str(cfg.max_draft_len),
                "--num_eagle_layers", str(EAGLE_NUM_LAYERS),
                "--max_non_leaves_per_layer", str(EAGLE_MAX_NON_LEAVES)]
        return BuildStep("convert target + EAGLE", "convert", tuple(argv), out, cfg.tp_size)
    return _convert_plain(cfg, inputs, cfg.model, out, "target", cfg.tp_size, cfg.pp_size,
                          inputs.model_type)


def _quantize_argv(cfg: BuildConfig, inputs: PlanInputs, model: str, out: str,
                   tp: int, pp: int) -> list[str]:
    argv = [PYTHON, _script(inputs, "quantize"), "--model_dir", model, "--output_dir", out,
            "--dtype", cfg.dtype, "--qformat", "fp8"]
    if cfg.kv_cache_dtype == "fp8":
        argv += ["--kv_cache_dtype", "fp8"]
    return argv + ["--calib_size", str(FP8_CALIB_SIZE), *_parallel(tp, pp)]


def _convert_plain(cfg: BuildConfig, inputs: PlanInputs, model: str, out: str, role: str,
                   tp: int, pp: int, model_type: str) -> BuildStep:
    if cfg.quantize == "fp8":
        argv = _quantize_argv(cfg, inputs, model, out, tp, pp)
        return BuildStep(f"quantize {role} (fp8)", "quantize", tuple(argv), out, tp * pp)
    script = _script(inputs, ENGINE_CONVERTERS.get(model_type, "llama"))
    argv = [PYTHON, script, "--model_dir", model, "--output_dir", out,
            "--dtype", cfg.dtype, *_parallel(tp, pp)]
    return BuildStep(f"convert {role}", "convert", tuple(argv), out, tp * pp)


def _medusa_args(cfg: BuildConfig, inputs: PlanInputs) -> list[str]:
    assert cfg.medusa is not None
    return ["--medusa_model_dir", cfg.medusa,
            "--num_medusa_heads", str(inputs.num_medusa_heads),
            "--num_medusa_layers", str(inputs.num_medusa_layers)]


def _convert_medusa(cfg: BuildConfig, inputs: PlanInputs, out: str) -> BuildStep:
    if cfg.quantize == "fp8":
        argv = _quantize_argv(cfg, inputs, cfg.model, out, cfg.tp_size, cfg.pp_size)
        argv += [*_medusa_args(cfg, inputs), "--max_draft_len", str(cfg.max_draft_len),
                 "--medusa_hidden_act", "silu"]
        return BuildStep("quantize target (fp8) + merge Medusa heads (fp16)", "quantize",
                         tuple(argv), out, cfg.world_size)
    model_type = "qwen2" if inputs.model_type == "qwen2" else "llama"
    argv = [PYTHON, _script(inputs, "medusa"), "--model_dir", cfg.model, "--output_dir", out,
            "--dtype", cfg.dtype, *_parallel(cfg.tp_size, cfg.pp_size), *_medusa_args(cfg, inputs),
            "--max_medusa_token_len", str(cfg.max_draft_len), "--medusa_hidden_act", "silu",
            "--model_type", model_type]
    return BuildStep("convert target + Medusa heads", "convert", tuple(argv), out,
                     cfg.world_size)


def _build(cfg: BuildConfig, ckpt: str, out: str, *, target: bool,
           gather_logits: bool = True) -> BuildStep:
    argv = [TRTLLM_BUILD, "--checkpoint_dir", ckpt, "--output_dir", out,
            "--gemm_plugin", cfg.dtype]
    if cfg.quantize == "fp8":  # the Medusa README's FP8 recipe: attention plugin in the dtype
        argv += ["--gpt_attention_plugin", cfg.dtype]
    if cfg.spec_mode in ("draft", "ngram", "eagle"):
        argv += ["--use_paged_context_fmha", "enable"]
    argv += ["--max_batch_size", str(cfg.max_batch_size), "--max_input_len",
             str(cfg.max_input_len), "--max_seq_len", str(cfg.max_seq_len)]
    mode = {"medusa": "medusa", "draft": "draft_tokens_external",
            "ngram": "draft_tokens_external", "eagle": "eagle",
            "lookahead": "lookahead_decoding"}[cfg.spec_mode]
    if target:
        argv += ["--speculative_decoding_mode", mode, "--max_draft_len", str(cfg.max_draft_len)]
        world = cfg.world_size
    else:  # the draft: its generation logits are what use_draft_logits sends the target
        if gather_logits:
            argv += ["--gather_generation_logits"]
        world = 1
    if world > 1:
        argv += ["--workers", str(world)]
    name = "build target engine" if target else "build draft engine"
    return BuildStep(name, "build", tuple(argv), out, world)
