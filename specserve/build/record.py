"""``build_config.json``: every input, resolved defaults, input file hashes, package versions
and the exact commands of a build, so that it can be repeated and checked.

The record holds no timestamps or absolute temp paths: the same inputs give the same bytes.
Its typed keys (docs/architecture.md): ``backend``, ``flow`` (``engine`` | ``pytorch``: the
TensorRT-LLM route; the PyTorch route's engine directory holds ``extra_llm_api_options.yaml``),
``spec_mode``, ``max_batch_size``,
``max_input_len``, ``max_seq_len``, ``max_draft_len``, ``medusa_choices``, ``dtype``,
``quantize``, ``kv_cache_dtype``, ``tp_size``, ``pp_size``, ``world_size``; every reader uses
:func:`specserve.engine_record.read_engine_record`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specserve.build.config import BuildConfig
from specserve.build.pins import DEFAULT_RELEASE
from specserve.checkpoint import sha256_file
from specserve.versions import collect_versions

RECORD_VERSION = 1
_HASHED_NAMES = ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                 "model.safetensors.index.json", "medusa_lm_head.safetensors",
                 "medusa_lm_head.pt")
_HASHED_SUFFIXES = (".safetensors", ".bin", ".pt")


def input_hashes(cfg: BuildConfig) -> dict[str, str]:
    """sha256 of the files each input directory contributes, keyed ``role/file``."""
    out: dict[str, str] = {}
    roles = {"model": cfg.model, "medusa": cfg.medusa, "draft": cfg.draft, "eagle": cfg.eagle,
             "eagle3": cfg.eagle3}
    for role, d in roles.items():
        if d is None:
            continue
        for f in sorted(Path(d).iterdir()):
            if f.is_file() and (f.name in _HASHED_NAMES or f.suffix in _HASHED_SUFFIXES):
                out[f"{role}/{f.name}"] = sha256_file(f)
    return out


def package_versions() -> dict[str, str | None]:
    return collect_versions(("torch", "transformers", "safetensors", "tokenizers",
                             "tensorrt_llm"))


def cli_argv(cfg: BuildConfig) -> list[str]:
    """The ``specserve build`` command line that repeats this build (resolved values)."""
    argv = ["specserve", "build", "--model", cfg.model]
    argv += {"medusa": ["--medusa", str(cfg.medusa)], "draft": ["--draft", str(cfg.draft)],
             "eagle": ["--eagle", str(cfg.eagle)], "ngram": ["--ngram"],
             "eagle3": ["--eagle3", str(cfg.eagle3)], "mtp": ["--mtp"],
             "lookahead": ["--lookahead", str(cfg.lookahead)]}[cfg.spec_mode]
    argv += ["--backend", cfg.backend]
    if cfg.flow != "engine":
        argv += ["--flow", cfg.flow]
    argv += ["--dtype", cfg.dtype]
    if cfg.quantize:
        argv += ["--quantize", cfg.quantize]
    if cfg.kv_cache_dtype:
        argv += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    argv += ["--tp", str(cfg.tp_size), "--pp", str(cfg.pp_size),
             "--max-batch-size", str(cfg.max_batch_size),
             "--max-input-len", str(cfg.max_input_len), "--max-seq-len", str(cfg.max_seq_len),
             "--max-draft-len", str(cfg.max_draft_len)]
    if cfg.medusa_choices is not None:
        from specserve.spec.tree import to_brace

        argv += ["--medusa-choices", to_brace(cfg.medusa_choices)]
    if cfg.draft_len_schedule:
        from specserve.spec.schedule import DraftSchedule

        argv += ["--draft-len-schedule", DraftSchedule.parse(cfg.draft_len_schedule).text()]
    if cfg.draft_window:
        argv += ["--draft-window", str(cfg.draft_window)]
    if cfg.draft_len_policy:
        argv += ["--draft-len-policy", cfg.draft_len_policy]
    if cfg.forced_drafts is not None:
        argv += ["--forced-drafts" if cfg.forced_drafts else "--no-forced-drafts"]
    return argv + _pytorch_argv(cfg) + ["--out", cfg.out]


def _pytorch_argv(cfg: BuildConfig) -> list[str]:
    """The PyTorch route's own flags (on the engine flow: the torch EAGLE-3 tree only)."""
    from specserve.spec.tree import to_brace

    if cfg.flow != "pytorch":
        return ["--eagle-choices", to_brace(cfg.eagle_choices)] if cfg.eagle_choices else []

    argv: list[str] = []
    values = {"--eagle-choices": to_brace(cfg.eagle_choices) if cfg.eagle_choices else None,
              "--dynamic-tree-top-k": cfg.dynamic_tree_top_k,
              "--max-total-draft-tokens": cfg.max_total_draft_tokens,
              "--ngram-size": cfg.ngram_size, "--max-num-tokens": cfg.max_num_tokens,
              "--kv-cache-fraction": cfg.kv_cache_fraction,
              "--cuda-graph-batch-sizes": ",".join(map(str, cfg.cuda_graph_batch_sizes))
              if cfg.cuda_graph_batch_sizes else None,
              "--max-concurrency": cfg.max_concurrency}
    for flag, value in values.items():
        if value is not None:
            argv += [flag, str(value)]
    if cfg.block_reuse is not None:
        argv.append("--block-reuse" if cfg.block_reuse else "--no-block-reuse")
    for key, value in cfg.spec_options:
        argv += ["--spec-option", f"{key}={value}"]
    if cfg.trtllm_version != DEFAULT_RELEASE:
        argv += ["--trtllm-version", cfg.trtllm_version]
    return argv


