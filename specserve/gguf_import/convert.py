"""``specserve import``: a GGUF file becomes a Hugging Face checkpoint directory.

Config and tokenizer come from transformers' GGUF integration (``AutoConfig`` /
``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, which read the metadata table and
``tokenizer.ggml.*``, the chat template included); tensors from the ``gguf`` package
(:mod:`specserve.gguf_import.tensors`). The output is written into a staging directory and
swapped into place only when complete (:mod:`specserve.outputs`): ``config.json``,
``generation_config.json``, ``model.safetensors`` (or shards with an index), the tokenizer files
and ``specserve_import.json`` (the source's sha256, size, tensor types, versions).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.checkpoint import check_family
from specserve.errors import SpecserveError
from specserve.gguf_import.source import (
    GGUFSummary,
    check_importable,
    field_value,
    open_reader,
    summarize,
)
from specserve.gguf_import.tensors import hf_tensor, hf_to_gguf_names
from specserve.outputs import check_replaceable, staged_output
from specserve.train.progress import NullReporter, Reporter

if TYPE_CHECKING:
    import torch
    from gguf import GGUFReader, ReaderTensor

WRITER = "specserve import"
PROVENANCE = "specserve_import.json"
DTYPES = ("float32", "bfloat16", "float16")
SHARD_BYTES = 2 << 30


@dataclass(frozen=True)
class ImportConfig:
    gguf: Path
    out: Path
    dtype: str = "float32"
    force: bool = False
    shard_bytes: int = SHARD_BYTES


@dataclass(frozen=True)
class ImportResult:
    out: Path
    model_type: str
    parameters: int
    weight_files: tuple[str, ...]
    source: GGUFSummary
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "model_type": self.model_type,
                "parameters": self.parameters, "weight_files": list(self.weight_files),
                "dtype": self.dtype, "source": self.source.to_dict()}


@dataclass(frozen=True)
class _Plan:
    """Which GGUF tensor becomes which Hugging Face tensor, checked before anything is written."""

    config: Any  # transformers PretrainedConfig
    pairs: tuple[tuple[ReaderTensor, str], ...]
    heads: tuple[int, int]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _hf_config(path: Path, reader: GGUFReader, arch: str) -> Any:
    """transformers' config of the file, with ``head_dim`` from ``<arch>.attention.key_length``
    where the file states one: transformers 5 maps no head size for qwen2/qwen3 and keeps the
    class default (128 for Qwen3), wrong for any model whose heads are not 128 wide."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, TypeError, NotImplementedError, OSError) as e:
        raise SpecserveError(f"{path}: transformers cannot read its config: {_first_line(e)}"
                             ) from None
    key_length = field_value(reader, f"{arch}.attention.key_length")
    if key_length is not None and hasattr(config, "head_dim"):
        config.head_dim = int(key_length)
    return config


def _expected_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Every parameter of the Hugging Face model of ``config`` and its shape (meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def plan(path: Path, reader: GGUFReader, arch: str) -> _Plan:
    """Match GGUF tensors to the Hugging Face model's; refuse extra, missing or misshapen ones."""
    config = _hf_config(path, reader, arch)
    check_family(config.to_dict(), path)
    names = {t.name: t for t in reader.tensors}
    config.tie_word_embeddings = "output.weight" not in names
    shapes = _expected_shapes(config)
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    to_hf = hf_to_gguf_names(arch, int(config.num_hidden_layers), sorted(shapes))
    extra = sorted(set(names) - set(to_hf))
    if extra:
        raise SpecserveError(f"{path}: tensor {extra[0]} has no counterpart in a "
                             f"{config.model_type} checkpoint ({len(extra)} such tensors)")
    missing = sorted(set(shapes) - {to_hf[n] for n in names})
    if missing:
        raise SpecserveError(f"{path}: no tensor for {missing[0]} ({len(missing)} missing; "
                             "an incomplete or foreign file)")
    for gname, t in names.items():
        got = tuple(int(d) for d in reversed(t.shape.tolist()))
        if got != shapes[to_hf[gname]]:
            raise SpecserveError(f"{path}: tensor {gname} has shape {list(got)}, the config "
                                 f"implies {list(shapes[to_hf[gname]])}")
    heads = (int(config.num_attention_heads), int(config.num_key_value_heads))
    return _Plan(config=config, pairs=tuple((t, to_hf[t.name]) for t in reader.tensors),
                 heads=heads)


def _shards(pairs: tuple[tuple[ReaderTensor, str], ...], item_bytes: int,
            limit: int) -> list[list[tuple[ReaderTensor, str]]]:
    shards: list[list[tuple[ReaderTensor, str]]] = [[]]
    size = 0
    for t, name in pairs:
        n = int(t.n_elements) * item_bytes
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((t, name))
        size += n
    return shards


def _write_weights(stage: Path, p: _Plan, arch: str, dtype: torch.dtype, limit: int,
                   rep: Reporter) -> tuple[str, ...]:
    from safetensors.torch import save_file

    shards = _shards(p.pairs, dtype.itemsize, limit)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    rep.start("dequantize", len(p.pairs))
    done, index = 0, {}
    for fname, shard in zip(files, shards, strict=True):
        tensors = {}
        for t, name in shard:
            tensors[name] = hf_tensor(t, name, arch, p.heads, dtype)
            index[name] = fname
            done += 1
            rep.update(done, t.name)
        save_file(tensors, str(stage / fname), metadata={"format": "pt"})
    if len(files) > 1:
        total = sum(int(t.n_elements) * dtype.itemsize for t, _ in p.pairs)
        (stage / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(index.items()))},
            indent=2), encoding="utf-8")
    return tuple(files)


