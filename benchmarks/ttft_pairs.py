"""TTFT per prompt, two servers alternated: an OpenAI server (vLLM) and our Triton ensemble,
c = 1, the same prompts, who goes first alternating prompt by prompt, ``--gap`` seconds between
requests (back to back, the request after vLLM's ran slower: its threads spin on after a
request). Both servers must be up (``specserve serve``; vLLM as ``benchmarks/peers.py`` starts
it). Per prompt: its tokens (the served tokenizer), both TTFTs and ours / vLLM; then the median
ratio, under and over ``--long`` tokens.

    PYTHONPATH=. .venv/bin/python benchmarks/ttft_pairs.py --openai 127.0.0.1:8100 \\
        --served smollm2 --triton 127.0.0.1:8001 --prompts chat-c1.jsonl \\
        --tokenizer checkpoints/smollm2/tokenizer.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any


async def ttft_ms(transport: Any, model: str, prompt: str, params: Any,
                  declared: frozenset[str] | None) -> float:
    raw = await transport.generate(model, prompt, params, declared, 600)
    if raw.error or not raw.chunk_times_s:
        raise SystemExit(f"{model}: {raw.error or 'no tokens'}")
    return 1000 * float(raw.chunk_times_s[0])


async def run(args: argparse.Namespace, prompts: list[str]) -> list[tuple[float, float]]:
    """(vLLM TTFT ms, ours) per prompt."""
    from specserve.client.openai import OpenAITransport
    from specserve.client.transport import GenParams
    from specserve.client.triton_grpc import GrpcTransport

    theirs, ours = OpenAITransport(args.openai), GrpcTransport(args.triton)
    declared = await ours.declared_inputs(args.model)
    p_theirs = GenParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    p_ours = GenParams(max_tokens=args.max_tokens, temperature=0.0, end_id=-1)
    rows = []
    try:
        for i, p in enumerate(prompts):
            got: dict[str, float] = {}
            for who in (("v", "o") if i % 2 == 0 else ("o", "v")):
                got[who] = await (ttft_ms(theirs, args.served, p, p_theirs, None) if who == "v"
                                  else ttft_ms(ours, args.model, p, p_ours, declared))
                await asyncio.sleep(args.gap)
            rows.append((got["v"], got["o"]))
    finally:
        await ours.close()
        await theirs.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--openai", required=True, help="HOST:PORT of the OpenAI server")
    ap.add_argument("--served", required=True, help="its model name")
    ap.add_argument("--triton", required=True, help="HOST:PORT (gRPC) of ours")
    ap.add_argument("--model", default="ensemble_baseline")
    ap.add_argument("--prompts", type=Path, required=True, help="JSONL prompts (text)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--gap", type=float, default=1.5)
    ap.add_argument("--long", type=int, default=300)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from specserve.client.datasets import load_dataset

    prompts = [p.text for p in load_dataset(args.prompts)][:args.requests]
    tok = Tokenizer.from_file(str(args.tokenizer))
    rows = asyncio.run(run(args, prompts))
    print("prompt  tokens  vLLM ms  ours ms  ours / vLLM")
    by_len: dict[bool, list[float]] = {False: [], True: []}
    for i, (p, (v, o)) in enumerate(zip(prompts, rows, strict=True)):
        n = len(tok.encode(p).ids)
        print(f"{i:6d} {n:7d} {v:8.0f} {o:8.0f} {o / v:12.2f}")
        if i:  # the first warms both up
            by_len[n > args.long].append(o / v)
    for long, ratios in by_len.items():
        if ratios:
            print(f"{'over' if long else 'up to'} {args.long} tokens: median ours / vLLM "
                  f"{statistics.median(ratios):.2f} over {len(ratios)} prompts "
                  f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
