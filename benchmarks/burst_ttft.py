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
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def prompts(model: Path, data: Path, n: int) -> list[list[int]]:
    """The first ``n`` prompts of the chat set, templated and tokenized."""
    from transformers import AutoTokenizer

    from specserve.client.datasets import load_dataset

    tok = AutoTokenizer.from_pretrained(str(model))
    out = []
    for p in load_dataset(data)[:n]:
        msgs = [{"role": r, "content": c} for r, c in p.messages]
        out.append(list(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                tokenize=True, return_dict=True)["input_ids"]))
    return out


def burst(model: Path, batch: list[list[int]], chunk: int, max_tokens: int) -> dict[str, float]:
    """Every prompt submitted at once; TTFT p50 / max and the whole burst's seconds."""
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams
    from specserve.serving.loop import make_scheduler

    sch = make_scheduler(build_decoder(model), len(batch), 2048, chunk)
    first: dict[int, float] = {}
    t0 = time.perf_counter()
    for i, p in enumerate(batch):
        sch.submit(p, SamplingParams(max_tokens=max_tokens),
                   on_tokens=lambda _t, i=i: first.setdefault(i, time.perf_counter() - t0))
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
    batch = prompts(args.model, args.data, args.prompts)
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
