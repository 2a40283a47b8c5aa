"""Load a ``torch`` engine directory made by ``specserve build`` into a ready
:class:`~specserve.runtime.decoder.SpecDecoder` (layout: docs/architecture.md, "Engine
directory"). ``build_config.json`` fixes the speculation mode, dtype, tree and draft length;
FP8 weights (e4m3 + per-channel scales, :mod:`specserve.build.fp8`) are dequantized on load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.build.validate import read_json
from specserve.errors import SpecserveError
from specserve.runtime.decoder import SpecDecoder

_REQUIRED_KEYS = ("backend", "spec_mode", "dtype", "max_draft_len")


@dataclass(frozen=True)
class LoadedEngine:
    """A reference decoder, its tokenizer and the engine's build record."""

    decoder: SpecDecoder
    tokenizer: Any
    build_config: dict[str, Any]


def read_build_config(engine_dir: str | Path) -> dict[str, Any]:
    """``build_config.json`` of an engine dir, checked for the keys the loader needs."""
    d = Path(engine_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: engine directory not found")
    path = d / "build_config.json"
    rec = read_json(path)
    missing = [k for k in _REQUIRED_KEYS if k not in rec]
    if missing:
        raise SpecserveError(f"{path}: missing keys {missing}")
    return rec


def load_engine(engine_dir: str | Path, device: str = "cpu") -> LoadedEngine:
    """Build the decoder described by a torch engine directory."""
    from specserve.runtime import loader

    d = Path(engine_dir)
    rec = read_build_config(d)
    path = d / "build_config.json"
    if rec["backend"] != "torch":
        raise SpecserveError(f"{path}: backend {rec['backend']!r} engines run in TensorRT-LLM, "
                             "not in the reference decoder (build with --backend torch)")
    mode = rec["spec_mode"]
    parts = {"medusa": "medusa", "draft": "draft"}
    if mode in parts and not (d / parts[mode]).is_dir():
        raise SpecserveError(f"{d}: spec_mode {mode!r} but no {parts[mode]}/ directory")
    if mode not in ("medusa", "draft", "ngram", "none"):
        raise SpecserveError(f"{path}: spec_mode {mode!r} is not supported by the torch engine")
    decoder = loader.build_decoder(
        d / "target",
        medusa_dir=d / "medusa" if mode == "medusa" else None,
        draft_dir=d / "draft" if mode == "draft" else None,
        ngram=mode == "ngram",
        max_draft_len=int(rec["max_draft_len"]),
        medusa_choices=rec.get("medusa_choices"),
        dtype=str(rec["dtype"]),
        device=device,
        # optional: end draft chains at unsure drafts (loader.build_decoder; 0 = off)
        draft_min_confidence=float(rec.get("draft_min_confidence") or 0.0),
    )
    tok_dir = d / "tokenizer" if (d / "tokenizer").is_dir() else d / "target"
    return LoadedEngine(decoder, loader.load_tokenizer(tok_dir), rec)
