"""What a verify step costs on the real model: an oracle proposer (the model's own greedy
continuation, so every draft is accepted and only the machinery is timed) at draft length K,
against plain decoding, at batch B (``make bench-verify``).

For each B, the B rows are one held-out chat prompt each (chat template applied); the reference
continuations come from plain decoding (float32 is deterministic, so the oracle's drafts are the
target's own tokens and all are accepted). Cases are run round-robin (every K once, then again),
``--repeats`` times, and the median of each is kept, so a noisy neighbour slows all alike. The
step cost is the wall time per target forward; the table gives it over plain decoding's and the
tokens per second. Where the step's time goes (a profile, shares per part of the model) and
plain decoding's share of the read bandwidth: ``benchmarks/verify_profile.py``.

    .venv/bin/python benchmarks/verify_cost.py --batches 1,4,8 --ks 1,2,4,7 --tokens 48
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _prompts(model: Path, data: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from specserve.client.datasets import load_dataset

    tok = AutoTokenizer.from_pretrained(str(model))
    out = []
    for p in load_dataset(data)[:n]:
        msgs = [{"role": r, "content": c} for r, c in p.messages]
        enc: Any = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)
        out.append(list(enc["input_ids"])[-256:])  # the prompt's last 256 tokens at most
    return out


def _timed(dec: Any, prompts: list[list[int]], tokens: int) -> tuple[float, int, int]:
    from specserve.runtime.params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    t0 = time.perf_counter()
    res = dec.generate(prompts, params)
    dt = time.perf_counter() - t0
    return dt, sum(r.stats.steps for r in res) // len(res), sum(len(r.token_ids) for r in res)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.model import load_model
    from specserve.runtime.params import SamplingParams
    from specserve.runtime.proposers.oracle import OracleProposer

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    batches = [int(b) for b in args.batches.split(",")]
    ks = [0] + [int(k) for k in args.ks.split(",")]
    all_prompts = _prompts(args.model, args.data, max(batches))
    rows: dict[str, Any] = {}
    for b in batches:
        prompts = all_prompts[:b]
        plain = SpecDecoder(model)
        refs = [p + list(r.token_ids) for p, r in zip(
            prompts, plain.generate(prompts, SamplingParams(max_tokens=args.tokens)),
            strict=True)]
        decs = {k: plain if k == 0 else SpecDecoder(model, OracleProposer(refs, k))
                for k in ks}
        _timed(plain, prompts, 4)  # warm-up
        times: dict[int, list[float]] = {k: [] for k in ks}
        steps: dict[int, int] = {}
        toks: dict[int, int] = {}
        for _ in range(args.repeats):
            for k in ks:
                dt, steps[k], toks[k] = _timed(decs[k], prompts, args.tokens)
                times[k].append(dt)
        base = statistics.median(times[0]) / steps[0]
        for k in ks:
            med = statistics.median(times[k])
            rows[f"B={b} K={k}"] = {
                "batch": b, "k": k, "tokens_per_step": round(toks[k] / b / steps[k], 2),
                "step_ms": round(1e3 * med / steps[k], 2),
                "step_over_plain": round(med / steps[k] / base, 3),
                "tokens_per_s": round(toks[k] / med, 1)}
        print(f"batch {b} done", flush=True)
    return {"rows": rows, "cpu": platform.processor() or platform.machine(),
            "threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| batch | K | tokens per step | step ms | step / plain step | tok/s |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"].values():
        lines.append(f"| {r['batch']} | {r['k']} | {r['tokens_per_step']:.2f} | "
                     f"{r['step_ms']:.1f} | {r['step_over_plain']:.2f} | "
                     f"{r['tokens_per_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "smollm2")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache" / "data" / "chat-heldout.jsonl")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--ks", default="1,2,4,7")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "verify-cost.json")
    args = ap.parse_args()
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
