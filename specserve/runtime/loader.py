"""Assemble a :class:`SpecDecoder` from local checkpoint directories, and run one text prompt.

The adapter between files and the decoder: loads the target, then at most one proposer (Medusa
heads in the FasterDecoding layout, a draft model with a matching tokenizer, or n-gram lookup),
each checked by :mod:`specserve.checkpoint` / :mod:`specserve.runtime.checkpoint` so bad input is
one SpecserveError line.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from specserve.checkpoint import check_tokenizers_match
from specserve.errors import SpecserveError
from specserve.runtime.checkpoint import load_medusa_heads
from specserve.runtime.decoder import SpecDecoder
from specserve.runtime.draft_policy import DraftLenPolicy
from specserve.runtime.forced_drafts import ForcedDrafts
from specserve.runtime.model import load_model
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers import (
    DraftModelProposer,
    MedusaProposer,
    NgramProposer,
    Proposer,
)
from specserve.spec.schedule import DraftSchedule
from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise SpecserveError(f"dtype {name!r} not supported (choose from {sorted(DTYPES)})")
    return DTYPES[name]


def medusa_tree(num_heads: int, choices: str | list[list[int]] | None = None) -> MedusaTree:
    """The given tree (brace or list form; its depth must not exceed ``num_heads``), or by default
    Medusa's ``mc_sim_7b_63`` restricted to paths no deeper than ``num_heads``."""
    if choices is None:
        return MedusaTree.from_choices([c for c in MC_SIM_7B_63 if len(c) <= num_heads])
    if isinstance(choices, str):
        return MedusaTree.from_brace(choices, num_heads)
    return MedusaTree.from_choices(choices, num_heads)


def _eagle_tree(choices: str | list[list[int]] | None) -> list[list[int]] | None:
    """``--eagle-choices`` (brace or list form) as a validated list, or one error line."""
    if choices is None:
        return None
    try:
        tree = MedusaTree.from_brace(choices) if isinstance(choices, str) else \
            MedusaTree.from_choices(choices)
    except SpecserveError as e:
        raise SpecserveError(f"--eagle-choices: {str(e).removeprefix('medusa_choices: ')}") \
            from e
    return tree.to_list()


