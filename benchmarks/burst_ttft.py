"""TTFT of a burst: N held-out chat prompts (the model's chat template applied) submitted at
once to the engine's in-flight scheduler, in process, cold (no prefix cache), one thread;
each request's first token timed from the burst's start (docs/results.md, "Against vLLM-CPU").

    PYTHONPATH=. .venv/bin/python benchmarks/burst_ttft.py --chunk 256,2048

Run it with ``PYTHONPATH`` set to another checkout to compare engines side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_cost import _prompts  # noqa: E402  (the held-out chat prompts, template applied)

ROOT = Path(__file__).resolve().parents[1]


def burst(model: Path, batch: list[list[int]], chunk: int, max_tokens: int) -> dict[str, float]:
    """Every prompt submitted at once; TTFT p50 / max and the whole burst's seconds."""
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams
    from specserve.serving.engine import make_scheduler

    sch = make_scheduler(build_decoder(model), len(batch), 2048, chunk)
    first: dict[int, float] = {}
    t0 = time.perf_counter()
    def first_token(i: int) -> Callable[[list[int]], None]:
        def seen(_tokens: list[int]) -> None:
            first.setdefault(i, time.perf_counter() - t0)
        return seen

    for i, p in enumerate(batch):
        sch.submit(p, SamplingParams(max_tokens=max_tokens), on_tokens=first_token(i))
    sch.run_until_idle()
    ttft = sorted(first.values())
    return {"chunk": chunk, "ttft_p50_s": statistics.median(ttft), "ttft_max_s": ttft[-1],
            "total_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints/smollm2")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache/data/chat-heldout.jsonl")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--chunk", default="256,2048", help="prefill token budgets per step")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    batch = _prompts(args.model, args.data, args.prompts, last=None)
    rows = []
    for chunk in (int(c) for c in args.chunk.split(",")):
        r = burst(args.model, batch, chunk, args.max_tokens)
        rows.append(r)
        print(f"budget {chunk}: TTFT p50 {r['ttft_p50_s']:.2f} s, max {r['ttft_max_s']:.2f} s, "
              f"burst {r['total_s']:.2f} s ({sum(map(len, batch))} prompt tokens)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
