"""``specserve watch`` against a real tritonserver serving the tiny reference engine.

- Healthy (the run-wide ``tiny_server``: the draft is the target itself, every draft
  accepted): a bench run gives the baseline, then a short watch under load raises nothing.
- Collapse: a server of its own in explicit model-control mode; mid-run the ``tensorrt_llm``
  model is reloaded (``POST /v2/repository/models/tensorrt_llm/load`` with a config override)
  onto an engine whose draft is an independent random model, while a client keeps sending
  requests: the watch must alarm within two intervals of the reload.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specserve.watch.rule import Rule
from specserve.watch.run import WatchConfig, watch
from tests.helpers.server import (
    TEARDOWN_STOP_S,
    TinyDeployment,
    grpc_stream,
    make_tiny_engine,
    request,
)

pytestmark = pytest.mark.server

PROMPTS = ["def add(a, b):", "the quick brown fox", "import os\nimport sys", "hello world"]


class Load:
    """Requests to ``ensemble`` from ``threads`` threads until stopped (errors counted: a
    reload fails what is in flight)."""

    def __init__(self, url: str, threads: int = 2, max_tokens: int = 24) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.stop = threading.Event()
        self.done = self.errors = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(threads)]

    def _run(self, i: int) -> None:
        k = i
        while not self.stop.is_set():
            try:
                grpc_stream(self.url, "ensemble",
                            request(PROMPTS[k % len(PROMPTS)], max_tokens=self.max_tokens),
                            timeout_s=30)
                self.done += 1
            except Exception:
                self.errors += 1
                time.sleep(0.2)
            k += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def bench_baseline(dep: TinyDeployment, out: Path) -> Path:
    """``specserve bench``'s library against the server: its summary.json."""
    from specserve.client.config import BenchmarkConfig
    from specserve.client.run import run_benchmark

    ds = out.parent / "prompts.jsonl"
    ds.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    cfg = BenchmarkConfig(url=dep.server.grpc_url, protocol="grpc", out=str(out),
                          model="ensemble", baseline_model="ensemble_baseline", concurrency=1,
                          requests=4, warmup=0, dataset=str(ds), max_tokens=24,
                          temperature=0.0, stream=True, bootstrap=50)
    run_benchmark(cfg, progress=False)
    return out / "summary.json"


def run_watch(cfg: WatchConfig, log: Path | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The watch's exit code and events (also written to ``log``, one JSON line each)."""
    events: list[dict[str, Any]] = []
    code = watch(cfg, events.append)
    if log is not None:
        log.write_text("".join(json.dumps(e) + "\n" for e in events))
    return code, events


# Once serial: under load one 2 s interval read acceptance below 1.0 with the draft equal to the
# target. The cause was a torn read of the counters, fixed by their seqlock
# (tests/watch/test_seqlock.py), so this runs in the parallel part again: a load-made false
# alarm is what it guards against.
def test_healthy_server_under_load_raises_nothing(tiny_server: TinyDeployment,
                                                  tmp_path: Path) -> None:
    summary = bench_baseline(tiny_server, tmp_path / "bench")
    cfg = WatchConfig(urls=(tiny_server.server.metrics_url,), baseline=str(summary),
                      interval_s=2.0, duration_s=10.0, rule=Rule(min_activity=16))
    with Load(tiny_server.server.grpc_url):
        code, events = run_watch(cfg, tmp_path / "events.jsonl")
    intervals = [e for e in events if e["event"] == "interval"]
    assert code == 0, [e for e in events if e["event"] != "interval"]
    assert not [e for e in events if e["event"] == "alarm"]
    assert events[0]["engine"] == "specserve"
    active = [e for e in intervals if e["status"] != "idle"]
    assert len(active) >= 3, intervals
    assert all(e["status"] == "ok" for e in active), active
    assert all(e["acceptance_rate"] == pytest.approx(1.0) for e in active), active


def _config(http_url: str, model: str) -> dict[str, Any]:
    http_url = http_url if "://" in http_url else f"http://{http_url}"
    with urllib.request.urlopen(f"{http_url}/v2/models/{model}/config", timeout=10) as r:
        cfg: dict[str, Any] = json.loads(r.read())
    return cfg


def _reload(http_url: str, model: str, engine_dir: Path) -> None:
    """Reload ``model`` onto ``engine_dir`` (its config with ``gpt_model_path`` replaced)."""
    http_url = http_url if "://" in http_url else f"http://{http_url}"
    cfg = _config(http_url, model)
    cfg["parameters"]["gpt_model_path"]["string_value"] = str(engine_dir)
    body = json.dumps({"parameters": {"config": json.dumps(cfg)}}).encode()
    req = urllib.request.Request(f"{http_url}/v2/repository/models/{model}/load", data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200


@pytest.fixture(scope="module")
def swappable(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[TinyDeployment, Path]]:
    """A server in explicit model-control mode on the healthy engine, and an engine whose
    draft is an independent random model."""
    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import TritonServer

    root = tmp_path_factory.mktemp("swap")
    good = make_tiny_engine(tiny_ckpt, root / "engine-good", "draft", draft_is_target=True)
    bad = make_tiny_engine(tiny_ckpt, root / "engine-random-draft", "draft",
                           draft_is_target=False)
    repo = write_repository(good, root / "repo", RepoOptions(baseline=True), force=True)
    server = TritonServer(repo, log_path=root / "server.log",
                          extra_args=("--model-control-mode=explicit", "--load-model=*"))
    server.start(180.0)
    try:
        yield TinyDeployment(ckpt=tiny_ckpt, engine=good, repo=repo, server=server), bad
    finally:
        server.stop(timeout_s=TEARDOWN_STOP_S)


@pytest.mark.slow  # a server of its own: ~60 s on 2 cores (make test-slow)
def test_random_draft_swapped_in_mid_run_alarms_within_two_intervals(
        swappable: tuple[TinyDeployment, Path], tmp_path: Path) -> None:
    dep, bad = swappable
    summary = bench_baseline(dep, tmp_path / "bench")
    interval = 2.0
    cfg = WatchConfig(urls=(dep.server.metrics_url,), baseline=str(summary),
                      interval_s=interval, duration_s=30.0, rule=Rule(min_activity=16),
                      exit_on_alarm=True)
    result: dict[str, Any] = {}
    log = tmp_path / "events.jsonl"
    t0 = time.monotonic()
    with Load(dep.server.grpc_url):
        th = threading.Thread(target=lambda: result.update(zip(("code", "events"),
                                                               run_watch(cfg, log),
                                                               strict=True)))
        th.start()
        time.sleep(3 * interval)
        _reload(dep.server.http_url, "tensorrt_llm", bad)
        swapped_s = time.monotonic() - t0
        th.join(timeout=120)
    events = result["events"]
    (tmp_path / "swap.json").write_text(json.dumps({"reload_done_s": swapped_s}))
    alarms = [e for e in events if e["event"] == "alarm"]
    intervals = [e for e in events if e["event"] == "interval"]
    assert result["code"] == 1, events
    assert alarms, events
    before = [e for e in intervals if e["t_s"] < swapped_s - interval]
    assert before and all(e["status"] in ("ok", "idle") for e in before), intervals
    # the interval in which the reload finished, then at most two more
    swap_index = min(e["index"] for e in intervals if e["t_s"] >= swapped_s)
    assert alarms[0]["index"] <= swap_index + 2, (swapped_s, intervals, alarms)
    assert alarms[0]["acceptance_rate"] < 0.5
