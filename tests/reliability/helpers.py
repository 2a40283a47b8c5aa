"""Helpers for tests/reliability: direct ``tensorrt_llm`` requests over one gRPC stream, extra
model copies in a repository, and sharpened tiny checkpoints."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.server import grpc_stream_many


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    seed: int = 0


def llm_inputs(job: Job) -> dict[str, np.ndarray[Any, Any]]:
    """``tensorrt_llm`` inputs (batch dim 1) for one job; never stops on a token."""
    return {
        "input_ids": np.array([job.prompt], dtype=np.int32),
        "input_lengths": np.array([[len(job.prompt)]], dtype=np.int32),
        "request_output_len": np.array([[job.max_tokens]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32),
        "temperature": np.array([[job.temperature]], dtype=np.float32),
        "seed": np.array([[job.seed]], dtype=np.uint64),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
    }


def run_jobs(url: str, model: str, jobs: list[Job], timeout_s: float = 300.0) -> list[list[int]]:
    """Send every job at once on one gRPC stream; the generated ids of each, in job order."""
    results, errors = run_jobs_tolerant(url, model, jobs, timeout_s)
    if errors:
        raise RuntimeError(f"{model}: {errors[0]}")
    return [results[i] for i in range(len(jobs))]


def run_jobs_tolerant(url: str, model: str, jobs: list[Job], timeout_s: float = 300.0
                      ) -> tuple[dict[int, list[int]], list[str]]:
    """Like :func:`run_jobs`, but errors are collected: ({job index: ids}, [error messages])."""
    responses, errors = grpc_stream_many(url, model, [llm_inputs(j) for j in jobs], timeout_s)
    out = {i: [int(t) for r in rs if "output_ids" in r for t in r["output_ids"].reshape(-1)]
           for i, rs in responses.items() if any("output_ids" in r for r in rs)}
    return out, errors


def copy_llm_model(repo: Path, new_name: str, *, engine: Path | None = None,
                   extra_params: dict[str, str] | None = None,
                   model_py: str | None = None) -> None:
    """Copy ``tensorrt_llm`` to ``new_name`` (other engine dir, extra parameters, and
    ``model_py`` as its ``1/model.py`` instead of the product's shim)."""
    dst = repo / new_name
    shutil.copytree(repo / "tensorrt_llm", dst)
    if model_py is not None:
        (dst / "1" / "model.py").write_text(model_py)
    cfg = (dst / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "tensorrt_llm"', f'name: "{new_name}"', 1)
    if engine is not None:
        cfg = re.sub(r'(key: "gpt_model_path" value: \{ string_value: )"[^"]*"',
                     rf'\1"{engine}"', cfg)
    for k, v in (extra_params or {}).items():
        cfg += f'\nparameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
    (dst / "config.pbtxt").write_text(cfg)


def copy_bls_model(repo: Path, new_name: str, params: dict[str, str],
                   lib: dict[str, str] | None = None) -> None:
    """Copy ``tensorrt_llm_bls`` to ``new_name`` with parameter values replaced (or added) and
    ``lib`` ({file name: text}) written over its ``1/lib/`` files."""
    dst = repo / new_name
    shutil.copytree(repo / "tensorrt_llm_bls", dst)
    for fname, text in (lib or {}).items():
        (dst / "1" / "lib" / fname).write_text(text)
    cfg = (dst / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "tensorrt_llm_bls"', f'name: "{new_name}"', 1)
    for k, v in params.items():
        pattern = rf'(key: "{re.escape(k)}" value: \{{ string_value: )"[^"]*"'
        if re.search(pattern, cfg):
            cfg = re.sub(pattern, lambda m, v=v: f'{m.group(1)}"{v}"', cfg)
        else:
            cfg += f'\nparameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
    (dst / "config.pbtxt").write_text(cfg)


def scale_lm_head(src: Path, dst: Path, factor: float) -> Path:
    """Copy an HF checkpoint dir with ``lm_head.weight`` multiplied by ``factor`` (sharper
    next-token distributions: a random-init tiny model is otherwise almost uniform)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * factor
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst
