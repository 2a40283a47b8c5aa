"""Proposal cost per verify step and tau of speculation methods on the demo pair, in one
process (``make bench-proposal``; docs/results.md, "Which method is fastest?").

Each method is a reference decoder over ``checkpoints/demo/target``; the prompts (builtin code,
batch 1, T = 0, ``--max-tokens`` each) go through every method in turn, prompt by prompt, so
load from other processes hits them alike. The proposal cost of a step is the proposer's
``get_proposal`` plus the ``update`` after that step's verify forward (for EAGLE-3: the
catch-up, the draft steps and fusing the kept target states), timed with ``perf_counter``;
the table gives its median, the tau (tokens per verify step) and tokens/s of each method.

    .venv/bin/python benchmarks/proposal_cost.py --eagle3 checkpoints/demo/eagle3 \\
        --tree "{0}, {1}, {0, 0}, {0, 1}, {0, 0, 0}, {0, 0, 1}, {0, 0, 0, 0}, {0, 0, 0, 1}"
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "checkpoints" / "demo"


def _timed(prop: Any, costs: list[tuple[str, float]]) -> None:
    """Record the seconds of every get_proposal / update call of ``prop``."""
    for name in ("get_proposal", "update"):
        inner = getattr(prop, name)

        def wrapper(*a: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = _inner(*a, **kw)
            costs.append((_name, time.perf_counter() - t0))
            return out

        setattr(prop, name, wrapper)


def _step_costs(costs: list[tuple[str, float]]) -> list[float]:
    """Each proposal plus the update that follows its verify step (the prefill's update and
    a generation's last update without a proposal before it are not steps)."""
    out, pending = [], None
    for name, sec in costs:
        if name == "get_proposal":
            pending = sec
        elif pending is not None:
            out.append(pending + sec)
            pending = None
    return out


def main() -> None:
    import torch

    from specserve.client.builtin_prompts import builtin_code_prompts
    from specserve.runtime import loader
    from specserve.runtime.params import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eagle3", type=Path, default=DEMO / "eagle3")
    ap.add_argument("--tree", action="append", default=[],
                    help="also an EAGLE-3 static tree (brace form; repeatable)")
    ap.add_argument("--k", type=int, default=4, help="chain length of draft and EAGLE-3")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    methods: dict[str, dict[str, Any]] = {
        f"draft K={args.k}": {"draft_dir": DEMO / "draft", "max_draft_len": args.k},
        f"eagle3 K={args.k}": {"eagle3_dir": args.eagle3, "max_draft_len": args.k}}
    for i, tree in enumerate(args.tree):
        methods[f"eagle3 tree {i + 1}"] = {"eagle3_dir": args.eagle3, "eagle_choices": tree}
    decs = {k: loader.build_decoder(DEMO / "target", **kw) for k, kw in methods.items()}
    costs: dict[str, list[tuple[str, float]]] = {k: [] for k in decs}
    tok = loader.load_tokenizer(DEMO / "tokenizer")
    prompts = [tok.encode(p.text) for p in builtin_code_prompts(args.prompts)]
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, end_id=-1)
    totals = {k: [0, 0, 0.0] for k in decs}  # tokens, steps, seconds
    with torch.inference_mode():
        for name, dec in decs.items():  # warm up, then time
            dec.generate([prompts[0]], [SamplingParams(max_tokens=8, end_id=-1)])
            _timed(dec.proposer, costs[name])
        for p in prompts:
            for name, dec in decs.items():
                t0 = time.perf_counter()
                r = dec.generate([p], [sp])[0]
                t = totals[name]
                t[0], t[1], t[2] = t[0] + len(r.token_ids), t[1] + r.stats.steps, \
                    t[2] + time.perf_counter() - t0
    rows = []
    for name in decs:
        n, steps, sec = totals[name]
        rows.append({"method": name, "tau": round(n / steps, 2), "proposal_p50_ms": round(
            statistics.median(_step_costs(costs[name])) * 1e3, 2), "tok_s": round(n / sec, 1)})
        print(f"{name:16s} tau {rows[-1]['tau']:.2f}  proposal p50 "
              f"{rows[-1]['proposal_p50_ms']:.2f} ms/step  {rows[-1]['tok_s']:.0f} tok/s")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
