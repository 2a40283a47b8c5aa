"""In-flight engine throughput, this tree against an earlier revision, side by side in one run
(the plan / execute / update scheduler against the one it replaced).

In-process, no server: a :class:`~specserve.runtime.scheduler.Scheduler` over the demo pair
(``--model``/``--draft``, or n-gram with ``--mode ngram``), ``c`` closed-loop clients (each
submits its next request from the previous one's ``on_done``), ``--requests-per-client``
requests each, ``--max-tokens`` new tokens, T = 0, EOS off, the ``builtin-code`` prompts. Each
(revision, c) runs in its own subprocess (``PYTHONPATH`` = that revision's tree, exported with
``git archive``), the two revisions alternating, ``--repeats`` times; the best output tok/s of
each is reported with its TTFT p50 (submit -> first token), and the best tokens per CPU-second
(process time, one torch thread: what a loaded machine's wall clock hides).

    python benchmarks/inflight.py [--before REV] [--concurrency 1,8,16] [--mode draft|ngram]

Timings on a shared machine move with its load: compare the two columns of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _worker(cfg: dict[str, Any]) -> dict[str, float]:
    """One (revision, c) measurement in this process (imports the tree on PYTHONPATH)."""
    import torch

    from specserve.runtime.decoder import SamplingParams
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.scheduler import Scheduler

    torch.set_num_threads(cfg["threads"])
    ngram = cfg["mode"] == "ngram"
    dec = build_decoder(cfg["model"], draft_dir=None if ngram else cfg["draft"], ngram=ngram,
                        max_draft_len=4)
    c, prompts = cfg["c"], cfg["prompts"]
    params = SamplingParams(max_tokens=cfg["max_tokens"])  # T = 0, no end_id
    cache = {"prefix_cache_bytes": cfg["prefix_mb"] << 20} if cfg.get("prefix_mb") else {}
    sch = Scheduler(dec, c, max_len=max(map(len, prompts)) + cfg["max_tokens"], **cache)
    sent, tokens, ttft = [0], [0], []

    def submit(i: int) -> None:
        t0, first = time.perf_counter(), [True]

        def on_tokens(new: list[int]) -> None:
            if first[0]:
                ttft.append(time.perf_counter() - t0)
                first[0] = False
            tokens[0] += len(new)

        def on_done(_r: object) -> None:
            if sent[0] < c * cfg["per_client"]:
                sent[0] += 1
                submit(sent[0] - 1)
        sch.submit(prompts[i % len(prompts)], params, on_tokens=on_tokens, on_done=on_done)

    # warm-up on a prompt the run does not send (with a prefix cache, a warm-up on prompts[0]
    # would be reused by the first request, which no cache-off run gets)
    sch.submit(prompts[0][::-1], SamplingParams(max_tokens=4))
    sch.run_until_idle()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(c):
        sent[0] += 1
        submit(sent[0] - 1)
    sch.run_until_idle()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"tok_s": tokens[0] / wall, "tok_cpu_s": tokens[0] / cpu,
            "ttft_p50_ms": 1e3 * statistics.median(ttft), "tokens": tokens[0], "wall_s": wall}


def _export(rev: str, out: Path) -> Path:
    """``rev``'s specserve package into ``out`` (git archive)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "specserve"],
                          check=True, capture_output=True).stdout
    tar = out / "tree.tar"
    tar.write_bytes(data)
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    return out


def _run(tree: Path, cfg: dict[str, Any]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(cfg)], env=env,
                          check=True, capture_output=True, text=True, cwd=tree)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _prompts(model: Path, n: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from specserve.client.builtin_prompts import builtin_code_prompts

    tok = Tokenizer.from_file(str(model.parent / "tokenizer" / "tokenizer.json"))
    return [tok.encode(p.text).ids for p in builtin_code_prompts(n, seed=0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="904f7a1", help="the earlier revision (git)")
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints/demo/target")
    ap.add_argument("--draft", type=Path, default=ROOT / "checkpoints/demo/draft")
    ap.add_argument("--mode", choices=["draft", "ngram"], default="draft")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefix-cache-mb", type=int, default=0,
                    help="the after tree's prefix cache (MiB; 0: none, as before)")
    ap.add_argument("--before-prefix-cache-mb", type=int, default=0,
                    help="the before tree's prefix cache (MiB; 0: none)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return
    prompts = _prompts(args.model.resolve(), 32)
    levels = [int(x) for x in args.concurrency.split(",")]
    best: dict[tuple[str, int], dict[str, float]] = {}
    cpu_best: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": _export(args.before, Path(tmp)), "after": ROOT}
        for c in levels:
            cfg = {"model": str(args.model.resolve()), "draft": str(args.draft.resolve()),
                   "mode": args.mode, "c": c, "prompts": prompts, "max_tokens": args.max_tokens,
                   "per_client": args.requests_per_client, "threads": args.threads}
            for _ in range(args.repeats):
                for name, tree in trees.items():  # alternating: before, after, before, ...
                    r = _run(tree, dict(cfg, prefix_mb=args.before_prefix_cache_mb)
                             if name == "before" else dict(cfg, prefix_mb=args.prefix_cache_mb))
                    key = (name, c)
                    if key not in best or r["tok_s"] > best[key]["tok_s"]:
                        best[key] = r
                    cpu_best[key] = max(cpu_best.get(key, 0.0), r["tok_cpu_s"])
    print(f"mode {args.mode}, before = {args.before}, {args.max_tokens} tokens, "
          f"{args.requests_per_client} requests per client, best of {args.repeats}, "
          f"before's prefix cache {args.before_prefix_cache_mb} MiB, after's "
          f"{args.prefix_cache_mb} MiB")
    print("| c | tok/s before | tok/s after | after / before | tok/CPU-s before | after | "
          "after / before | TTFT p50 ms before | after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in levels:
        b, a = best[("before", c)], best[("after", c)]
        cb, ca = cpu_best[("before", c)], cpu_best[("after", c)]
        print(f"| {c} | {b['tok_s']:.0f} | {a['tok_s']:.0f} | {a['tok_s'] / b['tok_s']:.2f} | "
              f"{cb:.0f} | {ca:.0f} | {ca / cb:.2f} | "
              f"{b['ttft_p50_ms']:.1f} | {a['ttft_p50_ms']:.1f} |")


if __name__ == "__main__":
    main()
