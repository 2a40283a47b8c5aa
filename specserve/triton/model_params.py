"""The parameters of a reference ``tensorrt_llm`` model's ``config.pbtxt`` (written by
``specserve repo``, :mod:`specserve.triton.repository`): the engine directory, batching limits,
speculation on or off, which checkpoint it serves and the prefix-cache budget. Each value is
checked here; one the model does not serve is refused in one line, never ignored. The defaults
are the serving core's (:mod:`specserve.serving.engine_params`), which the Dynamo worker takes
too.

TensorRT-LLM's own ``enable_kv_cache_reuse`` is honoured as the switch of the prefix cache
(tensorrtllm_backend ``inflight_batcher_llm/src/model_instance_state.cc`` reads it with
``GetParameter<bool>`` into ``executor::KvCacheConfig``'s first argument, block reuse): "false"
turns it off, "true" keeps it on with the ``specserve_prefix_cache_mb`` budget. Left empty (a
template value not filled) it is on here, the reference engine's default; the C++ backend
takes an unset value as false."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.errors import SpecserveError
from specserve.serving.engine_params import (
    DEFAULT_MALLOC_TRIM_S,
    DEFAULT_MAX_PENDING,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFIX_CACHE_MB,
    prefix_cache_split,
)

_OFF = ("off", "false", "0")


@dataclass(frozen=True)
class ModelParams:
    """The parameters of a reference ``tensorrt_llm`` model's ``config.pbtxt``."""

    engine_dir: str
    max_batch: int = 1
    exclude_default: bool = False
    speculation: bool = True
    checkpoint: str = "target"  # "target" | "draft" (the draft checkpoint alone)
    max_pending: int = DEFAULT_MAX_PENDING
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB
    malloc_trim_s: float = DEFAULT_MALLOC_TRIM_S
    kv_cache_reuse: bool = True  # enable_kv_cache_reuse: False turns the prefix cache off

    @property
    def prefix_cache_bytes(self) -> tuple[int, int]:
        """The in-flight pool's and the verify calls' pool's budgets in bytes (0, 0 with
        ``enable_kv_cache_reuse`` false)."""
        return prefix_cache_split(self.prefix_cache_mb if self.kv_cache_reuse else 0)

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelParams:
        """From the model config (``args["model_config"]`` parsed); raises SpecserveError on a
        value the model does not serve. ``specserve_batching`` is gone (the model batches in
        flight only): a repository asking for anything else is refused, never ignored."""
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        batching = params.get("specserve_batching", "") or "inflight"
        if batching != "inflight":
            raise SpecserveError(f"parameter specserve_batching {batching!r} is not served: the "
                                 "reference tensorrt_llm model batches in flight only (remove "
                                 "the parameter)")
        checkpoint = params.get("specserve_checkpoint", "") or "target"
        if checkpoint not in ("target", "draft"):
            raise SpecserveError(f"parameter specserve_checkpoint must be 'target' or 'draft', "
                                 f"got {checkpoint!r}")
        if not params.get("gpt_model_path"):
            raise SpecserveError("parameter gpt_model_path (the engine directory) is empty")
        return cls(
            engine_dir=params["gpt_model_path"],
            max_batch=max(1, int(cfg.get("max_batch_size", 1))),
            exclude_default=params.get("exclude_input_in_output", "").lower() in ("true", "1"),
            speculation=params.get("specserve_speculation", "on").lower() not in _OFF,
            checkpoint=checkpoint,
            max_pending=max(1, _int_param(params, "specserve_max_pending", DEFAULT_MAX_PENDING)),
            prefill_chunk=_int_param(params, "specserve_prefill_chunk", DEFAULT_PREFILL_CHUNK),
            prefix_cache_mb=_nonneg(_int_param(params, "specserve_prefix_cache_mb",
                                               DEFAULT_PREFIX_CACHE_MB),
                                    "specserve_prefix_cache_mb"),
            malloc_trim_s=_seconds(params, "specserve_malloc_trim_s", DEFAULT_MALLOC_TRIM_S),
            kv_cache_reuse=_flag(params, "enable_kv_cache_reuse", default=True))


def _nonneg(value: int, key: str) -> int:
    if value < 0:
        raise SpecserveError(f"parameter {key} must be >= 0, got {value}")
    return value


def _flag(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip()
    if not value or value.startswith("${"):  # absent, or a template value left unfilled
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise SpecserveError(f"parameter {key} must be true or false, got {value!r}")


def _seconds(params: dict[str, str], key: str, default: float) -> float:
    value = params.get(key, "")
    try:
        seconds = float(value) if value else default
    except ValueError:
        raise SpecserveError(f"parameter {key} must be a number of seconds, got {value!r}") \
            from None
    if not seconds >= 0 or seconds == float("inf"):
        raise SpecserveError(f"parameter {key} must be >= 0 and finite, got {value!r}")
    return seconds


def _int_param(params: dict[str, str], key: str, default: int) -> int:
    value = params.get(key, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise SpecserveError(f"parameter {key} must be an integer, got {value!r}") from None
