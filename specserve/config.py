"""Typed, frozen configuration dataclasses, saved as JSON next to every artifact.

Each config is a frozen dataclass with ``to_dict``/``from_dict``/``to_json`` and a
``validate`` that raises :class:`specserve.errors.SpecserveError` with one line naming the field.
Unit-bearing names (``max_queue_delay_us``) say what a number means. Inspired by nanoGPT storing
``model_args`` with the checkpoint: a resolved config next to an artifact makes it repeatable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from specserve.errors import SpecserveError

T = TypeVar("T", bound="JsonConfig")
_UMASK = os.umask(0o022)  # read once at import (os.umask can only be read by setting it)
os.umask(_UMASK)


class JsonConfig:
    """Mixin for frozen dataclasses: JSON round trip and validation."""

    def validate(self) -> None:
        """Raise SpecserveError on an invalid field; subclasses extend."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecserveError(f"{cls.__name__}: unknown keys {unknown}")
        obj = cls(**data)
        obj.validate()
        return obj

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def read_json(path: str | Path) -> Any:
    """Parse a JSON file, or raise ``<path>: not found`` / ``<path>: invalid JSON (...)``."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise SpecserveError(f"{p}: not found") from e
    except IsADirectoryError as e:
        raise SpecserveError(f"{p}: is a directory, expected a JSON file") from e
    except json.JSONDecodeError as e:
        raise SpecserveError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from e
    except UnicodeDecodeError as e:
        raise SpecserveError(f"{p}: invalid JSON (not UTF-8)") from e


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and an atomic rename
    (the one atomic writer of artefacts: a reader never sees half a file; the file gets the mode
    ``open()`` would give it, not mkstemp's 0600)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; artefacts get the usual mode
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any, default: Any = None) -> None:
    """JSON artefacts through :func:`write_text_atomic`: ``indent=2``, sorted keys, trailing
    newline (``default`` as for ``json.dumps``)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=default) + "\n")
