"""One torch thread or two for the served engine on the real model: which pays, at which load?

With a model whose weights do not fit in cache a second core may pay: two threads read more
bytes per second than one. But the engine's C kernels (few-row linears, decode attention) run
only on one thread, so two threads run on ATen's own (oneDNN / MKL) kernels instead. This
measures both on Triton: one n-gram engine of the real model (the default draft-length
policy) in a repository with its no-speculation baseline, served by one tritonserver per
thread count (``SPECSERVE_TORCH_THREADS``, which the Triton model reads), one server at a time.
For each thread count, concurrency and model (``ensemble``: speculation on; ``ensemble_baseline``:
off), one ``specserve bench`` phase alone on the machine (held-out chat prompts with the chat
template applied, 96 tokens, T = 0); ``--rounds`` rounds, the thread order reversed each round,
medians kept. Printed: per-user and output tok/s and TTFT p50, and two threads over one.
Nothing is asserted.

    .venv/bin/python benchmarks/threads.py --concurrency 1,8,16 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("ensemble_baseline", "ensemble")
KEYS = ("per_user_tok_s", "output_tok_s", "ttft_ms_p50")


def build(work: Path, model: Path, k: int) -> Path:
    """The n-gram engine (default draft-length policy) and its repository with a baseline."""
    engine, repo = work / "engine-ngram", work / "repo-ngram"
    cli = [sys.executable, "-m", "specserve.cli.main"]
    if not (engine / "build_config.json").exists():
        subprocess.run([*cli, "build", "--model", str(model), "--ngram", "--max-draft-len",
                        str(k), "--backend", "torch", "--dtype", "float32",
                        "--max-batch-size", "16", "--max-seq-len", "2048",  # KV: 1.5 GB, not 6
                        "--out", str(engine), "--force"], check=True)
    subprocess.run([*cli, "repo", "--engine", str(engine), "--out", str(repo), "--baseline",
                    "--force"], check=True, capture_output=True)
    return repo


def bench(args: argparse.Namespace, url: str, model: str, c: int, out: Path) -> dict[str, Any]:
    """One ``specserve bench`` phase of ``model`` at concurrency ``c``."""
    cmd = [sys.executable, "-m", "specserve.cli.main", "bench", "--protocol", "grpc",
           "--url", url, "--model", model, "--dataset", str(args.data),
           "--concurrency", str(c), "--requests", str(max(args.requests, 2 * c)),
           "--warmup", str(min(c, 4)), "--max-tokens", str(args.max_tokens),
           "--temperature", "0", "--end-id", "-1", "--out", str(out), "--format", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in (0, 1):
        sys.exit(f"bench {model}@{url} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    v = json.loads(proc.stdout)["variants"]["spec"]
    return {"per_user_tok_s": v["per_user_tok_s"]["mean"], "ttft_ms_p50": v["ttft_ms"]["p50"],
            "output_tok_s": v["output_token_throughput_tok_s"], "errors": v["errors"]}


def serve_and_bench(args: argparse.Namespace, repo: Path, threads: int, rnd: int
                    ) -> dict[str, dict[str, Any]]:
    """One tritonserver at ``threads`` torch threads: every (model, concurrency) phase."""
    from specserve.triton.server import TritonServer

    os.environ["SPECSERVE_TORCH_THREADS"] = str(threads)
    log = args.work / f"triton-t{threads}-r{rnd}.log"
    srv = TritonServer(repo, log_path=log).start(timeout_s=600)
    out: dict[str, dict[str, Any]] = {}
    try:
        for c in args.concurrency:
            for model in MODELS:
                cell = f"t{threads} {model} c={c}"
                out[cell] = bench(args, srv.grpc_url, model, c,
                                  args.work / f"bench-t{threads}-{model}-c{c}-r{rnd}")
                print(f"  round {rnd} {cell}: " + ", ".join(
                    f"{k} {out[cell][k]:.1f}" for k in KEYS), flush=True)
    finally:
        srv.stop()
    return out


def summary(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Median of every cell's figures over the rounds."""
    return {cell: {k: round(statistics.median(r[cell][k] for r in runs), 2) for k in KEYS}
            for cell in runs[0]}


def table(med: dict[str, dict[str, float]], concurrency: list[int]) -> str:
    lines = ["| model | c | per-user tok/s 1 / 2 threads | output tok/s 1 / 2 | TTFT p50 ms "
             "1 / 2 | 2 threads over 1 (output) |", "|---|---|---|---|---|---|"]
    for model in MODELS:
        for c in concurrency:
            a, b = med[f"t1 {model} c={c}"], med[f"t2 {model} c={c}"]
            lines.append(f"| {model} | {c} | {a['per_user_tok_s']:.1f} / "
                         f"{b['per_user_tok_s']:.1f} | {a['output_tok_s']:.1f} / "
                         f"{b['output_tok_s']:.1f} | {a['ttft_ms_p50']:.0f} / "
                         f"{b['ttft_ms_p50']:.0f} | "
                         f"{b['output_tok_s'] / a['output_tok_s']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "smollm2")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache/data/chat-heldout-text.jsonl")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--requests", type=int, default=8, help="per phase (at least 2 x c)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--k", type=int, default=4, help="the n-gram engine's longest draft")
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "threads")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    for path in (args.model, args.data):
        if not path.exists():
            sys.exit(f"{path}: not found (make real-model .cache/data/chat-heldout-text.jsonl)")
    args.work.mkdir(parents=True, exist_ok=True)
    repo = build(args.work, args.model, args.k)
    runs = []
    for rnd in range(args.rounds):
        cells: dict[str, dict[str, Any]] = {}
        for threads in ((1, 2) if rnd % 2 == 0 else (2, 1)):
            cells.update(serve_and_bench(args, repo, threads, rnd))
        runs.append(cells)
    med = summary(runs)
    result = {"cells": med, "rounds": runs, "cpu": os.uname().machine,
              "date": time.strftime("%Y-%m-%d %H:%M"), "max_tokens": args.max_tokens}
    (args.work / "threads.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(med, args.concurrency))


if __name__ == "__main__":
    main()
