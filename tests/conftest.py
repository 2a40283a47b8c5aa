"""Shared fixtures. Tiny random checkpoints are made once per session (seconds, offline); one
tiny reference deployment (``tiny_server``) serves every module that needs the default
repository (tests/triton/test_triton_serving.py, tests/reliability/test_server_bad_input.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_TRITONSERVER = os.environ.get("SPECSERVE_TRITONSERVER")
UNMARKED_SERVER = "/nonexistent/tritonserver-needs-pytest.mark.server"


#: ai-dynamo's pytest plugins: their pytest_ignore_collect drops files named like ours
#: (tests/triton/test_triton_*.py) without a word; pyproject's addopts blocks them (-p no:...).
FOREIGN_COLLECTORS = ("sglang_tests", "triton_tests", "trtllm_tests", "vllm_tests")


def pytest_configure(config: pytest.Config) -> None:
    live = [n for n in FOREIGN_COLLECTORS if config.pluginmanager.get_plugin(n) is not None]
    if live:
        raise pytest.UsageError(f"pytest plugins {live} (ai-dynamo) would skip our test files: "
                                "block them with -p no:NAME (pyproject.toml addopts)")


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


@pytest.fixture(scope="session")
def tiny_server(tiny_ckpt, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A TinyDeployment: the tiny reference engine drafting with the target itself, its
    repository (with the baseline pipeline) and a started tritonserver on free loopback ports,
    shared by the whole run (one start-up instead of one per module); stopped at the end.
    Tests must leave it serving: a test that kills or reconfigures a server starts its own."""
    from tests.helpers.server import TEARDOWN_STOP_S, serve_tiny

    dep = serve_tiny(tmp_path_factory.mktemp("served"), ckpt=tiny_ckpt)
    try:
        yield dep
    finally:
        dep.server.stop(timeout_s=TEARDOWN_STOP_S)