def make_record(cfg: BuildConfig, commands: list[list[str]],
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole ``build_config.json`` for a resolved config."""
    rec: dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "backend": cfg.backend,
        "flow": cfg.flow,  # engine | pytorch: which TensorRT-LLM route (torch engines: engine)
        "spec_mode": cfg.spec_mode,
        "max_batch_size": cfg.max_batch_size,
        "max_input_len": cfg.max_input_len,
        "max_seq_len": cfg.max_seq_len,
        "max_draft_len": cfg.max_draft_len,
        "medusa_choices": [list(p) for p in cfg.medusa_choices]
        if cfg.medusa_choices is not None else None,
        "dtype": cfg.dtype,
        "quantize": cfg.quantize,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "tp_size": cfg.tp_size,
        "pp_size": cfg.pp_size,
        "world_size": cfg.world_size,
        "config": cfg.to_dict(),
        **({"eagle_choices": [list(p) for p in cfg.eagle_choices]}  # torch EAGLE-3 tree
           if cfg.eagle_choices is not None and cfg.flow == "engine" else {}),
        "input_hashes": input_hashes(cfg),
        "versions": package_versions(),
        "command": cli_argv(cfg),
        "commands": commands,
    }
    if cfg.draft_len_schedule:  # read by runtime/engine.py (absent: no schedule)
        from specserve.spec.schedule import DraftSchedule

        rec["draft_len_schedule"] = DraftSchedule.parse(cfg.draft_len_schedule).text()
    if cfg.draft_len_policy:  # read by runtime/engine.py (absent: adaptive)
        rec["draft_len_policy"] = cfg.draft_len_policy
    if cfg.forced_drafts is not None:  # read by runtime/engine.py (absent: on if speculative)
        rec["forced_drafts"] = cfg.forced_drafts
    if cfg.draft_window:  # read by runtime/engine.py (absent: the whole context)
        rec["draft_window"] = cfg.draft_window
    if cfg.lookahead is not None:  # read by triton/params.py (the lookahead_* parameters)
        from specserve.spec.lookahead import Lookahead

        rec["lookahead"] = Lookahead.parse(cfg.lookahead).to_dict()
    rec.update(extra or {})
    return rec
