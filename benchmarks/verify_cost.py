"""What a verify step costs on the real model: an oracle proposer (the model's own greedy
continuation, so every draft is accepted and only the machinery is timed) at draft length K,
against plain decoding, at batch B (``make bench-verify``).

For each B, the B rows are one held-out chat prompt each (chat template applied); the reference
continuations come from plain decoding (float32 is deterministic, so the oracle's drafts are the
target's own tokens and all are accepted). Cases are run round-robin (every K once, then again),
``--repeats`` times, and the median of each is kept, so a noisy neighbour slows all alike. Only
decode steps are timed (``SpecDecoder._step``, wrapped by ``verify_profile.timed_steps``): the
prefill, which a whole ``generate`` would spread over fewer steps the larger K is, is left out.
The step cost is a decode step's wall time over plain decoding's (and in the thread's CPU time,
which other jobs move less); the oracle speedup is decode tokens per second (the prefill's token
left out) over plain's. Where the step's time goes (a profile, shares per part of the model) and
plain decoding's share of the read bandwidth: ``benchmarks/verify_profile.py``.

    .venv/bin/python benchmarks/verify_cost.py --batches 1,4,8 --ks 1,2,4,7 --tokens 96
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


def _prompts(model: Path, data: Path, n: int, last: int | None = 256) -> list[list[int]]:
    """The first ``n`` chat prompts of ``data``, the chat template applied, tokenized; each its
    last ``last`` tokens at most (None: whole)."""
    from transformers import AutoTokenizer

    from specserve.client.datasets import load_dataset

    tok = AutoTokenizer.from_pretrained(str(model))
    out = []
    for p in load_dataset(data)[:n]:
        msgs = [{"role": r, "content": c} for r, c in p.messages]
        enc: Any = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)
        ids = list(enc["input_ids"])
        out.append(ids if last is None else ids[-last:])
    return out


def _timed(dec: Any, prompts: list[list[int]], tokens: int) -> tuple[float, float, int, int]:
    """Decode steps only: wall seconds, thread CPU seconds, steps, and the tokens they made
    (every row's first token comes from its prefill, left out)."""
    from verify_profile import patched, step_timer  # the profile mode's step timer

    from specserve.runtime.params import SamplingParams

    wall: list[float] = []
    cpu: list[float] = []
    with patched(step_timer(wall, None, cpu)):
        res = dec.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0))
    return sum(wall), sum(cpu), len(wall), sum(len(r.token_ids) - 1 for r in res)


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
        wall: dict[int, list[float]] = {k: [] for k in ks}
        cpu: dict[int, list[float]] = {k: [] for k in ks}
        steps: dict[int, int] = {}
        toks: dict[int, int] = {}
        for _ in range(args.repeats):
            for k in ks:
                w, c, steps[k], toks[k] = _timed(decs[k], prompts, args.tokens)
                wall[k].append(w)
                cpu[k].append(c)
        base_w = statistics.median(wall[0]) / steps[0]
        base_c = statistics.median(cpu[0]) / steps[0]
        plain_rate = toks[0] / statistics.median(wall[0])
        for k in ks:
            w, c = statistics.median(wall[k]), statistics.median(cpu[k])
            rows[f"B={b} K={k}"] = {
                "batch": b, "k": k, "tokens_per_step": round(toks[k] / b / steps[k], 2),
                "step_ms": round(1e3 * w / steps[k], 2),
                "step_over_plain": round(w / steps[k] / base_w, 3),
                "cpu_step_over_plain": round(c / steps[k] / base_c, 3),
                "tokens_per_s": round(toks[k] / w, 1),
                "speedup": round(toks[k] / w / plain_rate, 2)}
        print(f"batch {b} done", flush=True)
    return {"rows": rows, "cpu": platform.processor() or platform.machine(),
            "threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| batch | K | tokens per step | step ms | step / plain step (wall) | (CPU) | "
             "decode tok/s | oracle speedup |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"].values():
        lines.append(f"| {r['batch']} | {r['k']} | {r['tokens_per_step']:.2f} | "
                     f"{r['step_ms']:.1f} | {r['step_over_plain']:.2f} | "
                     f"{r['cpu_step_over_plain']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x |")
    return "\n".join(lines)


def oracle_args(ap: argparse.ArgumentParser, tokens: int) -> None:
    """The options this benchmark and its profile mode (verify_profile.py) share."""
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "smollm2")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache" / "data" / "chat-heldout.jsonl")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--ks", default="1,2,4,7")
    ap.add_argument("--tokens", type=int, default=tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    oracle_args(ap, 96)
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
