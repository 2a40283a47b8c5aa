"""Read what the doctor compares: each side of a pairing (target, draft model, Medusa heads,
EAGLE-3 head) as a :class:`Side` of already-parsed files, so :mod:`specserve.doctor.checks`
stays pure.

Files read (Hugging Face layout): ``config.json``, ``generation_config.json``,
``tokenizer_config.json`` (and ``chat_template.jinja`` / ``chat_template.json``, where
transformers >= 4.43 keeps the template), ``hf_quant_config.json`` (NVIDIA ModelOpt's
quantization record), the tokenizer fingerprint of
:func:`specserve.checkpoint.tokenizer_fingerprint` and safetensors headers only (no tensor is
loaded here). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specserve.checkpoint import (
    MEDUSA_WEIGHT_FILES,
    TensorInfo,
    TokenizerFingerprint,
    model_weight_files,
    read_json,
    read_safetensors_header,
    tokenizer_fingerprint,
)
from specserve.errors import SpecserveError

Kind = Literal["target", "draft", "medusa", "eagle3"]
EAGLE3_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Side:
    """One directory of the pairing, parsed."""

    kind: Kind
    path: Path
    config: dict[str, Any]
    generation: dict[str, Any] | None = None  # generation_config.json
    tokenizer_config: dict[str, Any] | None = None
    chat_template: str | None = None
    tokenizer: TokenizerFingerprint | None = None
    quant_config: dict[str, Any] | None = None  # hf_quant_config.json (ModelOpt)
    weight_bytes: int = 0
    tensors: dict[str, TensorInfo] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return "EAGLE-3 head" if self.kind == "eagle3" else (
            "Medusa heads" if self.kind == "medusa" else self.kind)


def _optional_json(path: Path) -> dict[str, Any] | None:
    return read_json(path) if path.is_file() else None


def chat_template_of(d: Path, tok_cfg: dict[str, Any] | None) -> str | None:
    """The chat template saved in ``d``: ``chat_template.jinja``, ``chat_template.json`` or the
    ``chat_template`` key of ``tokenizer_config.json`` (a string, or a list of named ones)."""
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    as_json = _optional_json(d / "chat_template.json")
    value = (as_json or {}).get("chat_template") or (tok_cfg or {}).get("chat_template")
    if isinstance(value, list):
        value = "\n".join(str(t.get("template", "")) for t in value if isinstance(t, dict))
    return value if isinstance(value, str) and value.strip() else None


def _tensors(files: list[Path]) -> tuple[dict[str, TensorInfo], int]:
    tensors: dict[str, TensorInfo] = {}
    for f in files:
        tensors.update(read_safetensors_header(f))
    return tensors, sum(f.stat().st_size for f in files)


def read_side(path: str | Path, kind: Kind, tokenizer_dir: str | Path | None = None) -> Side:
    """Parse ``path`` as ``kind``; ``tokenizer_dir`` (default ``path``) holds its tokenizer."""
    d = Path(path)
    if not d.is_dir():
        raise SpecserveError(f"{d}: {kind} directory not found")
    config = read_json(d / "config.json")
    tensors: dict[str, TensorInfo] = {}
    size = 0
    if kind in ("target", "draft"):
        tensors, size = _tensors(model_weight_files(d))
    elif kind == "eagle3" and (d / EAGLE3_WEIGHTS).is_file():
        tensors, size = _tensors([d / EAGLE3_WEIGHTS])
    elif kind == "medusa":
        files = [d / n for n in MEDUSA_WEIGHT_FILES if (d / n).is_file()]
        if not files:
            raise SpecserveError(f"{d}: no {' or '.join(MEDUSA_WEIGHT_FILES)}")
        if files[0].suffix == ".safetensors":
            tensors, size = _tensors(files[:1])
        else:
            size = files[0].stat().st_size
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else d
    tok_cfg = _optional_json(tok_dir / "tokenizer_config.json")
    has_tok = (tok_dir / "tokenizer.json").is_file() or (tok_dir / "tokenizer.model").is_file()
    return Side(kind=kind, path=d, config=config,
                generation=_optional_json(d / "generation_config.json"),
                tokenizer_config=tok_cfg, chat_template=chat_template_of(tok_dir, tok_cfg),
                tokenizer=tokenizer_fingerprint(tok_dir) if has_tok else None,
                quant_config=_optional_json(d / "hf_quant_config.json"),
                weight_bytes=size, tensors=tensors)
