"""Checks of a PyTorch-route (LLM API) build config that need no files, against the release
line ``--trtllm-version`` names (the facts: :mod:`specserve.build.llmapi_keys`), and the parsed
``--spec-option KEY=VALUE`` pairs. Every failure is one :class:`~specserve.errors.SpecserveError`
line naming the option and, for a key of another release, the PR that added or renamed it."""

from __future__ import annotations

from typing import Any

from specserve.build.config import BuildConfig
from specserve.build.llmapi_keys import (
    DECODING_TYPES,
    GONE_IN_13,
    LATER_KEYS,
    spec_options_for,
    upper_bound_schedule,
)
from specserve.build.pins import RELEASES
from specserve.errors import SpecserveError


def validate_pytorch_config(cfg: BuildConfig) -> None:
    """Checks of a PyTorch-route config that need no files (one SpecserveError line)."""
    mode = cfg.spec_mode
    if cfg.dtype == "float32" and cfg.quantize == "fp8":
        raise SpecserveError("--dtype float32 with --quantize fp8: use float16 or bfloat16")
    if cfg.kv_cache_fraction is not None and not 0 < cfg.kv_cache_fraction <= 1:
        raise SpecserveError(f"--kv-cache-fraction {cfg.kv_cache_fraction}: must be in (0, 1] "
                             "(kv_cache_config.free_gpu_memory_fraction)")
    for name in ("max_num_tokens", "ngram_size", "max_concurrency", "dynamic_tree_top_k",
                 "max_total_draft_tokens"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise SpecserveError(f"--{name.replace('_', '-')}: must be >= 1, got {value}")
    sizes = cfg.cuda_graph_batch_sizes
    if sizes is not None and (not sizes or min(sizes) < 1 or max(sizes) > cfg.max_batch_size):
        raise SpecserveError(f"--cuda-graph-batch-sizes {','.join(map(str, sizes))}: each must "
                             f"be in 1..--max-batch-size {cfg.max_batch_size}")
    _check_method_options(cfg, mode)
    _check_schedule(cfg, mode)
    spec_option_values(cfg)


def _check_method_options(cfg: BuildConfig, mode: str) -> None:
    only = {"eagle_choices": "eagle3", "dynamic_tree_top_k": "eagle3",
            "max_total_draft_tokens": "eagle3", "ngram_size": "ngram"}
    for name, owner in only.items():
        if getattr(cfg, name) is not None and mode != owner:
            raise SpecserveError(f"--{name.replace('_', '-')}: only with --{owner}")
    rel = RELEASES[cfg.trtllm_version]
    if cfg.dynamic_tree_top_k is not None and not rel.dynamic_tree:
        raise SpecserveError(f"--dynamic-tree-top-k/--max-total-draft-tokens: not in TensorRT-LLM "
                             f"{rel.name} (its validate_eagle_config overwrites "
                             "max_total_draft_tokens with max_draft_len, and the PyTorch dynamic "
                             "tree lands in #12062/#13081, 2026); use --trtllm-version 1.3")
    if cfg.eagle_choices is not None and not rel.eagle3_one_model:
        raise SpecserveError(f"--eagle-choices: TensorRT-LLM {rel.name}'s Eagle3DecodingConfig "
                             "has no eagle3_one_model to select the two-model path that "
                             "upstream's static trees run on; use --trtllm-version 1.2.1, or a "
                             "chain")
    if cfg.eagle_choices is not None and cfg.dynamic_tree_top_k is not None:
        raise SpecserveError("--eagle-choices and --dynamic-tree-top-k: a static tree or a "
                             "dynamic one (1.2.1's EagleDecodingConfig refuses both)")
    if (cfg.dynamic_tree_top_k is None) != (cfg.max_total_draft_tokens is None):
        raise SpecserveError("--dynamic-tree-top-k and --max-total-draft-tokens: the dynamic "
                             "tree needs both (dynamic_tree_max_topK, max_total_draft_tokens)")
    if cfg.eagle_choices is not None:
        from specserve.spec.tree import MedusaTree

        MedusaTree.from_choices(cfg.eagle_choices)  # prefix-closed, or one line


def _check_schedule(cfg: BuildConfig, mode: str) -> None:
    if cfg.draft_len_schedule is None and cfg.max_concurrency is None:
        return
    rel = RELEASES[cfg.trtllm_version]
    if cfg.draft_len_schedule is not None and cfg.max_concurrency is not None:
        raise SpecserveError("--draft-len-schedule and --max-concurrency: mutually exclusive "
                             f"in TensorRT-LLM {rel.name} (give one)")
    if mode == "mtp" and rel.schedule_keys == "lower":
        raise SpecserveError("--draft-len-schedule/--max-concurrency with --mtp: 1.2.1 applies "
                             "them on two-model Drafter paths only, and MTP runs one-model")
    if cfg.draft_len_schedule is None:
        return
    from specserve.spec.schedule import DraftSchedule

    sched = DraftSchedule.parse(cfg.draft_len_schedule)
    k1, top = sched.at(1), max(v for _, v in sched.points)
    if cfg.max_draft_len is not None and k1 != cfg.max_draft_len:
        raise SpecserveError(f"--draft-len-schedule {sched.text()}: {rel.name} requires "
                             f"draft_len_schedule[1] == max_draft_len ({k1} != "
                             f"{cfg.max_draft_len})")
    if top > k1:
        raise SpecserveError(f"--draft-len-schedule {sched.text()}: every draft length must be "
                             f"<= draft_len_schedule[1] = max_draft_len {k1}")
    if rel.schedule_keys == "upper":
        upper_bound_schedule(sched.points, cfg.max_batch_size)  # or one line


def _scalar(text: str) -> Any:
    """A ``--spec-option`` value: true/false, an int, a float, or the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def spec_option_values(cfg: BuildConfig) -> dict[str, Any]:
    """``--spec-option KEY=VALUE`` pairs, each a field of the method's config in the release
    the YAML targets (``--trtllm-version``)."""
    rel = RELEASES[cfg.trtllm_version]
    allowed = spec_options_for(cfg.spec_mode, rel)
    out: dict[str, Any] = {}
    for key, value in cfg.spec_options:
        if rel.name == "1.2.1" and key in LATER_KEYS:
            raise SpecserveError(f"--spec-option {key}: not in TensorRT-LLM 1.2.1 (added by "
                                 f"{LATER_KEYS[key]}; --trtllm-version 1.3 has it)")
        if rel.name != "1.2.1" and key in GONE_IN_13:
            raise SpecserveError(f"--spec-option {key}: not in TensorRT-LLM {rel.name} "
                                 f"({GONE_IN_13[key]})")
        if key not in allowed:
            raise SpecserveError(f"--spec-option {key}: not a {rel.name} field of "
                                 f"{DECODING_TYPES.get(cfg.spec_mode, cfg.spec_mode)}'s config "
                                 f"that specserve passes through (one of: {', '.join(allowed)})")
        out[key] = _scalar(value)
    return out
