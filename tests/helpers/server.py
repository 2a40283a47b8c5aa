"""Test helpers: a tiny reference engine, its Triton repository and a running server.

``serve_tiny(root)`` makes everything under ``root`` and returns a started
:class:`~specserve.triton.server.TritonServer` on free loopback ports (the caller stops it, e.g.
from a module-scoped pytest fixture). ``tests/triton/conftest.py`` wraps it as the ``tiny_server``
fixture; other test packages can do the same.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specserve.triton.repository import RepoOptions, write_repository
from specserve.triton.server import TritonServer
from tests.helpers.tiny import TinyCheckpoint, make_tiny_checkpoint

# How long a test fixture lets tritonserver drain on stop() before the SIGKILL (the product's
# default is 15 s): a regression of the empty-final fix (docs/reliability.md §5, "Stopping the
# server") then costs seconds per server, not the whole timeout.
TEARDOWN_STOP_S = 3.0

FAKE_MEDUSA_CHOICES = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3]]


def trtllm_build_config(kind: str) -> dict[str, Any]:
    """A build_config.json as `specserve build --backend trtllm` records it (the keys the
    repository writer reads), for a Medusa fp16, Medusa FP8 or draft-target engine."""
    cfg: dict[str, Any] = {
        "backend": "trtllm", "spec_mode": "medusa", "max_batch_size": 16,
        "max_input_len": 1024, "max_seq_len": 2048 + 10, "max_draft_len": len(FAKE_MEDUSA_CHOICES),
        "medusa_choices": FAKE_MEDUSA_CHOICES, "dtype": "float16", "quantize": None,
        "kv_cache_dtype": None, "tp_size": 1, "pp_size": 1, "world_size": 1,
    }
    if kind == "fp8":
        cfg.update(quantize="fp8", kv_cache_dtype="fp8", max_batch_size=64, tp_size=2,
                   world_size=2)
    elif kind == "draft":
        cfg.update(spec_mode="draft", max_draft_len=10, medusa_choices=None, max_batch_size=4)
    return cfg


def make_fake_trtllm_engine(root: Path, kind: str) -> Path:
    engine = root / f"engine-{kind}"
    for sub in ("target", "tokenizer") + (("draft",) if kind == "draft" else ()):
        (engine / sub).mkdir(parents=True, exist_ok=True)
    (engine / "build_config.json").write_text(json.dumps(trtllm_build_config(kind), indent=2))
    return engine


TINY_MEDUSA_CHOICES = ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))


@dataclass(frozen=True)
class TinyDeployment:
    """A tiny engine, its repository and the server serving it."""

    ckpt: TinyCheckpoint
    engine: Path
    repo: Path
    server: TritonServer


def make_tiny_engine(ckpt: TinyCheckpoint, out: Path, spec_mode: str = "medusa",
                     draft_is_target: bool = False) -> Path:
    """A reference (torch, float32) engine directory built by ``specserve build``'s library
    (:func:`specserve.build.builder.build_engine`) from the tiny checkpoints; reused if present.
    ``draft_is_target``: the draft is the target itself, so greedy speculation accepts every
    draft token (K + 1 tokens per step). The draft length is fixed (``--draft-len-policy
    fixed``): tests here count tokens per step; ``tests/reliability/test_lossless_server.py``
    serves the default (adaptive) engines."""
    if out.exists():
        return out
    from specserve.build.builder import build_engine
    from specserve.build.config import BuildConfig

    cfg = BuildConfig(
        model=str(ckpt.target), out=str(out), spec_mode=spec_mode, backend="torch",
        dtype="float32", max_batch_size=8,
        medusa=str(ckpt.medusa) if spec_mode == "medusa" else None,
        draft=str(ckpt.target if draft_is_target else ckpt.draft) if spec_mode == "draft"
        else None, max_draft_len=4 if spec_mode in ("draft", "ngram") else None,
        medusa_choices=TINY_MEDUSA_CHOICES if spec_mode == "medusa" else None,
        draft_len_policy="fixed")
    build_engine(cfg)
    return out


def serve_tiny(root: Path, *, spec_mode: str = "draft", draft_is_target: bool = True,
               baseline: bool = True, ckpt: TinyCheckpoint | None = None,
               timeout_s: float = 120.0) -> TinyDeployment:
    """Tiny checkpoint (unless given) -> engine -> repository (with ``ensemble_baseline`` when
    ``baseline``) -> started server. The default engine drafts with the target itself (every
    draft accepted at temperature 0: 5 tokens per streamed response)."""
    root.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt or make_tiny_checkpoint(root / "ckpt")
    engine = make_tiny_engine(ckpt, root / f"engine-{spec_mode}", spec_mode, draft_is_target)
    repo = write_repository(engine, root / f"repo-{spec_mode}",
                            RepoOptions(baseline=baseline), force=True)
    server = TritonServer(repo, log_path=root / f"server-{spec_mode}.log")
    server.start(timeout_s)
    return TinyDeployment(ckpt=ckpt, engine=engine, repo=repo, server=server)


# --- a minimal gRPC streaming client for tests (the product client is specserve.client) ---

DTYPES = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32",
          np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64"}


def request(text: str, max_tokens: int = 12, **extra: Any) -> dict[str, np.ndarray[Any, Any]]:
    """Ensemble/BLS inputs with batch dim 1; ``end_id=-1`` (never stop early) by default;
    ``extra`` values: bool -> BOOL, int -> INT32, float -> FP32."""
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "text_input": np.array([[text.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32),
    }
    for k, v in extra.items():
        dtype = {bool: bool, int: np.int32, float: np.float32}[type(v)]
        arrays[k] = np.array([[v]], dtype=dtype)
    return arrays


class StreamError(RuntimeError):
    """An error response on a gRPC stream; the message is the server's."""


