"""Two specserve workers behind NVIDIA Dynamo's frontend and router; one is SIGKILLed in the
middle of a ``specserve bench`` run (marker ``dynamo``; harness and upstream citations in
:mod:`tests.helpers.dynamo_failover`; the 200-request figures: ``benchmarks/dynamo_failover.py``,
docs/reliability.md section 8).

With ``--migration-limit 3``: every request is in the report, none hangs, every one completes,
and each text equals the same prompt's greedy text from a run without the kill (a migrated
request continues on the other worker from prompt + streamed tokens). Without migration (what
Dynamo does by default): the requests that were on the dead worker fail with an error the
client sees (none hangs, none is lost), the others complete with the reference text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import dynamo_failover as fo
from tests.helpers.server import make_tiny_engine

pytestmark = pytest.mark.dynamo

REQUESTS, CONCURRENCY, MAX_TOKENS, KILL_AFTER = 60, 24, 96, 8
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os\n",
           "while True:", "def main():", "return x +", "if __name__ =="]


@pytest.fixture(scope="module")
def engine(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Draft = target: every draft accepted, several tokens per stream chunk."""
    return make_tiny_engine(tiny_ckpt, Path(tmp_path_factory.mktemp("eng")) / "engine-draft",
                            "draft", draft_is_target=True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    p = Path(tmp_path_factory.mktemp("data")) / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in PROMPTS))
    return str(p)


def _deployment(engine: Path, migration_limit: int, logs: Path) -> Iterator[Any]:
    from specserve.frontends.dynamo_serve import (
        DynamoDeployment,
        DynamoServeConfig,
        ServedModel,
    )

    cfg = DynamoServeConfig(engine=engine, models=(ServedModel("tiny"),), workers=2,
                            migration_limit=migration_limit, max_batch=16, log_dir=logs)
    dep = DynamoDeployment(cfg)
    dep.start(240)
    try:
        yield dep
    finally:
        dep.stop()


def _kill_run(dep: Any, dataset: str, out: Path) -> tuple[dict[str, Any], fo.FailoverRun]:
    """A run without a kill (the reference texts), then the same run killing worker 0."""
    ref = fo.run(dep, fo.bench_config(dep.url, "tiny", out / "ref", REQUESTS, CONCURRENCY,
                                      MAX_TOKENS, 60, dataset), None)
    assert ref.outcome({}, MAX_TOKENS)["completed"] == REQUESTS, ref.outcome({}, MAX_TOKENS)
    run = fo.run(dep, fo.bench_config(dep.url, "tiny", out / "kill", REQUESTS, CONCURRENCY,
                                      MAX_TOKENS, 60, dataset), KILL_AFTER)
    got = run.outcome(ref.texts(), MAX_TOKENS)
    # the kill hit a full pipeline, and nothing went missing from the report
    assert got["in_flight_at_kill"] >= CONCURRENCY // 2, got
    assert got["requests"] == got["recorded_in_summary"] == REQUESTS, got
    assert got["hung"] == 0, got
    assert got["completed"] + got["failed"] == REQUESTS, got
    return got, run


def test_with_migration_every_request_completes_with_its_greedy_text(
        engine: Path, dataset: str, tmp_path: Path) -> None:
    for dep in _deployment(engine, 3, tmp_path / "logs"):
        got, _ = _kill_run(dep, dataset, tmp_path)
        assert got["migrations"].get("ongoing_request/?", 0) >= 1, got  # mid-stream
        assert got["completed"] == REQUESTS, got
        assert got["completed_equal_reference"] == REQUESTS, got
        assert got["completed_full_length"] == REQUESTS, got


def test_without_migration_the_dead_workers_requests_fail_visibly(
        engine: Path, dataset: str, tmp_path: Path) -> None:
    for dep in _deployment(engine, 0, tmp_path / "logs"):
        got, run = _kill_run(dep, dataset, tmp_path)
        assert got["failed"] >= 1, got  # Dynamo's default: no re-send
        assert got["completed_equal_reference"] == got["completed"], got
        for r in run.records:
            assert r.status == "completed" or r.error, r  # an error the client can read