def build_decoder(
    model_dir: str | Path,
    *,
    medusa_dir: str | Path | None = None,
    draft_dir: str | Path | None = None,
    ngram: bool = False,
    max_draft_len: int = 4,
    medusa_choices: str | list[list[int]] | None = None,
    medusa_acceptance: str = "greedy",
    dtype: str = "float32",
    device: str = "cpu",
    adaptive_draft_len: bool = False,
    draft_min_confidence: float = 0.0,
    draft_dtype: str | None = None,
    draft_len_schedule: str | None = None,
    draft_len_policy: str = "fixed",
    forced_drafts: bool = False,
    draft_window: int = 0,
    eagle3_dir: str | Path | None = None,
    eagle_choices: str | list[list[int]] | None = None,
) -> SpecDecoder:
    """A decoder over ``model_dir`` with at most one of Medusa heads, a draft model, n-gram.

    ``draft_min_confidence`` > 0: the draft model ends its chain (of at most ``max_draft_len``)
    at a draft it gives probability below this (HF's ``assistant_confidence_threshold``), so a
    large ``max_draft_len`` costs little where the draft is unsure. ``draft_dtype`` (default:
    ``dtype``) runs the draft model in another dtype: its proposals only steer acceptance, so any
    dtype is lossless (on CPU a float32 draft beside a bfloat16 target is ~1.5x faster here).
    ``draft_len_schedule`` ("1:4,8:2,16:0"): load-aware draft budget by batch size
    (:mod:`specserve.spec.schedule`). ``draft_len_policy`` "adaptive": the draft length per
    step from measured acceptance and step cost (:mod:`specserve.runtime.draft_policy`); "fixed":
    ``max_draft_len`` (within the schedule). ``forced_drafts``: structured output's
    grammar-forced tokens as drafts (:mod:`specserve.runtime.forced_drafts`).
    ``draft_window`` > 0: the draft model proposes from the last ``draft_window`` keys
    (:attr:`DraftModelProposer.window`). ``eagle_choices`` (brace or list form): a static
    EAGLE-3 tree instead of the chain of ``max_draft_len``."""
    if not 0.0 <= draft_min_confidence <= 1.0:
        raise SpecserveError(f"draft_min_confidence must be in [0, 1], got {draft_min_confidence}")
    if draft_window < 0 or (draft_window and draft_dir is None):
        raise SpecserveError(f"draft_window {draft_window}: >= 1 and only with a draft model")
    if sum([medusa_dir is not None, draft_dir is not None, ngram, eagle3_dir is not None]) > 1:
        raise SpecserveError("choose at most one of --medusa, --draft, --ngram, --eagle3")
    if eagle_choices is not None and eagle3_dir is None:
        raise SpecserveError("--eagle-choices: only with --eagle3")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecserveError(f"device {device!r}: CUDA is not available")
    torch_dtype = parse_dtype(dtype)
    if draft_dir is not None:
        check_tokenizers_match(model_dir, draft_dir)
    target = load_model(model_dir, torch_dtype, device)
    proposer: Proposer | None = None
    if medusa_dir is not None:
        heads = load_medusa_heads(medusa_dir, target.cfg.hidden_size, target.cfg.vocab_size)
        tree = medusa_tree(heads.num_heads, medusa_choices)
        proposer = MedusaProposer(heads.to(device=device, dtype=torch_dtype), tree,
                                  medusa_acceptance)
    elif eagle3_dir is not None:
        from specserve.runtime.eagle3_dir import load_eagle3
        from specserve.runtime.proposers.eagle3 import Eagle3Proposer

        head = load_eagle3(eagle3_dir, target.cfg, torch_dtype, device)
        proposer = Eagle3Proposer(head, max_draft_len, _eagle_tree(eagle_choices))
    elif draft_dir is not None:
        ddtype = torch_dtype if draft_dtype is None else parse_dtype(draft_dtype)
        draft = DraftModelProposer(load_model(draft_dir, ddtype, device), max_draft_len)
        draft.min_confidence = draft_min_confidence
        draft.window = draft_window
        proposer = draft
    elif ngram:
        proposer = NgramProposer(max_draft_len, device=device)
    schedule = DraftSchedule.parse(draft_len_schedule) if draft_len_schedule else None
    if draft_len_policy not in ("adaptive", "fixed"):
        raise SpecserveError(f"draft_len_policy {draft_len_policy!r}: adaptive or fixed")
    policy = DraftLenPolicy() if draft_len_policy == "adaptive" else None
    return SpecDecoder(target, proposer, adaptive_draft_len=adaptive_draft_len,
                       schedule=schedule, draft_policy=policy,
                       forced=ForcedDrafts() if forced_drafts else None)


def load_tokenizer(model_dir: str | Path) -> Any:
    """The HF tokenizer saved in ``model_dir`` (local files only)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:
        raise SpecserveError(f"{model_dir}: cannot load the tokenizer ({e})") from e


def generate_text(decoder: SpecDecoder, tokenizer: Any, prompt: str,
                  params: SamplingParams) -> dict[str, Any]:
    """Encode, generate, decode: text, token ids, stats and wall-clock rates."""
    ids = list(tokenizer(prompt)["input_ids"])
    start = time.time_ns()
    (res,) = decoder.generate([ids], params)
    elapsed = max(res.last_token_time_ns - start, 1) / 1e9
    stats = res.stats.to_dict()
    return {
        "text": tokenizer.decode(res.token_ids, skip_special_tokens=True),
        "token_ids": res.token_ids,
        "prompt_tokens": len(ids),
        "finish_reason": res.finish_reason,
        "spec_mode": decoder.spec_mode,
        "stats": stats,
        "time_to_first_token_s": (res.first_token_time_ns - start) / 1e9,
        "tokens_per_s": len(res.token_ids) / elapsed,
    }
