"""Helpers for tests/reliability: direct ``tensorrt_llm`` requests over one gRPC stream, extra
model copies in a repository, and sharpened tiny checkpoints."""

from __future__ import annotations

import queue
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


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


_DT = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64",
       np.dtype(bool): "BOOL", np.dtype(object): "BYTES"}


def run_jobs(url: str, model: str, jobs: list[Job], timeout_s: float = 300.0) -> list[list[int]]:
    """Send every job at once on one gRPC stream; the generated ids of each, in job order."""
    results, errors = run_jobs_tolerant(url, model, jobs, timeout_s)
    if errors:
        raise RuntimeError(f"{model}: {errors[0]}")
    return [results[i] for i in range(len(jobs))]


def run_jobs_tolerant(url: str, model: str, jobs: list[Job], timeout_s: float = 300.0
                      ) -> tuple[dict[int, list[int]], list[str]]:
    """Like :func:`run_jobs`, but errors are collected: ({job index: ids}, [error messages])."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    out: dict[int, list[int]] = {}
    errors: list[str] = []
    try:
        for i, job in enumerate(jobs):
            inputs = []
            for name, arr in llm_inputs(job).items():
                inp = grpcclient.InferInput(name, list(arr.shape), _DT[arr.dtype])
                inp.set_data_from_numpy(arr)
                inputs.append(inp)
            client.async_stream_infer(model, inputs, request_id=str(i))
        while len(out) + len(errors) < len(jobs):
            result, error = q.get(timeout=timeout_s)
            if error is not None:
                errors.append(str(error))
                continue
            rid = int(result.get_response().id)
            out[rid] = [int(t) for t in result.as_numpy("output_ids").reshape(-1)]
    finally:
        client.stop_stream()
        client.close()
    return out, errors


def copy_llm_model(repo: Path, new_name: str, *, engine: Path | None = None,
                   extra_params: dict[str, str] | None = None) -> None:
    """Copy ``tensorrt_llm`` to ``new_name`` (other engine dir, extra parameters)."""
    dst = repo / new_name
    shutil.copytree(repo / "tensorrt_llm", dst)
    cfg = (dst / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "tensorrt_llm"', f'name: "{new_name}"', 1)
    if engine is not None:
        cfg = re.sub(r'(key: "gpt_model_path" value: \{ string_value: )"[^"]*"',
                     rf'\1"{engine}"', cfg)
    for k, v in (extra_params or {}).items():
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