def _write_config(stage: Path, config: Any, dtype: str) -> None:
    from transformers import GenerationConfig

    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    config.dtype = dtype
    config.save_pretrained(str(stage))
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=getattr(config, "pad_token_id", None)
                     ).save_pretrained(str(stage))


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, TypeError, NotImplementedError, OSError) as e:
        raise SpecserveError(f"{path}: transformers cannot read its tokenizer: "
                             f"{_first_line(e)}") from None


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("gguf", "transformers", "torch", "specserve"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out


@dataclass(frozen=True)
class PreparedImport:
    """A checked import: the source is readable and supported, every tensor has its place."""

    cfg: ImportConfig
    arch: str
    plan: _Plan
    tokenizer: Any  # transformers tokenizer, built from tokenizer.ggml.*
    source: GGUFSummary


def prepare_import(cfg: ImportConfig) -> PreparedImport:
    """Every check that can refuse the import, before anything is written (seconds)."""
    if cfg.dtype not in DTYPES:
        raise SpecserveError(f"--dtype {cfg.dtype!r}: expected one of {', '.join(DTYPES)}")
    reader = open_reader(cfg.gguf)
    arch, census = check_importable(cfg.gguf, reader)
    with _quiet_transformers():
        p = plan(cfg.gguf, reader, arch)
        tok = _tokenizer(cfg.gguf)
    check_replaceable(cfg.out, cfg.force, WRITER)
    return PreparedImport(cfg=cfg, arch=arch, plan=p, tokenizer=tok,
                          source=summarize(cfg.gguf, reader, arch, census))


def write_import(prep: PreparedImport, rep: Reporter | None = None) -> ImportResult:
    """Write the checkpoint of a prepared import into a stage swapped into place at the end."""
    import torch

    cfg, p = prep.cfg, prep.plan
    rep = rep or NullReporter()
    with staged_output(cfg.out, cfg.force, WRITER) as stage:
        files = _write_weights(stage, p, prep.arch, getattr(torch, cfg.dtype), cfg.shard_bytes,
                               rep)
        with _quiet_transformers():
            _write_config(stage, p.config, cfg.dtype)
            prep.tokenizer.save_pretrained(str(stage))
        params = sum(int(t.n_elements) for t, _ in p.pairs)
        record = {"source": prep.source.to_dict(), "dtype": cfg.dtype, "parameters": params,
                  "model_type": p.config.model_type, "weight_files": list(files),
                  "tie_word_embeddings": bool(p.config.tie_word_embeddings),
                  "versions": _versions()}
        (stage / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return ImportResult(out=cfg.out, model_type=str(p.config.model_type), parameters=params,
                        weight_files=files, source=prep.source, dtype=cfg.dtype)


def import_gguf(cfg: ImportConfig, rep: Reporter | None = None) -> ImportResult:
    """Convert ``cfg.gguf`` into a Hugging Face directory at ``cfg.out`` (see module doc)."""
    return write_import(prepare_import(cfg), rep)


class _quiet_transformers:  # noqa: N801 - used as a context manager like a function
    """transformers logs each GGUF parse at INFO/WARNING; a user needs none of it."""

    def __enter__(self) -> None:
        self._logger = logging.getLogger("transformers")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        self._logger.setLevel(self._level)
