"""Where one in-flight step's time goes at batch 8 and 16: attention, matmuls,
gathers and copies, other ATen ops, Python outside ATen, and the proposer's share.

In-process, no server: the same closed-loop load as ``benchmarks/inflight.py`` (``c`` clients,
the ``builtin-code`` prompts or ``--dataset``'s, T = 0, EOS off) on a
:class:`~specserve.runtime.scheduler.Scheduler` over the demo pair (``--mode draft``), n-gram
(``--mode ngram``) or the target alone (``--mode none``), one torch thread, profiled
with ``torch.profiler`` (CPU activities; self time per ATen op, grouped). The proposer's share is
the wall time inside ``Proposer.get_proposal`` (wrapped here, never in the product). "Python
outside ATen" is the step's wall time minus the self time of every ATen and oneDNN
(``mkldnn::``) op: the interpreter, the scheduler and runner bookkeeping, tensor construction
from lists, and the profiler's own per-op cost (so it reads high; compare the two
concurrencies, not the absolute share).

    python benchmarks/profile_step.py [--mode draft|ngram|none] [--concurrency 8,16] \
        [--dataset F.jsonl] [--json out.json]

Shares, not absolute times, are the result: a shared machine moves the totals.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# ATen op name -> group (first match wins; "aten::" stripped)
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("_scaled_dot_product", "scaled_dot_product", "softmax", "baddbmm", "bmm")),
    ("matmul", ("_linear_pointwise", "linear", "addmm", "mm", "matmul")),
    ("gather/copy", ("index", "gather", "scatter", "cat", "copy_", "stack", "slice_scatter",
                     "masked_fill", "where", "to", "_to_copy", "clone", "contiguous")),
    ("sampling", ("argmax", "topk", "sort", "multinomial", "max", "eq", "cumsum")),
)


def group_of(op: str) -> str:
    """The group of op ``op`` (``aten::mm``, ``mkldnn::_linear_pointwise`` -> ``matmul``;
    unknown -> ``other aten``)."""
    name = op.split("::", 1)[-1]
    for group, keys in GROUPS:
        if any(name == k or name.startswith(k) for k in keys):
            return group
    return "other aten"


def _timed(fn: Callable[..., Any], acc: list[float]) -> Callable[..., Any]:
    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            acc[0] += time.perf_counter() - t0
    return wrapper


def profile(model: Path, draft: Path, mode: str, c: int, prompts: list[list[int]],
            max_tokens: int, per_client: int, window: int = 0) -> dict[str, Any]:
    """One profiled closed-loop run at concurrency ``c``; shares of wall time per group."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from specserve.runtime.decoder import SamplingParams
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.scheduler import Scheduler

    torch.set_num_threads(1)
    dec = build_decoder(model, draft_dir=draft if mode == "draft" else None,
                        ngram=mode == "ngram", max_draft_len=4,
                        draft_window=window if mode == "draft" else 0)
    sch = Scheduler(dec, c, max_len=max(map(len, prompts)) + max_tokens)
    proposer_s = [0.0]
    prop = dec.proposer
    if prop is not None:
        prop.get_proposal = _timed(prop.get_proposal, proposer_s)  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=max_tokens)
    sent, tokens, steps = [0], [0], [0]

    def submit(i: int) -> None:
        def on_tokens(new: list[int]) -> None:
            tokens[0] += len(new)

        def on_done(_r: object) -> None:
            if sent[0] < c * per_client:
                sent[0] += 1
                submit(sent[0] - 1)
        sch.submit(prompts[i % len(prompts)], params, on_tokens=on_tokens, on_done=on_done)

    sch.submit(prompts[0], SamplingParams(max_tokens=4))  # warm-up
    sch.run_until_idle()
    proposer_s[0] = 0.0
    for _ in range(c):
        sent[0] += 1
        submit(sent[0] - 1)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        while sch.step():
            steps[0] += 1
        wall = time.perf_counter() - start
    groups: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.key.startswith(("aten::", "mkldnn::")):
            g = group_of(ev.key)
            groups[g] = groups.get(g, 0.0) + ev.self_cpu_time_total / 1e6
    aten = sum(groups.values())
    shares = {g: s / wall for g, s in sorted(groups.items(), key=lambda kv: -kv[1])}
    shares["python outside aten"] = max(0.0, wall - aten) / wall
    return {"mode": mode, "c": c, "wall_s": wall, "steps": steps[0], "tokens": tokens[0],
            "ms_per_step": 1e3 * wall / max(1, steps[0]), "shares": shares,
            "proposer_share": proposer_s[0] / wall,
            "top_ops": [(ev.key, ev.self_cpu_time_total / 1e6 / wall, ev.count)
                        for ev in sorted(prof.key_averages(),
                                         key=lambda e: -e.self_cpu_time_total)[:12]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints/demo/target")
    ap.add_argument("--draft", type=Path, default=ROOT / "checkpoints/demo/draft")
    ap.add_argument("--mode", choices=["draft", "ngram", "none"], default="draft")
    ap.add_argument("--concurrency", default="8,16")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--dataset", type=Path,
                    help="prompts from this JSONL (e.g. benchmarks/peers.py --input-length's)")
    ap.add_argument("--draft-window", type=int, default=0,
                    help="--mode draft: the draft proposes from its last N keys (0: all)")
    args = ap.parse_args()

    from tokenizers import Tokenizer

    from specserve.client.builtin_prompts import builtin_code_prompts

    model = args.model.resolve()
    tok = Tokenizer.from_file(str(model.parent / "tokenizer" / "tokenizer.json"))
    texts = ([json.loads(line)["prompt"] for line in args.dataset.read_text().splitlines()]
             if args.dataset else [p.text for p in builtin_code_prompts(32, seed=0)])
    prompts = [tok.encode(t).ids for t in texts]
    results = [profile(model, args.draft.resolve(), args.mode, int(c), prompts,
                       args.max_tokens, args.requests_per_client, args.draft_window)
               for c in args.concurrency.split(",")]
    for r in results:
        print(f"{r['mode']} c={r['c']}: {r['ms_per_step']:.2f} ms/step, {r['steps']} steps, "
              f"{r['tokens']} tokens; proposer {100 * r['proposer_share']:.1f}% of wall")
        for g, s in r["shares"].items():
            print(f"  {g:22s} {100 * s:5.1f}%")
        print("  top ATen ops (self share, calls):")
        for key, share, count in r["top_ops"]:
            print(f"    {key:40s} {100 * share:5.1f}%  {count}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
