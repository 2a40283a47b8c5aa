"""Does speculation ever lose? The draft-length policy against fixed draft lengths and plain
decoding on the real model, in flight, at several concurrencies (docs/results.md, "Speculation
that never loses").

In-process, no server: the engine's in-flight :class:`~specserve.runtime.scheduler.Scheduler`
over one target (``--model``, one torch thread) with each configuration's proposer: plain,
n-gram, and (where ``--eagle3`` and ``--draft`` exist) the EAGLE-3 head and the draft model,
each at fixed K (``--fixed``, the engine's ``--draft-len-policy fixed``) and with the
adaptive policy (the engine's default).
``c`` closed-loop clients each send ``--requests-per-client`` held-out chat prompts (chat
template applied, T = 0, ``--max-tokens`` or the end-of-turn token). The step-cost curve is
measured once, as an engine measures it at load, and shared. Configurations run one after
another inside each concurrency, so compare ratios within one run only; tokens per CPU-second
(process time, one torch thread) is what a loaded machine's wall clock hides. Every output is
checked against plain decoding's (lossless at T = 0).

    .venv/bin/python benchmarks/draft_policy.py --concurrency 1,8,16 --out reports/policy.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_cost import _prompts  # noqa: E402  (the held-out chat prompts, template applied)


def _configs(args: argparse.Namespace, target: Any,
             fixed: list[int]) -> dict[str, tuple[Any, bool]]:
    """name -> (a proposer factory, adaptive?)."""
    from specserve.runtime.proposers import NgramProposer

    out: dict[str, tuple[Any, bool]] = {"plain": (lambda: None, False)}
    makers: dict[str, Any] = {"ngram": lambda k: NgramProposer(k)}
    if args.eagle3 and (args.eagle3 / "config.json").is_file():
        from specserve.runtime.eagle3_dir import load_eagle3
        from specserve.runtime.proposers.eagle3 import Eagle3Proposer

        head = load_eagle3(args.eagle3, target.cfg, target.dtype, target.device)
        makers["eagle3"] = lambda k: Eagle3Proposer(head, k)
    if args.draft and (args.draft / "config.json").is_file():
        from specserve.runtime.model import load_model
        from specserve.runtime.proposers import DraftModelProposer

        small = load_model(args.draft, target.dtype, target.device)
        makers["draft"] = lambda k: DraftModelProposer(small, k)
    for name, make in makers.items():
        for k in fixed:
            out[f"{name} K={k}"] = ((lambda m=make, k=k: m(k)), False)
        out[f"{name} adaptive"] = ((lambda m=make: m(args.k)), True)
    return out


def _run(target: Any, proposer: Any, policy: Any, prompts: list[list[int]], c: int,
         per_client: int, max_tokens: int, eot: int) -> dict[str, Any]:
    from specserve.runtime.decoder import SamplingParams, SpecDecoder
    from specserve.runtime.scheduler import Scheduler

    dec = SpecDecoder(target, proposer, draft_policy=policy)
    params = SamplingParams(max_tokens=max_tokens, end_id=eot)
    sch = Scheduler(dec, c, max_len=max(map(len, prompts)) + max_tokens + 8)
    sent, users, outs = [0], [], {}

    def submit(i: int) -> None:
        t0 = time.perf_counter()
        toks: list[int] = []

        def on_done(_r: object) -> None:
            users.append(len(toks) / max(time.perf_counter() - t0, 1e-9))
            outs[i] = list(toks)
            if sent[0] < c * per_client:
                sent[0] += 1
                submit(sent[0] - 1)
        sch.submit(prompts[i % len(prompts)], params, on_tokens=toks.extend, on_done=on_done)

    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(c):
        sent[0] += 1
        submit(sent[0] - 1)
    sch.run_until_idle()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    n = sum(len(o) for o in outs.values())
    return {"output_tok_s": n / wall, "per_user_tok_s": statistics.mean(users), "tokens": n,
            "tok_per_cpu_s": n / cpu, "wall_s": wall, "cpu_s": cpu, "users": users,
            "outputs": [outs[i] for i in sorted(outs)],
            "plain_share": None if policy is None else policy.plain_share(),
            "steps_by_k": None if policy is None else dict(sorted(policy.steps_by_k.items()))}


def _merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two rounds of one configuration as one: tokens over summed wall and CPU seconds, the
    mean of every request's per-user rate, steps by K added (outputs: the last round's,
    equal at T = 0)."""
    if a is None:
        return b
    n = a["tokens"] + b["tokens"]
    users = a["users"] + b["users"]
    by_k = None if a["steps_by_k"] is None else {
        k: a["steps_by_k"].get(k, 0) + b["steps_by_k"].get(k, 0)
        for k in sorted({*a["steps_by_k"], *b["steps_by_k"]})}
    plain = None if by_k is None else by_k.get(0, 0) / max(sum(by_k.values()), 1)
    return {**b, "tokens": n, "wall_s": a["wall_s"] + b["wall_s"],
            "cpu_s": a["cpu_s"] + b["cpu_s"], "users": users,
            "output_tok_s": n / (a["wall_s"] + b["wall_s"]),
            "per_user_tok_s": statistics.mean(users),
            "tok_per_cpu_s": n / (a["cpu_s"] + b["cpu_s"]),
            "plain_share": plain, "steps_by_k": by_k,
            "equal_rounds": a.get("equal_rounds", True) and a["outputs"] == b["outputs"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints/smollm2")
    ap.add_argument("--eagle3", type=Path, default=ROOT / "checkpoints/smollm2-drafts/eagle3")
    ap.add_argument("--draft", type=Path, default=ROOT / "checkpoints/smollm2-drafts/draft",
                    help="a draft model's HF directory (make train-real); none: not run")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache/data/chat-heldout.jsonl")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="the adaptive policy's longest chain")
    ap.add_argument("--fixed", default="1,2,4", help="fixed draft lengths to compare")
    ap.add_argument("--fixed-above-c1", default="4", help="fixed K beyond c = 1 (fewer runs)")
    ap.add_argument("--only", help="comma-separated configurations (plain always runs)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the configurations this many times, in turn and in reverse "
                         "(ABBA), summed")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from specserve.runtime.draft_policy import DraftLenPolicy, measure_step_cost, probe_rows
    from specserve.runtime.model import load_model

    target = load_model(args.model)
    from transformers import AutoTokenizer
    eot = AutoTokenizer.from_pretrained(str(args.model)).convert_tokens_to_ids("<|im_end|>")
    prompts = _prompts(args.model, args.data, args.prompts)
    conc = [int(x) for x in args.concurrency.split(",")]
    t0 = time.perf_counter()
    cost = measure_step_cost(target, probe_rows(max(conc) * (args.k + 1)))
    curve = zip(cost.rows, cost.seconds, strict=True)
    print(f"step cost measured in {time.perf_counter() - t0:.1f} s: " + ", ".join(
        f"T({r})/T(1)={s / cost.seconds[0]:.2f}" for r, s in curve))
    results: dict[str, dict[str, Any]] = {}
    for c in conc:
        fixed = [int(x) for x in (args.fixed_above_c1 if c > 1 else args.fixed).split(",")]
        configs = {name: cfg for name, cfg in _configs(args, target, fixed).items()
                   if not args.only or name == "plain" or name in args.only.split(",")}
        per = results.setdefault(str(c), {})
        names = list(configs)
        for rnd in range(args.rounds):  # ABBA...: a host whose speed drifts hits all alike
            for name in names if rnd % 2 == 0 else names[::-1]:
                make, adaptive = configs[name]
                policy = DraftLenPolicy(cost) if adaptive else None
                r = _run(target, make(), policy, prompts, c, args.requests_per_client,
                         args.max_tokens, eot)
                per[name] = _merge(per.get(name), r)
        base = per["plain"]
        for name, r in per.items():
            r["equal_to_plain"] = (r["outputs"] == base["outputs"]
                                   and r.get("equal_rounds", True))
            share = "-" if r["plain_share"] is None else f"{r['plain_share']:.2f}"
            print(f"c={c:<3} {name:18s} output {r['output_tok_s']:6.1f} tok/s "
                  f"({r['output_tok_s'] / base['output_tok_s']:.2f}x)  per-user "
                  f"{r['per_user_tok_s']:6.1f} "
                  f"({r['per_user_tok_s'] / base['per_user_tok_s']:.2f}x)  per CPU-s "
                  f"{r['tok_per_cpu_s'] / base['tok_per_cpu_s']:.2f}x  K=0 steps {share}"
                  f"  equal {r['equal_to_plain']}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for per_c in results.values():
            for r in per_c.values():
                r.pop("outputs")
                r.pop("users")
        args.out.write_text(json.dumps({
            "cpu": platform.processor() or platform.machine(), "threads": 1,
            "step_cost": {"rows": cost.rows, "seconds": cost.seconds},
            "max_tokens": args.max_tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
