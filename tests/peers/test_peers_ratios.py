"""``benchmarks/peers_ratios.py``: each of our cells over the mean of the vLLM runs of the same
method and concurrency (run as a script, on peers.json files written here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "peers_ratios.py"


def _run_dir(root: Path, name: str, rows: list[tuple[str, int, float, float]]) -> Path:
    d = root / name
    d.mkdir()
    (d / "peers.json").write_text(json.dumps([
        {"name": n, "concurrency": c, "output_tok_s": o, "per_user_tok_s": p,
         "ttft_ms_p50": 20.0} for n, c, o, p in rows]))
    return d


def test_ratios_over_the_vllm_mean(tmp_path: Path) -> None:
    """vLLM draft at c = 8 made 1,000 and 3,000 tok/s (mean 2,000): ours at 2,200 is 1.10;
    n-gram is compared with vLLM's n-gram only, c = 16 with c = 16 only."""
    v1 = _run_dir(tmp_path, "v1", [("vllm draft K=4", 8, 1000, 100), ("vllm ngram K=4", 8, 500, 50),
                                   ("vllm draft K=4", 16, 4000, 40)])
    v2 = _run_dir(tmp_path, "v2", [("vllm draft K=4", 8, 3000, 300), ("vllm ngram K=4", 8, 500, 50),
                                   ("vllm draft K=4", 16, 4000, 40)])
    ours = _run_dir(tmp_path, "o", [("specserve draft K=4 W=64", 8, 2200, 180),
                                    ("specserve ngram K=4", 8, 600, 40),
                                    ("specserve-dynamo draft K=4 W=64", 16, 3000, 30)])
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--vllm", str(v1), str(v2), "--ours",
                          str(ours), "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    got = {(r["name"], r["concurrency"]): r for r in json.loads(out.read_text())}
    assert got[("specserve draft K=4 W=64", 8)]["output_ratio"] == [1.1]
    assert got[("specserve draft K=4 W=64", 8)]["per_user_ratio"] == [0.9]
    assert got[("specserve ngram K=4", 8)]["output_ratio"] == [1.2]
    assert got[("specserve-dynamo draft K=4 W=64", 16)]["output_ratio"] == [0.75]
    assert "| specserve draft K=4 W=64 | 8 | 2,200 | 1.10 |" in run.stdout


def test_a_directory_without_results_is_refused(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--vllm", str(tmp_path), "--ours",
                          str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2 and "no peers.json" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_run_holding_both_engines(tmp_path: Path) -> None:
    """``peers.py --real`` alternates both engines in one run: named on both sides, the vLLM
    side reads its vLLM rows only and ours the others (our n-gram at 600 over vLLM's 500 is
    1.20, not over the mean with itself); TTFT p50 20 ms over vLLM's 40 ms is 0.50."""
    both = tmp_path / "both"
    both.mkdir()
    (both / "peers.json").write_text(json.dumps([
        {"name": n, "concurrency": 8, "output_tok_s": o, "per_user_tok_s": p, "ttft_ms_p50": t}
        for n, o, p, t in (("vllm ngram K=4", 500, 50, 40.0), ("specserve ngram", 600, 60, 20.0),
                           ("vllm", 400, 40, 30.0), ("specserve", 440, 44, 15.0))]))
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--vllm", str(both), "--ours", str(both),
                          "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    got = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(got) == {"specserve ngram", "specserve"}
    assert got["specserve ngram"]["output_ratio"] == [1.2]
    assert got["specserve ngram"]["ttft_ratio"] == [0.5]
    assert got["specserve"]["per_user_ratio"] == [1.1]
