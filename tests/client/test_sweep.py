"""``specserve bench --sweep``: each variant in its own phase per concurrency, the speedup per
level, the crossover where speculation stops paying, and no per-variant throughput in an
interleaved run. Servers: the scripted OpenAI server with a load-dependent step time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specserve.client.config import BenchmarkConfig
from specserve.client.run import run_benchmark
from specserve.client.sweep import crossover, parse_levels, run_sweep
from specserve.errors import SpecserveError
from tests.helpers.openai_server import Script, ScriptedOpenAI

# spec: 5 tokens a step (24 tokens in 6 chunks), a step costs 5 ms + 10 ms per stream in flight
# (its verify grows fast); baseline: 1 token a step of 5 ms + 0.75 ms per stream. Per-user tok/s
# at 1 / 4 / 8 streams: spec ~267 / 89 / 47, baseline ~174 / 125 / 91 (ratios 1.5 / 0.71 /
# 0.52; the scripted delays dwarf the event loop's own time): pays at 1, not from 4.
SPEC = dict(steps=(5,), gap_s=0.005, load_gap_s=0.010)
BASE = dict(steps=(1,), gap_s=0.005, load_gap_s=0.00075, per_request_metrics=False,
            drafts_counted=False)


def _cfg(tmp_path: Path, spec_url: str, base_url: str) -> BenchmarkConfig:
    return BenchmarkConfig(url=spec_url, baseline_url=base_url, out=str(tmp_path / "sweep"),
                           protocol="openai", model="demo", requests=16, warmup=2,
                           max_tokens=24, bootstrap=200, temperature=0.0)


def test_sweep_finds_the_crossover_and_runs_each_variant_alone(tmp_path: Path) -> None:
    spec_s, base_s = Script(**SPEC), Script(**BASE)  # type: ignore[arg-type]
    with ScriptedOpenAI(spec_s) as spec, ScriptedOpenAI(base_s) as base:
        cfg = _cfg(tmp_path, spec.url, base.url)
        s = run_sweep(cfg, [1, 4, 8], lambda c: run_benchmark(c, progress=False,
                                                               plots=False).summary)
    assert s["status"] == "ok" and [lv["concurrency"] for lv in s["levels"]] == [1, 4, 8]
    sp = [lv["per_user_speedup"]["speedup"] for lv in s["levels"]]
    assert sp[0] > 1.1 and sp[1] < 0.95 and sp[2] < 0.95, sp
    assert s["crossover_per_user"] == 4
    out = Path(cfg.out)
    for c in (1, 4, 8):
        for v in ("spec", "baseline"):
            phase = json.loads((out / f"c{c}-{v}" / "summary.json").read_text())
            assert phase["config"]["concurrency"] == c and list(phase["variants"]) == ["spec"]
            assert phase["variants"]["spec"]["output_token_throughput_tok_s"] > 0
    assert len(spec_s.requests) == len(base_s.requests) == 3 * 18   # own phase each: no mixing
    assert {p.name for p in out.glob("*.png")} == {"sweep_throughput.png", "sweep_speedup.png"}
    assert "stops paying: per-user tok/s from concurrency 4" in (out / "README.md").read_text()


def test_interleaved_run_gives_no_per_variant_throughput(tmp_path: Path) -> None:
    with ScriptedOpenAI(Script(**SPEC)) as spec, \
            ScriptedOpenAI(Script(**BASE)) as base:  # type: ignore[arg-type]
        s = run_benchmark(_cfg(tmp_path, spec.url, base.url), progress=False,
                          plots=False).summary
    assert all(v["output_token_throughput_tok_s"] is None for v in s["variants"].values())
    assert s["combined"]["output_token_throughput_tok_s"] > 0


def test_crossover_and_levels() -> None:
    rows = [{"concurrency": c, "per_user_speedup": {"speedup": x}, "output_throughput_ratio": y}
            for c, x, y in ((1, 2.0, 1.5), (2, 1.2, 0.9), (4, 0.8, 0.7))]
    assert crossover(rows, "per_user_speedup") == 4
    assert crossover(rows, "output_throughput_ratio") == 2
    assert parse_levels("1,2,4") == [1, 2, 4]
    for bad in ("4,2", "0,1", "1,1", "a", ""):
        with pytest.raises(SpecserveError, match="--sweep"):
            parse_levels(bad)


def test_cli_sweep_needs_a_baseline_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "specserve.cli.main", "bench", "--protocol", "openai",
         "--url", "127.0.0.1:9", "--sweep", "1,2", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "give --baseline-model or --baseline-url" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
