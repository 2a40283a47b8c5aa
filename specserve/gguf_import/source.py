"""Opening a GGUF file and deciding whether it can be imported, before any tensor is converted.

GGUF (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): the magic
``GGUF``, a version, a key-value metadata table (``general.architecture``, ``<arch>.block_count``,
``tokenizer.ggml.*``, ...) and a table of tensors, each with a ggml type (F32, Q4_1, Q6_K, ...),
a shape in ggml order (fastest dimension first) and an offset into the aligned data section.
Parsing is :class:`gguf.GGUFReader`'s (the ``gguf`` package maintained in llama.cpp's
repository); this module only checks what it read against what specserve can import and turns
every problem into one :class:`SpecserveError` line.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.checkpoint import sha256_file
from specserve.errors import SpecserveError

if TYPE_CHECKING:
    from gguf import GGUFReader

MAGIC = b"GGUF"
#: ``general.architecture`` values imported, and the model family each becomes. llama.cpp
#: writes Mistral checkpoints as ``llama`` (transformers tells them apart by ``general.name``).
ARCHITECTURES = ("llama", "qwen2", "qwen3")
#: ggml tensor types imported: each is checked block by block against the format's definition in
#: ``tests/gguf_import/test_dequantize.py``.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                "Q6_K")


@dataclass(frozen=True)
class GGUFSummary:
    """What an import records about its source file (provenance)."""

    path: str
    bytes: int
    sha256: str
    version: int
    architecture: str
    name: str | None
    tensor_types: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256,
                "gguf_version": self.version, "architecture": self.architecture,
                "name": self.name, "tensor_types": dict(self.tensor_types)}


def _check_magic(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise SpecserveError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SpecserveError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise SpecserveError(f"{path}: cannot read ({e.strerror})") from None
    if head != MAGIC:
        raise SpecserveError(f"{path}: not a GGUF file (starts with {head!r}, expected {MAGIC!r})")


def open_reader(path: Path) -> GGUFReader:
    """A :class:`gguf.GGUFReader` over ``path``, or one line saying why the file is unreadable
    (not GGUF, truncated, corrupt)."""
    from gguf import GGUFReader

    _check_magic(path)
    try:
        reader = GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OverflowError, EOFError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SpecserveError(f"{path}: not a readable GGUF file (truncated or corrupt: "
                             f"{first})") from None
    _check_tensor_extents(path, reader)
    return reader


def _check_tensor_extents(path: Path, reader: GGUFReader) -> None:
    """Every tensor's bytes lie inside the file (a truncated download fails here, not later)."""
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or int(t.data.nbytes) != int(t.n_bytes):
            raise SpecserveError(f"{path}: truncated: tensor {t.name} needs bytes up to {end}, "
                                 f"the file has {size}")


def field_value(reader: GGUFReader, key: str) -> Any:
    """A metadata value (str, number or list), or None where the key is absent."""
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def check_importable(path: Path, reader: GGUFReader) -> tuple[str, dict[str, int]]:
    """The architecture and the tensor-type census, or one line naming what is not supported."""
    arch = field_value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise SpecserveError(f"{path}: architecture {arch!r} not supported (supported: "
                             f"{', '.join(ARCHITECTURES)}; Mistral is written as llama)")
    census = collections.Counter(t.tensor_type.name for t in reader.tensors)
    unsupported = sorted(set(census) - set(TENSOR_TYPES))
    if unsupported:
        where = next(t.name for t in reader.tensors if t.tensor_type.name in unsupported)
        raise SpecserveError(f"{path}: tensor type {', '.join(unsupported)} not supported (first "
                             f"in {where}; supported: {', '.join(TENSOR_TYPES)})")
    if not reader.tensors:
        raise SpecserveError(f"{path}: holds no tensors")
    return str(arch), dict(sorted(census.items()))


def summarize(path: Path, reader: GGUFReader, arch: str, census: dict[str, int]) -> GGUFSummary:
    version = field_value(reader, "GGUF.version")
    name = field_value(reader, "general.name")
    return GGUFSummary(path=str(path), bytes=path.stat().st_size, sha256=sha256_file(path),
                       version=int(version) if version is not None else 0, architecture=arch,
                       name=str(name) if name is not None else None, tensor_types=census)
