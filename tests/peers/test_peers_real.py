"""``benchmarks/peers.py --real``: the real-model set alternates vLLM and ours method by method,
drops EAGLE-3 on both sides when the head is missing, and interleaves the chat categories."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "peers.py"


def _peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_bench", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peers_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def _args(eagle3: Path) -> argparse.Namespace:
    return argparse.Namespace(real=True, served="smollm2", eagle3=eagle3)


def test_real_set_alternates_engines(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    got = _peers().configs(_args(tmp_path))
    assert [engine for _, engine, _, _ in got] == ["vllm", "triton"] * 3
    assert [name for name, *_ in got] == ["vllm", "specserve", "vllm ngram K=4",
                                          "specserve ngram", "vllm eagle3 K=4",
                                          "specserve eagle3"]
    assert got[4][2]["model"] == str(tmp_path) and got[4][2]["num_speculative_tokens"] == 4
    assert {m for _, e, _, m in got if e == "vllm"} == {"smollm2"}
    assert [m for _, e, _, m in got if e == "triton"] == ["ensemble_baseline", "ensemble",
                                                          "ensemble"]


def test_no_head_no_eagle3(tmp_path: Path) -> None:
    got = _peers().configs(_args(tmp_path / "missing"))
    assert [name for name, *_ in got] == ["vllm", "specserve", "vllm ngram K=4",
                                          "specserve ngram"]


def test_categories_interleaved() -> None:
    assert _peers().interleave([["c1", "c2", "c3"], ["m1"], ["w1", "w2"]]) == \
        ["c1", "m1", "w1", "c2", "w2", "c3"]


def test_server_cpu_counts_descendants() -> None:
    """A server's CPU time includes its children's: a shell whose child spins 0.4 s of CPU
    counts at least 0.3 s while the shell itself sleeps; no pid, no figure."""
    import os
    import signal
    import subprocess
    import time

    peers = _peers()
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time\n"
                             "t = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
                             "time.sleep(30)' & wait"], start_new_session=True)
    try:
        time.sleep(1.5)
        got = peers.server_cpu_s(proc.pid)
        assert got is not None and got >= 0.3
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert peers.server_cpu_s(None) is None and peers.server_cpu_s(0) is None


def test_a_dead_server_cell_renders() -> None:
    """Every request failed (vLLM's EAGLE-3 worker hung): no figures, a row of dashes, not a
    crash that loses the configurations still to run."""
    row = {"name": "vllm eagle3 K=4", "concurrency": 1, "completed": 0, "errors": 4,
           "per_user_tok_s": None, "tpot_ms_p50": None, "ttft_ms_p50": None,
           "ttft_ms_p99": None, "output_tok_s": None, "tau": None,
           "server_cpu_s_per_1k_tok": None}
    assert "| vllm eagle3 K=4 | 1 | - | - | - | - | - | - | - |" in _peers().table([row])


def test_each_level_gets_prompts_no_earlier_level_sent(tiny_ckpt: Any, tmp_path: Path) -> None:
    """Levels 1, 8 and 16 needing 2, 3 and 4 prompts get 9 distinct prompts (a prefix cache
    must not answer one level's prompts from the last level's); too small a set is refused;
    ``reuse`` sends every level the set from its start."""
    import json

    import pytest

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}],
                                        "category": "qa" if i % 2 else "code"}) + "\n"
                            for i in range(10)))
    peers = _peers()
    needs = {1: 2, 8: 3, 16: 4}
    files = peers.chat_prompts(tiny_ckpt.target, data, needs, tmp_path / "p.jsonl")
    sent = {c: [json.loads(line)["prompt"] for line in files[c].read_text().splitlines()]
            for c in needs}
    assert {c: len(v) for c, v in sent.items()} == needs
    assert len({t for v in sent.values() for t in v}) == 9
    with pytest.raises(SystemExit, match="need 11 distinct"):
        peers.chat_prompts(tiny_ckpt.target, data, {1: 5, 8: 6}, tmp_path / "p.jsonl")
    files = peers.chat_prompts(tiny_ckpt.target, data, needs, tmp_path / "p.jsonl", reuse=True)
    firsts = {files[c].read_text().splitlines()[0] for c in needs}
    assert len(firsts) == 1
