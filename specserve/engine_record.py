"""The typed record of an engine directory: ``build_config.json``, read in one place.

``specserve build`` writes the record (:func:`specserve.build.record.make_record`); the reference
runtime, the Triton repository writer, the Triton Python model, ``specserve demo`` and the
``make engine`` reuse check all read it with :func:`read_engine_record`. Anything wrong with the
file (missing, not JSON, a key missing or of the wrong type, an engine part missing) is one
:class:`SpecserveError` line naming the file. This module imports only :mod:`specserve.config`
and :mod:`specserve.errors`, so every package can use it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specserve.config import read_json
from specserve.errors import SpecserveError

RECORD_FILE = "build_config.json"
BACKENDS = ("torch", "trtllm")
SPEC_MODES = ("medusa", "draft", "ngram", "eagle", "eagle3", "mtp", "lookahead", "none")
_POSITIVE_INTS = ("max_batch_size", "max_input_len", "max_seq_len", "tp_size", "pp_size",
                  "world_size")
_OPTIONAL_STRS = ("quantize", "kv_cache_dtype")
REQUIRED_KEYS = ("backend", "spec_mode", "max_batch_size", "max_input_len", "max_seq_len",
                 "max_draft_len", "medusa_choices", "dtype", "quantize", "kv_cache_dtype",
                 "tp_size", "pp_size", "world_size")


@dataclass(frozen=True)
class EngineRecord:
    """The keys of ``build_config.json`` that readers rely on (docs/architecture.md, "Engine
    directory"), checked; every other recorded key (``config``, ``input_hashes``,
    ``versions``, ``commands``, ...) is in ``raw``, the whole file as read."""

    path: Path  # the build_config.json this was read from
    backend: str  # "torch" | "trtllm"
    spec_mode: str  # "medusa" | "draft" | "ngram" | "eagle" | "none"
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    medusa_choices: tuple[tuple[int, ...], ...] | None
    dtype: str
    quantize: str | None
    kv_cache_dtype: str | None
    tp_size: int
    pp_size: int
    world_size: int
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def engine_dir(self) -> Path:
        return self.path.parent

    @property
    def medusa_choices_list(self) -> list[list[int]] | None:
        """``medusa_choices`` in the JSON (list of lists) form."""
        if self.medusa_choices is None:
            return None
        return [list(p) for p in self.medusa_choices]

    def get(self, key: str, default: Any = None) -> Any:
        """Any recorded key, typed or not (e.g. ``draft_min_confidence``)."""
        return self.raw.get(key, default)


def read_engine_record(engine_dir: str | Path) -> EngineRecord:
    """``ENGINE_DIR/build_config.json`` as an :class:`EngineRecord`, or one SpecserveError line."""
    d = Path(engine_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: engine directory not found")
    path = d / RECORD_FILE
    if not path.is_file():
        raise SpecserveError(f"{path}: not found (is {d} an engine directory from "
                             "`specserve build`?)")
    data = read_json(path)
    if not isinstance(data, dict):
        raise SpecserveError(f"{path}: expected a JSON object")
    return parse_engine_record(data, path)


def parse_engine_record(data: dict[str, Any], path: Path) -> EngineRecord:
    """Check a parsed ``build_config.json`` (``path`` names it in errors and locates the engine
    directory for the part checks)."""
    backend = data.get("backend")
    if backend not in BACKENDS:
        raise SpecserveError(f"{path}: backend must be 'torch' or 'trtllm', got {backend!r}")
    mode = data.get("spec_mode")
    if mode not in SPEC_MODES:
        raise SpecserveError(f"{path}: unknown spec_mode {mode!r} (expected one of "
                             f"{list(SPEC_MODES)})")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise SpecserveError(f"{path}: missing keys {missing} (not a record written by "
                             "`specserve build`?)")
    for key in _POSITIVE_INTS:
        _int(data, key, path, minimum=1)
    _int(data, "max_draft_len", path, minimum=0)
    if not isinstance(data["dtype"], str) or not data["dtype"]:
        raise SpecserveError(f"{path}: 'dtype' must be a string, got {data['dtype']!r}")
    for key in _OPTIONAL_STRS:
        if data[key] is not None and not isinstance(data[key], str):
            raise SpecserveError(f"{path}: {key!r} must be a string or null, got {data[key]!r}")
    rec = EngineRecord(
        path=path, backend=str(backend), spec_mode=str(mode),
        max_batch_size=data["max_batch_size"], max_input_len=data["max_input_len"],
        max_seq_len=data["max_seq_len"], max_draft_len=data["max_draft_len"],
        medusa_choices=_choices(data["medusa_choices"], path), dtype=data["dtype"],
        quantize=data["quantize"], kv_cache_dtype=data["kv_cache_dtype"],
        tp_size=data["tp_size"], pp_size=data["pp_size"], world_size=data["world_size"],
        raw=dict(data),
    )
    _check_parts(rec)
    return rec


def _int(data: dict[str, Any], key: str, path: Path, minimum: int) -> None:
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise SpecserveError(f"{path}: {key!r} must be {what}, got {value!r}")


def _choices(value: Any, path: Path) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    ok = isinstance(value, list) and all(
        isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                    for i in p) for p in value)
    if not ok:
        raise SpecserveError(f"{path}: 'medusa_choices' must be null or a list of lists of "
                             f"non-negative integers, got {str(value)[:60]}")
    return tuple(tuple(p) for p in value)


def _check_parts(rec: EngineRecord) -> None:
    """The engine parts the record's mode needs: ``draft/`` for draft-target (both backends),
    ``medusa/`` / ``eagle3/`` for torch Medusa / EAGLE-3 engines (TensorRT-LLM builds Medusa
    heads into the engine)."""
    if rec.raw.get("flow") == "pytorch":  # TensorRT-LLM's PyTorch route: one YAML, no parts
        return
    parts = ["draft"] if rec.spec_mode == "draft" else []
    if rec.spec_mode in ("medusa", "eagle3") and rec.backend == "torch":
        parts.append(rec.spec_mode)
    for part in parts:
        if not (rec.engine_dir / part).is_dir():
            raise SpecserveError(f"{rec.engine_dir / part}: missing (spec_mode "
                                 f"{rec.spec_mode!r} needs it; rebuild the engine)")
