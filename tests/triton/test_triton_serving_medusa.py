"""The demo's shape: a tiny Medusa reference engine (tree verification) served for real.
Random heads accept little, so this checks the plumbing and batched tree decoding, not speedup."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from specserve.testing.server import grpc_stream, request, scalar, serve_tiny, text_of
from specserve.testing.tiny import TinyCheckpoint

pytestmark = pytest.mark.server
PROMPTS = ["def add(a, b):", "class Point:", "import sys", "for i in range(10):"]


@pytest.fixture(scope="module")
def medusa_server(tiny_ckpt: TinyCheckpoint,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    dep = serve_tiny(tmp_path_factory.mktemp("medusa"), spec_mode="medusa", baseline=False,
                     ckpt=tiny_ckpt)
    try:
        yield dep
    finally:
        dep.server.stop()


def test_medusa_streaming_with_perf(medusa_server: Any) -> None:
    res = grpc_stream(medusa_server.server.grpc_url, "ensemble",
                      request(PROMPTS[0], 10, stream=True, return_perf_metrics=True,
                              return_num_output_tokens=True))
    assert sum(scalar(r, "num_output_tokens") for r in res) == 10
    last = res[-1]
    drafted = scalar(last, "total_draft_tokens")
    assert 0 <= scalar(last, "total_accepted_draft_tokens") <= drafted and drafted > 0
    stats = json.loads(scalar(last, "spec_stats_json"))
    assert stats["draft_tokens"] == drafted
    assert sum(stats["per_position_drafted"]) > 0


def test_medusa_concurrent_streams_match_single(medusa_server: Any) -> None:
    url = medusa_server.server.grpc_url

    def run(p: str) -> str:
        return text_of(grpc_stream(url, "ensemble", request(p, 10, stream=True)))

    single = {p: run(p) for p in PROMPTS}
    got: dict[str, str] = {}
    threads = [threading.Thread(target=lambda p=p: got.__setitem__(p, run(p))) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == single
