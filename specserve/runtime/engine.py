"""Load a ``torch`` engine directory made by ``specserve build`` into a ready
:class:`~specserve.runtime.decoder.SpecDecoder` (layout: docs/architecture.md, "Engine
directory"). ``build_config.json`` (read by :func:`specserve.engine_record.read_engine_record`)
fixes the speculation mode, dtype, tree and draft length; FP8 weights (e4m3 + per-channel scales,
:mod:`specserve.checkpoint`) are dequantized on load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.engine_record import EngineRecord, read_engine_record
from specserve.errors import SpecserveError
from specserve.runtime.decoder import SpecDecoder

_TORCH_MODES = ("medusa", "draft", "ngram", "eagle3", "none")


@dataclass(frozen=True)
class LoadedEngine:
    """A reference decoder, its tokenizer and the engine's build record."""

    decoder: SpecDecoder
    tokenizer: Any
    record: EngineRecord


def load_engine(engine_dir: str | Path, device: str = "cpu") -> LoadedEngine:
    """Build the decoder described by a torch engine directory."""
    from specserve.runtime import loader

    d = Path(engine_dir)
    rec = read_engine_record(d)
    if rec.backend != "torch":
        raise SpecserveError(f"{rec.path}: backend {rec.backend!r} engines run in TensorRT-LLM, "
                             "not in the reference decoder (build with --backend torch)")
    mode = rec.spec_mode
    if mode not in _TORCH_MODES:
        raise SpecserveError(f"{rec.path}: spec_mode {mode!r} is not supported by the torch "
                             "engine")
    decoder = loader.build_decoder(
        d / "target",
        medusa_dir=d / "medusa" if mode == "medusa" else None,
        draft_dir=d / "draft" if mode == "draft" else None,
        eagle3_dir=d / "eagle3" if mode == "eagle3" else None,
        ngram=mode == "ngram",
        max_draft_len=rec.max_draft_len,
        medusa_choices=rec.medusa_choices_list,
        eagle_choices=rec.get("eagle_choices") if mode == "eagle3" else None,  # static tree
        dtype=rec.dtype,
        device=device,
        # optional: end draft chains at unsure drafts (loader.build_decoder; 0 = off)
        draft_min_confidence=float(rec.get("draft_min_confidence") or 0.0),
        draft_len_schedule=rec.get("draft_len_schedule") or None,  # load-aware (optional)
        draft_len_policy=rec.get("draft_len_policy") or "adaptive",
        forced_drafts=mode != "none" and rec.get("forced_drafts") is not False,
        draft_window=int(rec.get("draft_window") or 0),  # windowed draft (optional)
    )
    tok_dir = d / "tokenizer" if (d / "tokenizer").is_dir() else d / "target"
    return LoadedEngine(decoder, loader.load_tokenizer(tok_dir), rec)
