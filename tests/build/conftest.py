"""Fixtures for build tests: a writable copy of the session's tiny checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specserve.testing.tiny import TinyCheckpoint


@pytest.fixture()
def ckpt(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> TinyCheckpoint:
    """A private, writable copy of ``tiny_ckpt`` (tests may corrupt it)."""
    root = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt.root, root)
    return TinyCheckpoint(root=root, target=root / "target", draft=root / "draft",
                          medusa=root / "medusa", tokenizer=root / "tokenizer")
