"""Shared fixtures. Tiny random checkpoints are made once per session (seconds, offline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A TinyCheckpoint (tokenizer, target, draft, medusa) shared by the whole session.
    Treat it as read-only; copy it before changing anything."""
    import torch

    from specserve.testing.tiny import make_tiny_checkpoint

    torch.set_num_threads(1)
    return make_tiny_checkpoint(Path(tmp_path_factory.mktemp("tiny")))


@pytest.fixture()
def writable_ckpt(tiny_ckpt, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A private copy of the tiny checkpoint that a test may corrupt."""
    import shutil

    from specserve.testing.tiny import TinyCheckpoint

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt.root, root)
    return TinyCheckpoint(root=root, target=root / "target", draft=root / "draft",
                          medusa=root / "medusa", tokenizer=root / "tokenizer")
