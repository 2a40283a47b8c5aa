"""Bounded queues in the reference models: past the bound a request fails at
once with "server busy", the others complete in full, and the server keeps serving.

The bounds are set to 1 on copies of the models (``specserve_max_pending`` on ``tensorrt_llm``,
``specserve_max_inflight`` on ``tensorrt_llm_bls``); six long requests are sent at once on one
stream. The first occupies the worker (or the one BLS slot) for hundreds of milliseconds while
the rest arrive within a few, so at least one must be refused; with an unbounded queue none is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.server import TEARDOWN_STOP_S
from tests.reliability.helpers import Job, copy_llm_model, run_jobs, run_jobs_tolerant

pytestmark = pytest.mark.server

N, LONG = 6, 300  # requests sent at once; tokens each (end_id -1: never stops early)


@pytest.fixture(scope="module")
def busy_server(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import torch

    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import TritonServer
    from tests.helpers.server import make_tiny_engine

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("busy")
    engine = make_tiny_engine(tiny_ckpt, root / "engine", "draft")
    repo = write_repository(engine, root / "repo", RepoOptions(), force=True)
    copy_llm_model(repo, "tensorrt_llm_small", extra_params={"specserve_max_pending": "1"})
    bls = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    bls = bls.replace('name: "tensorrt_llm_bls"', 'name: "tensorrt_llm_bls_small"', 1)
    bls += '\nparameters: { key: "specserve_max_inflight" value: { string_value: "1" } }\n'
    (repo / "tensorrt_llm_bls_small" / "1").mkdir(parents=True)
    (repo / "tensorrt_llm_bls_small" / "config.pbtxt").write_text(bls)
    (repo / "tensorrt_llm_bls_small" / "1" / "model.py").write_text(
        (repo / "tensorrt_llm_bls" / "1" / "model.py").read_text())
    server = TritonServer(repo, log_path=root / "server.log").start(180)
    try:
        yield server
    finally:
        server.stop(timeout_s=TEARDOWN_STOP_S)


def test_llm_queue_full_answers_busy(busy_server: Any) -> None:
    url = busy_server.grpc_url
    jobs = [Job([10, 11, 12], LONG, 0.0, i) for i in range(N)]
    done, errors = run_jobs_tolerant(url, "tensorrt_llm_small", jobs)
    assert errors, "no request was refused: the queue is not bounded"
    assert all(re.search(r"server busy: 1 requests queued", e) for e in errors), errors
    assert len(done) + len(errors) == N and all(len(ids) == LONG for ids in done.values())
    # the server is still up and serves the next request in full
    assert [len(s) for s in run_jobs(url, "tensorrt_llm_small", jobs[:1])] == [LONG]


def test_bls_threads_full_answers_busy(busy_server: Any) -> None:
    from tests.helpers.server import grpc_stream_many, request

    url = busy_server.grpc_url
    reqs = [request("def add(a, b):", LONG, stream=True) for _ in range(N)]
    responses, errors = grpc_stream_many(url, "tensorrt_llm_bls_small", reqs)
    assert errors, "no request was refused: the BLS threads are not bounded"
    assert all("server busy: 1 requests in flight" in e for e in errors), errors
    assert len(errors) < N, "every request was refused"
    responses, errors = grpc_stream_many(url, "tensorrt_llm_bls_small", reqs[:1])
    assert not errors and responses