def infer_inputs(arrays: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
    """tritonclient ``InferInput``s for numpy arrays (dtype names from :data:`DTYPES`)."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, arr in arrays.items():
        inp = grpcclient.InferInput(name, list(arr.shape), DTYPES[arr.dtype])
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def grpc_responses(url: str, model: str, requests: list[dict[str, np.ndarray[Any, Any]]],
                   timeout_s: float = 60.0
                   ) -> Generator[tuple[int | None, dict[str, Any]], None, None]:
    """THE gRPC streaming loop of the tests: send every request (``request_id`` = its index) on
    one stream, then yield ``(index, response)`` as responses arrive until every request has had
    its final response or an error. A response is ``{output name: array, "final": bool}``; an
    error response is ``(None, {"error": StreamError})`` (tritonclient does not say which
    request it belongs to) and ends one request. ``queue.Empty`` after ``timeout_s`` without a
    response. Closing the iterator early (``contextlib.closing``) cancels what is left."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    ended = 0  # requests that had their final response or an error
    try:
        for i, arrays in enumerate(requests):
            client.async_stream_infer(model, infer_inputs(arrays), request_id=str(i),
                                      enable_empty_final_response=True)
        while ended < len(requests):
            result, error = q.get(timeout=timeout_s)
            if error is not None:
                ended += 1
                yield None, {"error": StreamError(str(error))}
                continue
            resp = result.get_response()
            d: dict[str, Any] = {o.name: result.as_numpy(o.name) for o in resp.outputs}
            d["final"] = resp.parameters["triton_final_response"].bool_param
            ended += d["final"]
            yield int(resp.id), d
    finally:
        # cancel only what is left: cancelling a stream whose requests all ended can leak a
        # model reference in tritonserver 2.51's gRPC front end (specserve/client/triton_grpc.py)
        client.stop_stream(cancel_requests=ended < len(requests))
        client.close()


def grpc_stream(url: str, model: str, arrays: dict[str, np.ndarray[Any, Any]],
                timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """All responses of one request on a gRPC stream (final one included); an error response
    raises :class:`StreamError` with the server's message."""
    out = []
    with closing(grpc_responses(url, model, [arrays], timeout_s)) as responses:
        for _, d in responses:
            if "error" in d:
                raise d["error"]
            out.append(d)
    return out


def grpc_stream_many(url: str, model: str, requests: list[dict[str, np.ndarray[Any, Any]]],
                     timeout_s: float = 60.0) -> tuple[dict[int, list[dict[str, Any]]], list[str]]:
    """Every request at once on one stream: ({index: its responses}, [error messages])."""
    out: dict[int, list[dict[str, Any]]] = {}
    errors: list[str] = []
    with closing(grpc_responses(url, model, requests, timeout_s)) as responses:
        for i, d in responses:
            if i is None:
                errors.append(str(d["error"]))
            else:
                out.setdefault(i, []).append(d)
    return out, errors


def text_of(responses: list[dict[str, Any]]) -> str:
    return "".join(r["text_output"].reshape(-1)[0].decode("utf-8", "replace")
                   for r in responses if "text_output" in r)


def scalar(r: dict[str, Any], name: str) -> Any:
    v = r[name].reshape(-1)[0]
    return v if isinstance(v, bytes) else v.item()
