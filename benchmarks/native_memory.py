"""RSS of the serving loop's process over rounds of the kv soak's mixed traffic, in process, for
each native-memory setting side by side (the goal: RSS stays flat; what is traced and
why in ``specserve/runtime/native_memory.py`` and ``docs/reliability.md`` §3).

Each variant runs in a fresh child process (oneDNN reads its cache capacity once): the engine
(default ``engines/demo-draft``) behind :class:`~specserve.serving.loop.ServingLoop` with
an 8-row scheduler and a small prefix cache; each round queues ``--per-round`` requests drawn as
``benchmarks/kv_soak.py`` draws them (short, 256/500-token, shared-preamble prompts; 16/48/96
tokens; every 10th cancelled after its first tokens). After each round the child prints its
RSS and the round's output tok/s. The parent prints one table: RSS growth after the first
quarter of the rounds and tok/s relative to the first variant.

    .venv/bin/python benchmarks/native_memory.py --rounds 24 --per-round 100
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
CAPS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's (torch)
# name -> (capacity of both primitive caches, "" for their default 1024; trim interval s, 0: off)
VARIANTS = {"as before": ("", 0.0), "trim": ("", 10.0), "caps 0": ("0", 0.0),
            "caps 64": ("64", 0.0), "caps 128": ("128", 0.0), "caps 256": ("256", 0.0),
            "caps 256 + trim": ("256", 10.0)}


class Counter:
    """A sender that counts tokens and cancels every 10th request after its first chunk."""

    def __init__(self, cancel: bool) -> None:
        self.tokens, self.cancel, self.final = 0, cancel, False

    def send(self, arrays: Any, error: str | None, final: bool) -> bool:
        if arrays is not None and "output_ids" in arrays:
            self.tokens += int(arrays["output_ids"].size)
        self.final = self.final or final
        return True

    def cancelled(self) -> bool:
        return self.cancel and self.tokens > 0


def child(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    from kv_soak import prompt_pool

    from specserve.runtime.native_memory import Trimmer
    from specserve.runtime.params import SamplingParams
    from specserve.serving.engine import (
        engine_limits,
        external_verify,
        load_decoder,
        make_scheduler,
    )
    from specserve.serving.loop import Pending, ServingLoop
    from specserve.serving.request import LlmRequest
    from tests.helpers.soak import rss_bytes

    dec, tok, rec = load_decoder(str(a.engine), True)
    limits = engine_limits(rec, dec.target.cfg.vocab_size, tok.eos_token_id)
    pool = prompt_pool(a.seed)
    rng = random.Random(a.seed)
    for r in range(a.rounds):
        q: queue.Queue[Pending | None] = queue.Queue()
        sch = make_scheduler(dec, 8, limits.max_seq_len, 256, a.cache_mb << 20) \
            if r == 0 else sch  # noqa: F821 (one scheduler, one cache, all rounds)
        loop = ServingLoop(sch, q, 4096, external_verify(dec, 4), lambda ids: "x" * len(ids),
                           trimmer=Trimmer(busy_every_s=a.trim_s) if a.trim_s > 0 else None)
        senders = []
        for i in range(a.per_round):
            kind = rng.choice(("short", "long", "shared", "shared"))
            ids = tok.encode(rng.choice(pool[kind]))
            s = Counter(cancel=i % 10 == 9)
            senders.append(s)
            mt = rng.choice((16, 48, 96))
            req = LlmRequest(prompt=ids, max_tokens=mt, streaming=True, end_id=-1)
            params = SamplingParams(max_tokens=mt)
            q.put(Pending(req=req, params=params, sender=s, arrival=0))
        q.put(None)
        t0 = time.perf_counter()
        loop.run()
        wall = time.perf_counter() - t0
        tokens = sum(s.tokens for s in senders)
        print(json.dumps({"round": r, "rss_mb": round(rss_bytes() / 2**20, 1),
                          "tok_s": round(tokens / wall, 1)}), flush=True)


def parent(a: argparse.Namespace) -> None:
    rows = []
    for name in a.variants.split(","):
        cap, trim = VARIANTS[name]
        env = dict(os.environ)
        for key in CAPS:
            env.pop(key, None)
            if cap:
                env[key] = cap
        cmd = [sys.executable, __file__, "--child", "--trim-s", str(trim), "--engine",
               str(a.engine), "--rounds", str(a.rounds), "--per-round", str(a.per_round),
               "--cache-mb", str(a.cache_mb), "--seed", str(a.seed)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        per = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        rss = [p["rss_mb"] for p in per]
        q = len(rss) // 4
        rows.append({"variant": name, "rss_first": rss[0], "rss_quarter": rss[q],
                     "rss_last": rss[-1], "growth_after_quarter_mb": round(rss[-1] - rss[q], 1),
                     "tok_s_mean": round(sum(p["tok_s"] for p in per[1:]) / (len(per) - 1), 1),
                     "rss_mb": rss})
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["tok_s_mean"]
    print("\n| variant | RSS round 1 / quarter / last (MB) | growth after quarter | tok/s | x |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['rss_first']:.0f} / {r['rss_quarter']:.0f} / "
              f"{r['rss_last']:.0f} | {r['growth_after_quarter_mb']:+.1f} MB | "
              f"{r['tok_s_mean']:.0f} | {r['tok_s_mean'] / base:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", type=Path, default=ROOT / "engines" / "demo-draft")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--cache-mb", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trim-s", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    child(a) if a.child else parent(a)


if __name__ == "__main__":
    main()
