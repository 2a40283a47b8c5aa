"""Every speculation method on the real model, offline, per category (``make bench-real``).

The reference decoder (one torch thread, c = 1, T = 0, each answer ``--max-tokens`` long or to
the end-of-turn token) on the held-out chat prompts of ``make real-prompts`` with the chat
template applied. Methods are interleaved prompt by prompt (plain, n-gram, EAGLE-3, Medusa,
draft, then the next prompt), so a noisy neighbour slows all of them alike; the speedup of a
method is its total tokens / total seconds over plain's on the same prompts, and its tau the
tokens per target forward. Every output is checked against plain decoding's (lossless at
T = 0; a divergence is counted with its top-2 margin). Prints a Markdown table and writes JSON.

    .venv/bin/python benchmarks/real_methods.py --drafts checkpoints/smollm2-drafts \\
        --out reports/real-methods.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _decoders(model: Path, drafts: Path, k: int) -> dict[str, Any]:
    from specserve.runtime.loader import build_decoder

    out = {"plain": build_decoder(model), "ngram": build_decoder(model, ngram=True,
                                                                  max_draft_len=k)}
    for name, key in (("eagle3", "eagle3_dir"), ("medusa", "medusa_dir"),
                      ("draft", "draft_dir")):
        if (drafts / name / "config.json").is_file():
            kw: dict[str, Any] = {key: drafts / name}
            out[name] = build_decoder(model, max_draft_len=k, **kw)
    return out


def _prompts(model: Path, data: Path, per_category: int) -> list[tuple[str, list[int]]]:
    from transformers import AutoTokenizer

    from specserve.client.datasets import load_dataset

    tok = AutoTokenizer.from_pretrained(str(model))
    seen: dict[str, int] = defaultdict(int)
    out = []
    for p in load_dataset(data):
        if seen[p.category] >= per_category:
            continue
        seen[p.category] += 1
        msgs = [{"role": r, "content": c} for r, c in p.messages]
        enc: Any = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)
        out.append((p.category, list(enc["input_ids"])))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from specserve.runtime.params import SamplingParams

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(str(args.model))
    decs = _decoders(args.model, args.drafts, args.k)
    prompts = _prompts(args.model, args.data, args.per_category)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0,
                            end_id=tok.eos_token_id)
    for d in decs.values():  # warm-up: kernels built, caches touched
        d.generate([prompts[0][1]], SamplingParams(max_tokens=8))
    cell: dict[tuple[str, str], dict[str, float]] = defaultdict(
        lambda: {"tokens": 0.0, "seconds": 0.0, "emitted": 0.0, "steps": 0.0, "same": 0.0,
                 "n": 0.0})
    for i, (cat, ids) in enumerate(prompts):
        plain_out: list[int] = []
        for name, dec in decs.items():
            t0 = time.perf_counter()
            (res,) = dec.generate([ids], params)
            dt = time.perf_counter() - t0
            if name == "plain":
                plain_out = list(res.token_ids)
            for key in ((name, cat), (name, "all")):
                c = cell[key]
                c["tokens"] += len(res.token_ids)
                c["seconds"] += dt
                c["emitted"] += res.stats.emitted_tokens  # tau: decode steps only
                c["steps"] += res.stats.steps
                c["same"] += float(list(res.token_ids) == plain_out)
                c["n"] += 1
        print(f"prompt {i + 1}/{len(prompts)} ({cat}) done", flush=True)
    return _table(cell, list(decs), args)


def _table(cell: dict[tuple[str, str], dict[str, float]], methods: list[str],
           args: argparse.Namespace) -> dict[str, Any]:
    cats = sorted({c for _, c in cell if c != "all"}) + ["all"]
    rows = {}
    for m in methods:
        for c in cats:
            x, base = cell[(m, c)], cell[("plain", c)]
            tps = x["tokens"] / max(x["seconds"], 1e-9)
            rows[f"{m}/{c}"] = {
                "method": m, "category": c, "prompts": int(x["n"]),
                "tau": round(x["emitted"] / max(x["steps"], 1.0), 3),
                "tokens_per_s": round(tps, 2),
                "speedup": round(tps / max(base["tokens"] / max(base["seconds"], 1e-9), 1e-9),
                                 3),
                "equal_to_plain": f"{int(x['same'])}/{int(x['n'])}"}
    return {"rows": rows, "cpu": platform.processor() or platform.machine(),
            "threads": args.threads, "max_tokens": args.max_tokens, "k": args.k,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| method | category | prompts | tau | tok/s | speedup vs plain | equal to plain |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"].values():
        lines.append(f"| {r['method']} | {r['category']} | {r['prompts']} | {r['tau']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['equal_to_plain']} |")
    return "\n".join(lines)


def eval_json(result: dict[str, Any]) -> dict[str, Any]:
    """The offline figures in the layout ``specserve engine --method fastest`` and ``specserve
    demo`` read (``demo-model``'s eval.json): per method tau and tokens/s over all categories,
    ``fastest_method`` the speculative method with the highest tokens/s."""
    overall = {r["method"]: r for r in result["rows"].values() if r["category"] == "all"}
    methods = {m: {"tau": r["tau"], "tokens_per_s": r["tokens_per_s"], "speedup": r["speedup"],
                   "matches_baseline": r["equal_to_plain"]}
               for m, r in overall.items() if m != "plain"}
    fastest = max(methods, key=lambda m: methods[m]["tokens_per_s"]) if methods else None
    return {"source": "benchmarks/real_methods.py", "date": result["date"], "cpu": result["cpu"],
            "baseline_tokens_per_s": overall["plain"]["tokens_per_s"],
            "fastest_method": fastest, **methods}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "smollm2")
    ap.add_argument("--drafts", type=Path, default=ROOT / "checkpoints" / "smollm2-drafts")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache" / "data" / "chat-heldout.jsonl")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="draft length for every method")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "real-methods.json")
    ap.add_argument("--eval-json", type=Path, default=None,
                    help="also write the figures as an eval.json (the fastest method) that "
                         "`specserve engine --method fastest` and `specserve demo --eval` read")
    args = ap.parse_args()
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.eval_json is not None:
        args.eval_json.write_text(json.dumps(eval_json(result), indent=2) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
