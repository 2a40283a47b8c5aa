"""``benchmarks/trtllm_check.py`` (``make trtllm-check``): here it claims nothing; in NVIDIA's
container (marked gpu) it serves each method's YAML and wants tau > 1."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "trtllm_check.py"


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                    reason="tensorrt_llm is importable here")
def test_without_tensorrt_llm_claims_nothing() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert "TensorRT-LLM is not installed" in res.stdout and "tau" not in res.stdout


@pytest.mark.gpu
def test_container_check() -> None:
    """In the container: TRTLLM_CHECK_MODEL (and optional _DRAFT / _EAGLE3) name a small model."""
    model = os.environ.get("TRTLLM_CHECK_MODEL")
    if importlib.util.find_spec("tensorrt_llm") is None or not model:
        pytest.skip("needs tensorrt_llm and TRTLLM_CHECK_MODEL")
    args = ["--model", model]
    for env, flag in (("TRTLLM_CHECK_DRAFT", "--draft"), ("TRTLLM_CHECK_EAGLE3", "--eagle3")):
        if os.environ.get(env):
            args += [flag, os.environ[env]]
    res = subprocess.run([sys.executable, str(SCRIPT), *args], text=True, timeout=3600,
                         check=False)
    assert res.returncode == 0
