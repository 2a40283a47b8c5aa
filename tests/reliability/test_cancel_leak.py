"""Cancelled ensemble requests leave nothing behind in tritonserver (its RSS stays flat).

tritonserver 2.51 (the ``nvidia-pytriton`` build) kept ~20 KB for every ensemble request
cancelled over a gRPC stream while the ensemble's postprocessing step had a dynamic batcher
(``benchmarks/triton_cancel_leak.py``, docs/reliability.md §3); reference repositories are now
written without it (``triton/params.py`` ``post_mapping``). This test sends cancelled streamed
requests to the ensemble of a reference repository and bounds tritonserver's own RSS growth per
request.

Bound: after a warm-up of 300 completed and 300 cancelled requests, 600 more cancelled requests
may add at most 6 KB each on average (3.5 MB). With the dynamic batcher planted back it grew
9.5 MB here (16 KB a request; 20-22 KB on the demo engine); without it the benchmark measures
0.1-0.6 KB. Deterministic prompts; RSS is read from ``/proc`` before and after.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.server import infer_inputs, make_tiny_engine, request
from tests.helpers.soak import rss_bytes, stream_rounds
from tests.helpers.tiny import TinyCheckpoint

pytestmark = [pytest.mark.slow, pytest.mark.server]

MAX_KB_PER_REQUEST = 6.0


def _rounds(url: str, n: int, cancel: bool) -> None:
    stream_rounds(url, "ensemble", lambda: infer_inputs(request("def f(x):", 24 if cancel else 4,
                                                                stream=True)), n, cancel)


def test_cancelled_ensemble_requests_keep_no_memory(tiny_ckpt: TinyCheckpoint,
                                                    tmp_path: Path) -> None:
    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import TritonServer

    engine = make_tiny_engine(tiny_ckpt, tmp_path / "engine", "ngram")
    repo = write_repository(engine, tmp_path / "repo", RepoOptions(), force=True)
    server = TritonServer(repo, log_path=tmp_path / "server.log").start(180)
    try:
        _rounds(server.grpc_url, 300, cancel=False)
        _rounds(server.grpc_url, 300, cancel=True)
        before = rss_bytes(server.pid)
        _rounds(server.grpc_url, 600, cancel=True)
        grown_kb = (rss_bytes(server.pid) - before) / 1024
        assert server.is_running()
    finally:
        server.stop()
    assert grown_kb / 600 <= MAX_KB_PER_REQUEST, \
        f"tritonserver grew {grown_kb:.0f} KB over 600 cancelled requests"
