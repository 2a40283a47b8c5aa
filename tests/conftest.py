"""Shared fixtures. Tiny random checkpoints are made once per session (seconds, offline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_TRITONSERVER = os.environ.get("SPECSERVE_TRITONSERVER")
UNMARKED_SERVER = "/nonexistent/tritonserver-needs-pytest.mark.server"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Only tests marked ``server`` (``-m server`` selects them) may start tritonserver: for the
    others the launcher is pointed at a binary that does not exist, from before their fixtures
    (module-scoped servers included) to their end, in subprocesses too (the environment)."""
    if item.get_closest_marker("server") is not None:
        if _TRITONSERVER is None:
            os.environ.pop("SPECSERVE_TRITONSERVER", None)
        else:
            os.environ["SPECSERVE_TRITONSERVER"] = _TRITONSERVER
    else:
        os.environ["SPECSERVE_TRITONSERVER"] = UNMARKED_SERVER


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A TinyCheckpoint (tokenizer, target, draft, medusa) shared by the whole session.
    Treat it as read-only; copy it before changing anything."""
    import torch

    from tests.helpers.tiny import make_tiny_checkpoint

    torch.set_num_threads(1)
    return make_tiny_checkpoint(Path(tmp_path_factory.mktemp("tiny")))


@pytest.fixture()
def writable_ckpt(tiny_ckpt, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A private copy of the tiny checkpoint that a test may corrupt."""
    import shutil

    from tests.helpers.tiny import TinyCheckpoint

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt.root, root)
    return TinyCheckpoint(root=root, target=root / "target", draft=root / "draft",
                          medusa=root / "medusa", tokenizer=root / "tokenizer")
