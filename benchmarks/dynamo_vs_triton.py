"""The same engine through NVIDIA Dynamo's OpenAI frontend and through our Triton model, side by
side in one run (figures in docs/results.md, "Through Dynamo or through Triton?").

Starts, all at once on 127.0.0.1: tritonserver on a repository of ``--engine`` (``specserve
repo``; the ``ensemble`` model over gRPC), Dynamo with one specserve worker and Dynamo with two
(round-robin), every server with speculation, and Dynamo with one worker and the frontend as
shipped (``dynamo1-nagle``: ``python -m dynamo.frontend``, Nagle's algorithm on its HTTP
connections; the others run it through ``specserve.frontends.dynamo_frontend``, TCP_NODELAY).
Then ``--rounds`` rounds, each running in turn:
Triton and Dynamo-1 at c = 1 and at c = 8, Dynamo-1 and Dynamo-2 at c = 16 (the same prompts,
greedy, ``--max-tokens`` each, ``ignore_eos`` on the OpenAI side so both produce the same
count). Alternating rounds means the machine's other load falls on both sides alike; the
figures are the medians over rounds and their ratios. Writes ``OUT/dynamo_vs_triton.json``.

    .venv/bin/python benchmarks/dynamo_vs_triton.py --engine engines/demo --out reports/dvt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METRICS = {"per_user_tok_s": ("per_user_tok_s", "mean"),
           "output_tok_s": ("output_token_throughput_tok_s", None),
           "ttft_p50_ms": ("ttft_ms", "p50")}


def figures(summary: dict[str, Any]) -> dict[str, float]:
    v = summary["variants"]["spec"]
    out = {}
    for name, (key, sub) in METRICS.items():
        val = v[key][sub] if sub else v[key]
        out[name] = float(val["mean"] if isinstance(val, dict) else val)
    out["completed"] = float(v["completed"])
    return out


def bench(target: dict[str, Any], c: int, args: argparse.Namespace, out: Path) -> dict[str, float]:
    from specserve.client.config import BenchmarkConfig
    from specserve.client.run import run_benchmark

    cfg = BenchmarkConfig(out=str(out), requests=args.requests * max(1, c // 4), warmup=2,
                          concurrency=c, max_tokens=args.max_tokens, temperature=0.0, seed=0,
                          prompts="builtin-code", bootstrap=0, **target)
    return figures(run_benchmark(cfg, progress=False, plots=False).summary)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines/demo")
    ap.add_argument("--out", default="reports/dynamo-vs-triton")
    ap.add_argument("--requests", type=int, default=12, help="per run at c=1..4 (x c/4 above)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel
    from specserve.triton.server import TritonServer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="dvt-"))
    repo = tmp / "repo"
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "repo", "--engine", args.engine,
                    "--out", str(repo)], check=True, stdout=subprocess.DEVNULL)
    triton = TritonServer(repo.resolve(), http_port=0, grpc_port=0, metrics_port=0)
    deps = {name: DynamoDeployment(DynamoServeConfig(engine=Path(args.engine), workers=n,
                                                     models=(ServedModel("demo"),),
                                                     nodelay=nodelay))
            for name, n, nodelay in (("dynamo1", 1, True), ("dynamo2", 2, True),
                                     ("dynamo1-nagle", 1, False))}
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        triton.start(300)
        for d in deps.values():
            d.start(300)
        targets: dict[str, dict[str, Any]] = {"triton": {"url": triton.grpc_url,
                                                      "model": "ensemble"}}
        for name, d in deps.items():
            targets[name] = {"url": d.url.removeprefix("http://"), "model": "demo",
                                     "protocol": "openai", "ignore_eos": True,
                                     "scrape_metrics": False}
        plan = [("triton", 1), ("dynamo1", 1), ("dynamo1-nagle", 1), ("triton", 8),
                ("dynamo1", 8), ("dynamo1-nagle", 8), ("dynamo1", 16), ("dynamo2", 16)]
        for r in range(args.rounds):
            for name, c in plan:
                key = f"{name}@c{c}"
                runs.setdefault(key, []).append(bench(targets[name], c, args,
                                                      out / f"r{r}" / key))
                print(key, runs[key][-1], flush=True)
    finally:
        for d in deps.values():
            d.stop()
        triton.stop()
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in runs.items()}
    ratios = {
        "per_user_tok_s c1 dynamo/triton":
            med["dynamo1@c1"]["per_user_tok_s"] / med["triton@c1"]["per_user_tok_s"],
        "output_tok_s c8 dynamo/triton":
            med["dynamo1@c8"]["output_tok_s"] / med["triton@c8"]["output_tok_s"],
        "ttft_p50 c8 dynamo/triton":
            med["dynamo1@c8"]["ttft_p50_ms"] / med["triton@c8"]["ttft_p50_ms"],
        "ttft_p50 c1 dynamo/triton":
            med["dynamo1@c1"]["ttft_p50_ms"] / med["triton@c1"]["ttft_p50_ms"],
        "ttft_p50 c1 dynamo-nagle/triton":
            med["dynamo1-nagle@c1"]["ttft_p50_ms"] / med["triton@c1"]["ttft_p50_ms"],
        "ttft_p50 c8 dynamo-nagle/triton":
            med["dynamo1-nagle@c8"]["ttft_p50_ms"] / med["triton@c8"]["ttft_p50_ms"],
        "output_tok_s c16 2 workers/1 worker":
            med["dynamo2@c16"]["output_tok_s"] / med["dynamo1@c16"]["output_tok_s"],
    }
    result = {"config": vars(args), "runs": runs, "median": med, "ratios": ratios,
              "load_avg_1m_end": os.getloadavg()[0]}
    (out / "dynamo_vs_triton.json").write_text(json.dumps(result, indent=2) + "\n")
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
