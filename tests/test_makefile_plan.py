"""The Makefile's production path, read from ``make -n`` (the plan, nothing run): inside NVIDIA's
TensorRT-LLM container (``BACKEND=trtllm``, or ``tensorrt_llm`` importable by ``$(PY)``) the
engine / repo / serve / bench targets use the container's Python and never build or install the
CPU virtual environment; outside it they build ``.venv`` as ``make demo`` and ``make test`` do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("engine", "repo", "serve", "bench")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _plan(tmp_path: Path, *args: str, fake_trtllm: bool) -> str:
    # the plan of a make run from a clean shell: no parent make's flags, no variables the
    # Makefile reads from the environment
    drop = {"MFLAGS", "PYTHONPATH", "BACKEND", "CONTAINER", "PY", "VENV", "REPO", "REPO_ARGS"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in drop}
    if fake_trtllm:
        pkg = tmp_path / "site" / "tensorrt_llm"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        env["PYTHONPATH"] = str(tmp_path / "site")
    venv = tmp_path / "venv"  # absent: a plan that needs it shows how it would be built
    proc = subprocess.run(
        ["make", "-n", "-C", str(ROOT), f"PY={sys.executable}", f"VENV={venv}", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _assert_no_venv(plan: str, tmp_path: Path) -> None:
    assert "-m venv" not in plan, plan
    assert "pip install" not in plan and "/pip " not in plan, plan
    assert str(tmp_path / "venv") not in plan, plan
    assert f"{sys.executable} -m specserve.cli.main engine" in plan, plan


def test_backend_trtllm_uses_the_container_python(tmp_path: Path) -> None:
    plan = _plan(tmp_path, *TARGETS, "BACKEND=trtllm", fake_trtllm=True)
    _assert_no_venv(plan, tmp_path)
    for target in TARGETS:
        assert f"-m specserve.cli.main {target} " in plan, target
    assert '--backend "trtllm"' in plan
    # a TensorRT-LLM repository has no ensemble_baseline: asked for only where REPO has one
    assert "--baseline " not in plan.replace("--baseline-model", "")
    assert "test -d triton_repo/ensemble_baseline && echo --baseline-model" in plan


def test_importable_tensorrt_llm_alone_selects_the_container_path(tmp_path: Path) -> None:
    plan = _plan(tmp_path, *TARGETS, fake_trtllm=True)
    _assert_no_venv(plan, tmp_path)
    assert '--backend "trtllm"' in plan


def test_without_tensorrt_llm_the_targets_build_the_venv(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "engine", "repo", fake_trtllm=False)
    venv = tmp_path / "venv"
    assert f"-m venv {venv}" in plan
    assert f"{venv}/bin/specserve engine" in plan
    assert '--backend "torch"' in plan
    assert f"{venv}/bin/specserve repo --engine engines/demo --out triton_repo --force " \
           "--baseline" in plan


def test_demo_keeps_the_venv_even_where_tensorrt_llm_imports(tmp_path: Path) -> None:
    # `make demo-tiny` runs its engine / repo steps through sub-makes told CONTAINER= (the
    # venv); `make demo` (the real model) calls the venv's specserve itself
    text = (ROOT / "Makefile").read_text()
    tiny = text.split("\ndemo-tiny: setup\n", 1)[1].split("\n\n", 1)[0]
    assert "engine CONTAINER=" in tiny and "repo REPO_ARGS=--baseline CONTAINER=" in tiny
    demo = text.split("\ndemo: setup", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/specserve engine" in demo and "$(BIN)/specserve repo" in demo
    assert "$(SPECSERVE)" not in demo and "$(MAKE)" not in demo
    plan = _plan(tmp_path, "engine", "CONTAINER=", fake_trtllm=True)
    assert f"-m venv {tmp_path / 'venv'}" in plan
    assert '--backend "torch"' in plan
