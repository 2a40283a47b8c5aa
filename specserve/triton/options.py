"""The options of ``specserve repo`` (:class:`RepoOptions`) and the checks that need the engine:
executor placement (device ids, KV cache fractions) of TensorRT-LLM engines, alone or as target
and draft on one GPU (upstream's draft-target recipe, tensorrtllm_backend
``examples/draft_target_model/README.md``: ``kv_cache_free_gpu_mem_fraction:0.5`` for each of
two models sharing a GPU). A leaf of ``triton/``: :mod:`specserve.triton.params` renders these
options into template values, :mod:`specserve.triton.repository` writes the repository.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.config import JsonConfig
from specserve.engine_record import EngineRecord
from specserve.errors import SpecserveError

#: kv_cache_free_gpu_mem_fraction: the C++ default for one model on a GPU, and the draft-target
#: README's value for each of two models sharing one ("or one of the models would use out of the
#: GPU memory").
KV_FRACTION_ALONE = 0.9
KV_FRACTION_SHARED = 0.5


@dataclass(frozen=True)
class RepoOptions(JsonConfig):
    """Options of ``specserve repo``; None means "from the engine's build_config.json"."""

    max_batch_size: int | None = None
    preprocessing_instance_count: int = 1
    postprocessing_instance_count: int = 1
    bls_instance_count: int = 1
    decoupled: bool = True
    tokenizer_dir: str | None = None
    max_queue_delay_us: int = 0
    baseline: bool = False
    accumulate_tokens: bool = False
    # TensorRT-LLM executor placement (None = default: kv fraction 0.9 for a model alone on its
    # GPUs, 0.5 each when target and draft share one; ids unset = ranks 0..world_size-1)
    kv_cache_fraction: float | None = None
    draft_kv_cache_fraction: float | None = None
    gpu_device_ids: str | None = None
    draft_gpu_device_ids: str | None = None
    max_tokens_in_paged_kv_cache: int | None = None
    max_attention_window_size: int | None = None
    llmapi_model_dir: str | None = None  # PyTorch route: upstream's llmapi tensorrt_llm/1
    # draft-target: speculative_decoding_fast_logits + participant_ids (the draft's logits go
    # device to device; served in orchestrator mode with spawning off, see triton/server.py)
    fast_logits: bool = False

    def validate(self) -> None:
        for name in ("preprocessing_instance_count", "postprocessing_instance_count",
                     "bls_instance_count"):
            if getattr(self, name) < 1:
                raise SpecserveError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise SpecserveError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_delay_us < 0:
            raise SpecserveError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")
        for name in ("kv_cache_fraction", "draft_kv_cache_fraction"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float))
                                          and not isinstance(value, bool) and 0 < value <= 1):
                raise SpecserveError(f"{cli_flag(name)} {value!r}: must be in (0, 1] (the fraction "
                                     "of free GPU memory for the KV cache)")
        for name in ("max_tokens_in_paged_kv_cache", "max_attention_window_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise SpecserveError(f"{cli_flag(name)} {value!r}: must be a positive integer")
        parse_device_ids(self.gpu_device_ids, "--gpu-device-ids")
        parse_device_ids(self.draft_gpu_device_ids, "--draft-gpu-device-ids")

    def validate_for(self, cfg: EngineRecord) -> None:
        """Checks that need the engine: executor options only for TensorRT-LLM engines, draft
        options only with a draft engine, one device id per rank, and at most the whole GPU for
        two models that share one."""
        set_ = [n for n in EXECUTOR_OPTIONS if getattr(self, n) is not None]
        if cfg.backend != "trtllm" and set_:
            raise SpecserveError(f"{cli_flag(set_[0])}: a TensorRT-LLM executor option; the "
                                 "reference (torch) engine has no KV cache to configure")
        if self.fast_logits and not trtllm_draft(cfg):
            raise SpecserveError(
                f"--fast-logits: only for TensorRT-LLM draft-target engines (this engine: "
                f"backend {cfg.backend}, spec_mode {cfg.spec_mode}); upstream's fast logits "
                "move the draft engine's logits to the target engine")
        if not trtllm_draft(cfg):
            drafts = [n for n in set_ if n.startswith("draft_")]
            if drafts:
                raise SpecserveError(f"{cli_flag(drafts[0])}: only for draft-target engines "
                                     f"(this engine's spec_mode is {cfg.spec_mode})")
        for name, ranks in (("gpu_device_ids", cfg.world_size), ("draft_gpu_device_ids", 1)):
            ids = parse_device_ids(getattr(self, name), cli_flag(name))
            if ids and len(ids) != ranks:
                raise SpecserveError(f"{cli_flag(name)} {getattr(self, name)!r}: {len(ids)} "
                                     f"device(s) for {ranks} rank(s) (one id per rank)")
        target, draft = kv_fractions(cfg, self)
        if draft is not None and shares_gpu(cfg, self) and target + draft > 1 + 1e-9:
            raise SpecserveError(
                f"--kv-cache-fraction {target:g} + --draft-kv-cache-fraction {draft:g} = "
                f"{target + draft:g} > 1: target and draft share a GPU (give both, or "
                "--gpu-device-ids / --draft-gpu-device-ids on different GPUs)")


EXECUTOR_OPTIONS = ("kv_cache_fraction", "draft_kv_cache_fraction", "gpu_device_ids",
                    "draft_gpu_device_ids", "max_tokens_in_paged_kv_cache",
                    "max_attention_window_size")


def cli_flag(name: str) -> str:
    """``kv_cache_fraction`` -> ``--kv-cache-fraction``."""
    return "--" + name.replace("_", "-")


def trtllm_draft(cfg: EngineRecord) -> bool:
    """A two-model TensorRT-LLM repository (``tensorrt_llm`` + ``tensorrt_llm_draft``)."""
    return cfg.backend == "trtllm" and cfg.spec_mode == "draft"


def parse_device_ids(text: str | None, option: str = "--gpu-device-ids") -> tuple[int, ...]:
    """``"0,1"`` -> (0, 1); () for None/empty; SpecserveError for anything else."""
    if text is None or not text.strip():
        return ()
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and p.isascii() for p in parts):
        raise SpecserveError(f"{option} {text!r}: expected comma-separated non-negative "
                             "integers, e.g. 0 or 0,1")
    ids = tuple(int(p) for p in parts)
    if len(set(ids)) != len(ids):
        raise SpecserveError(f"{option} {text!r}: a device is listed twice")
    return ids


def shares_gpu(cfg: EngineRecord, opts: RepoOptions) -> bool:
    """Target and draft TensorRT-LLM engines on a common GPU. Unset ids are the executor's
    default placement: ranks 0..world_size-1 (the draft is one rank)."""
    if not trtllm_draft(cfg):
        return False
    target = parse_device_ids(opts.gpu_device_ids) or tuple(range(cfg.world_size))
    draft = parse_device_ids(opts.draft_gpu_device_ids, "--draft-gpu-device-ids") or (0,)
    return bool(set(target) & set(draft))


def kv_fractions(cfg: EngineRecord, opts: RepoOptions) -> tuple[float, float | None]:
    """(target, draft) ``kv_cache_free_gpu_mem_fraction``; draft None without a draft engine."""
    default = KV_FRACTION_SHARED if shares_gpu(cfg, opts) else KV_FRACTION_ALONE
    target = default if opts.kv_cache_fraction is None else opts.kv_cache_fraction
    if not trtllm_draft(cfg):
        return target, None
    draft = default if opts.draft_kv_cache_fraction is None else opts.draft_kv_cache_fraction
    return target, draft
