"""Fixtures for Triton tests: one tiny
reference deployment (engine + repository + running tritonserver) shared per test module.
Fake TensorRT-LLM engines come from tests.helpers.server.make_fake_trtllm_engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.tiny import TinyCheckpoint


@pytest.fixture(scope="module")
def tiny_server(tiny_ckpt: TinyCheckpoint,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A TinyDeployment: tiny Medusa reference engine, its repository (with the baseline
    pipeline) and a started tritonserver on free loopback ports; stopped after the module."""
    from tests.helpers.server import serve_tiny

    dep = serve_tiny(tmp_path_factory.mktemp("served"), ckpt=tiny_ckpt)
    try:
        yield dep
    finally:
        dep.server.stop()
