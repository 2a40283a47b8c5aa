"""``runtime/native_build.py``: a library of several C files is keyed by every file, so editing
the second one rebuilds it (a stale cache would keep the old code: what a key over the first
file alone did)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from specserve.runtime import native_build

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")


def _lib(a: Path, b: Path, out: Path) -> int:
    lib = ctypes.CDLL(str(native_build.build((a, b), out)))
    value: int = lib.outer()
    return value


def test_every_source_keys_the_library(tmp_path: Path) -> None:
    a, b = tmp_path / "outer.c", tmp_path / "inner.c"
    a.write_text("int inner(void);\nint outer(void) { return 10 * inner(); }\n")
    b.write_text("int inner(void) { return 4; }\n")
    first = native_build.build((a, b), tmp_path)
    assert first.name.startswith("outer-") and _lib(a, b, tmp_path) == 40
    b.write_text("int inner(void) { return 7; }\n")
    second = native_build.build((a, b), tmp_path)
    assert second != first and _lib(a, b, tmp_path) == 70
