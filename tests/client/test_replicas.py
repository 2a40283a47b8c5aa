"""``specserve bench --url A --url B``: requests spread over replicas (round-robin or
least-outstanding), a per-replica split next to the pooled figures, and a replica that dies
mid-run backed off while the run goes on against the other. The policy is tested on a fake
clock; the spread for real against two tritonservers on loopback serving the trivial model
with different step sizes, so each replica's acceptance is its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.client.balance import ReplicaPool
from specserve.client.config import BenchmarkConfig
from tests.helpers.trivial_repo import write_trivial_repo


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_round_robin_takes_replicas_in_turn_and_skips_a_failing_one() -> None:
    clock = Clock()
    pool = ReplicaPool(3, "round-robin", clock)
    picks = [pool.pick() for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    pool.started(1)
    pool.finished(1, ok=False)         # replica 1 failed: backed off for 1 s
    assert [pool.pick() for _ in range(4)] == [0, 2, 0, 2]
    clock.t += 1.01                    # back-off over: probed again in its turn
    assert [pool.pick() for _ in range(3)] == [0, 1, 2]
    pool.started(1)
    pool.finished(1, ok=False)         # failed again: 2 s this time
    clock.t += 1.5
    assert 1 not in [pool.pick() for _ in range(4)]
    clock.t += 0.6
    assert 1 in [pool.pick() for _ in range(3)]
    pool.started(1)
    pool.finished(1, ok=True)          # a success clears the back-off
    assert pool.failures[1] == 0 and pool.down_until[1] == 0.0


def test_least_outstanding_prefers_the_idle_replica() -> None:
    pool = ReplicaPool(2, "least-outstanding", Clock())
    a = pool.pick()
    pool.started(a)
    b = pool.pick()
    assert b != a
    pool.started(b)
    pool.started(b)                    # b has two in flight, a one
    assert pool.pick() == a
    pool.finished(a, ok=True)
    pool.finished(b, ok=None)          # a cancel says nothing about the replica
    assert pool.down_until == [0.0, 0.0]


def test_all_replicas_down_still_picks_the_one_back_first() -> None:
    clock = Clock()
    pool = ReplicaPool(2, "round-robin", clock)
    for i, fails in ((0, 3), (1, 1)):
        for _ in range(fails):
            pool.started(i)
            pool.finished(i, ok=False)
    assert pool.pick() == 1            # 1 s back-off beats 4 s


def test_one_url_config_is_unchanged_and_duplicates_are_refused() -> None:
    one = BenchmarkConfig(url="127.0.0.1:8001", out="o").to_dict()
    assert "replicas" not in one and "balance" not in one
    two = BenchmarkConfig(url="127.0.0.1:8001", out="o", replicas=("127.0.0.1:9001",))
    assert two.to_dict()["replicas"] == ["127.0.0.1:9001"]
    assert two.urls == ("127.0.0.1:8001", "127.0.0.1:9001")
    r = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:8001", "--url", "127.0.0.1:8001",
                                 "--out", "unused"])
    assert r.exit_code == 2 and "the same server twice" in r.output
    r = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:8001", "--url", "no port",
                                 "--out", "unused"])
    assert r.exit_code == 2 and "is not HOST:PORT" in r.output


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    """Two servers of model ``trivial``: A steps 1,3,2,4 with 3 drafted (acceptance 0.5),
    B steps of 2 with 1 drafted (every draft accepted but the cut last step)."""
    from specserve.triton.server import TritonServer

    root = tmp_path_factory.mktemp("replicas")
    servers = []
    try:
        for name, sizes, draft in (("a", "1,3,2,4", 3), ("b", "2", 1)):
            repo = write_trivial_repo(root / name, sizes, draft, step_delay_ms=2)
            servers.append(TritonServer(repo, log_path=root / f"{name}.log").start(60))
        yield servers
    finally:
        for s in servers:
            s.stop()


def _jsonl(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


@pytest.mark.server
@pytest.mark.parametrize("balance", ["round-robin", "least-outstanding"])
def test_two_replicas_benchmarked_as_one_service(replicas: list[Any], tmp_path: Path,
                                                 balance: str) -> None:
    a, b = (s.grpc_url for s in replicas)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["bench", "--url", a, "--url", b, "--balance", balance,
                                 "--model", "trivial", "--requests", "20", "--warmup", "2",
                                 "--concurrency", "4", "--max-tokens", "12", "--out", str(out),
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    recs = _jsonl(out)
    assert s["config"]["replicas"] == [b] and s["config"]["balance"] == balance
    assert len(recs) == s["records"]["total"] == 22                 # every request accounted
    assert sorted(x["index"] for x in recs) == list(range(22))
    assert {x["url"] for x in recs} == {a, b}
    split = s["replicas"]
    assert sum(rep["records"]["total"] for rep in split.values()) == 22
    assert sum(rep["records"]["completed"] for rep in split.values()) == 20
    for url in (a, b):
        rep = split[url]
        assert rep["records"]["total"] == sum(x["url"] == url for x in recs)
        assert rep["records"]["completed"] >= 3                     # both served
        assert rep["variants"]["spec"]["completed"] == rep["records"]["completed"]
    if balance == "round-robin":
        assert abs(split[a]["records"]["total"] - split[b]["records"]["total"]) <= 1
    acc_a = split[a]["variants"]["spec"]["acceptance"]["acceptance_rate"]
    acc_b = split[b]["variants"]["spec"]["acceptance"]["acceptance_rate"]
    assert acc_b > 0.8 and 0.2 < acc_a < 0.6                       # each replica its own
    pooled = s["variants"]["spec"]
    assert pooled["completed"] == 20 and min(acc_a, acc_b) < \
        pooled["acceptance"]["acceptance_rate"] < max(acc_a, acc_b)
    readme = (out / "README.md").read_text()
    assert "## Per replica" in readme and a in readme and b in readme


@pytest.mark.server
def test_killing_a_replica_mid_run_the_run_goes_on(replicas: list[Any], tmp_path: Path) -> None:
    from specserve.triton.server import TritonServer

    a = replicas[0].grpc_url
    repo = write_trivial_repo(tmp_path / "b", "1,2", 1, step_delay_ms=20)
    victim = TritonServer(repo, log_path=tmp_path / "b.log").start(60)
    b = victim.grpc_url
    out = tmp_path / "out"
    n = 160  # the run outlasts the kill (victim.stop() takes a while)
    proc = subprocess.Popen(
        [sys.executable, "-m", "specserve.cli.main", "bench", "--url", a, "--url", b,
         "--model", "trivial", "--requests", str(n), "--warmup", "0", "--concurrency", "4",
         "--max-tokens", "20", "--out", str(out), "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = out / "requests.jsonl"
            if p.exists() and sum(f'"url": "{b}"' in line
                                  for line in p.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        killed_at = time.time()
        victim.stop()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        victim.stop()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr                 # partial: B's errors are in it
    assert "Traceback" not in stderr
    s = json.loads(stdout)
    recs = _jsonl(out)
    assert s["aborted"] is None and s["status"] == "partial"
    assert len(recs) == s["records"]["total"] == n      # the run went on to the end
    assert sorted(x["index"] for x in recs) == list(range(n))
    rep_a, rep_b = s["replicas"][a], s["replicas"][b]
    assert rep_b["records"]["completed"] >= 3 and rep_b["records"]["error"] >= 1
    assert rep_a["records"]["error"] == 0
    assert rep_a["records"]["total"] + rep_b["records"]["total"] == n
    assert rep_b["variants"]["spec"]["errors"] == rep_b["records"]["error"]
    # once B failed, requests went to the live replica: B only saw its back-off probes (the
    # moment is B's first error, not the wall clock: victim.stop() takes a variable while)
    dead = min(x["send_time_unix_s"] for x in recs if x["url"] == b and x["status"] == "error")
    # B's errors start at the kill: a request in flight when B went down (sent up to one
    # request's duration before, well under 1 s here) fails too (seen: 11 ms before)
    assert dead >= killed_at - 1.0
    late_b = [x for x in recs if x["url"] == b and x["send_time_unix_s"] > dead + 0.5]
    late_a = [x for x in recs if x["url"] == a and x["send_time_unix_s"] > dead + 0.5]
    assert len(late_a) >= 10 and len(late_b) <= 5, (len(late_a), len(late_b))
    assert all(x["status"] == "error" for x in late_b)
