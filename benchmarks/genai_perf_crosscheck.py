"""Cross-check ``specserve bench`` against genai-perf on the same served tiny engine.

Serves the tiny reference engine (n-gram speculation) on a real tritonserver, runs genai-perf
(its own venv, see ``../shared/reference/triton-on-cpu.md`` section 4) with synthetic 32-token
prompts, then ``specserve bench`` on the very prompts genai-perf sent (read from its
``inputs.json``), both at concurrency 1, and prints the medians side by side.

    .venv/bin/python benchmarks/genai_perf_crosscheck.py --gp-venv /tmp/gpv --work /tmp/gp
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gp-venv", type=Path, required=True, help="venv with genai-perf")
    ap.add_argument("--work", type=Path, required=True, help="scratch folder")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    # `timeout` sends SIGTERM: exit through the context managers so the server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import torch

    torch.set_num_threads(1)
    from specserve.testing.server import serve_tiny

    dep = serve_tiny(args.work / "deploy", spec_mode="ngram")
    cuda = next((args.gp_venv / "lib").glob("python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ, PATH=f"{args.gp_venv / 'bin'}:{os.environ['PATH']}",
               LD_LIBRARY_PATH=str(cuda), HF_HUB_OFFLINE="1")
    art = args.work / "genai-perf"
    try:
        subprocess.run(
            ["genai-perf", "profile", "-m", "ensemble", "--endpoint-type", "kserve",
             "--backend", "tensorrtllm", "--streaming", "--tokenizer", str(dep.ckpt.tokenizer),
             "-u", dep.server.grpc_url, "--request-count", str(args.requests),
             "--warmup-request-count", "2", "--concurrency", "1",
             "--synthetic-input-tokens-mean", "32", "--synthetic-input-tokens-stddev", "0",
             "--output-tokens-mean", str(args.max_tokens), "--output-tokens-stddev", "0",
             "--random-seed", "0", "--artifact-dir", str(art)],
            env=env, check=True, capture_output=True, timeout=600)
        data = json.loads(next(art.rglob("inputs.json")).read_text())
        prompts = [d["text_input"][0] if isinstance(d["text_input"], list) else d["text_input"]
                   for d in data["data"]]
        ds = args.work / "prompts.jsonl"
        ds.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        out = subprocess.run(
            [sys.executable, "-m", "specserve.cli.main", "bench", "--url", dep.server.grpc_url,
             "--concurrency", "1", "--requests", str(args.requests), "--warmup", "2",
             "--max-tokens", str(args.max_tokens), "--dataset", str(ds),
             "--out", str(args.work / "specserve"), "--format", "json"],
            check=True, capture_output=True, text=True, timeout=600).stdout
    finally:
        dep.server.stop()
    ours = json.loads(out)["variants"]["spec"]
    gp = json.loads(next(art.rglob("profile_export_genai_perf.json")).read_text())
    osl = gp["output_sequence_length"]["avg"]
    true_tokens = ours["output_tokens"] / ours["completed"]
    print(f"TTFT p50 ms:            genai-perf {gp['time_to_first_token']['p50']:.3f}   "
          f"specserve {ours['ttft_ms']['p50']:.3f}")
    print(f"request latency p50 ms: genai-perf {gp['request_latency']['p50']:.3f}   "
          f"specserve {ours['e2e_ms']['p50']:.3f}")
    itl = gp["inter_token_latency"]["p50"]
    print(f"ITL p50 ms:             genai-perf {itl:.3f} (over {osl:.1f} re-tokenized tokens; "
          f"x {(osl - 1) / (true_tokens - 1):.2f} for the {true_tokens:.0f} real ones = "
          f"{itl * (osl - 1) / (true_tokens - 1):.3f})   specserve TPOT "
          f"{ours['tpot_ms']['p50']:.3f}, ITL per token {ours['itl_ms']['p50']:.3f}")


if __name__ == "__main__":
    main()
