"""Multi-turn chat through the in-flight engine with and without the prefix cache, side by side
in one run (each turn resends the conversation; runtime/kv_pool.py).

In-process, no server: two :class:`~specserve.runtime.scheduler.Scheduler` s over two copies of
the demo pair (``--model``/``--draft``, or n-gram with ``--mode ngram``), one with a prefix
cache of ``--prefix-cache-mb``, one without. ``--conversations`` chats of ``--turns`` turns:
a shared system preamble, then per turn a user message (a ``builtin-code`` prompt) appended to
the conversation so far (every earlier message and answer, as token ids: a chat client resends
them), ``--max-tokens`` new tokens at T = 0 (EOS off). Each turn runs on both engines, one
after the other (which one first alternates), one request at a time; TTFT = submit -> first
token. The answers must be equal token for token (the run fails otherwise); the conversation
goes on with that answer.

    python benchmarks/multiturn.py [--conversations 4] [--turns 5] [--mode draft|ngram]

Timings on a shared machine move with its load: compare the two columns of one run only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ("You are a careful Python assistant. Answer with short, correct code and one line of "
          "explanation. Prefer the standard library; keep functions small and typed; name "
          "things plainly; never print secrets; write tests with pytest when asked.\n")


def _engine(args: argparse.Namespace, cache_mb: int) -> Any:
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.scheduler import Scheduler

    ngram = args.mode == "ngram"
    dec = build_decoder(args.model, draft_dir=None if ngram else args.draft, ngram=ngram,
                        max_draft_len=4)
    return Scheduler(dec, 1, max_len=dec.target.cfg.max_position_embeddings,
                     prefix_cache_bytes=cache_mb << 20)


def _turn(sch: Any, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """One request alone: its tokens and TTFT (s)."""
    from specserve.runtime.decoder import SamplingParams

    first: list[float] = []
    t0 = time.perf_counter()
    h = sch.submit(prompt, SamplingParams(max_tokens=max_tokens),
                   on_tokens=lambda _new: first or first.append(time.perf_counter() - t0))
    sch.run_until_idle()
    assert h.result is not None
    return list(h.result.token_ids), first[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints/demo/target")
    ap.add_argument("--draft", type=Path, default=ROOT / "checkpoints/demo/draft")
    ap.add_argument("--mode", choices=["draft", "ngram"], default="draft")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix-cache-mb", type=int, default=192)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    from tokenizers import Tokenizer

    from specserve.client.builtin_prompts import builtin_code_prompts

    torch.set_num_threads(args.threads)
    tok = Tokenizer.from_file(str(args.model.resolve().parent / "tokenizer" / "tokenizer.json"))
    users = [tok.encode(p.text).ids
             for p in builtin_code_prompts(args.conversations * args.turns, seed=1)]
    system = tok.encode(SYSTEM).ids
    engines = {"cache": _engine(args, args.prefix_cache_mb), "none": _engine(args, 0)}
    _turn(engines["cache"], system[:8], 2)  # warm-up (caches nothing the chats start with)
    _turn(engines["none"], system[:8], 2)
    ttft: dict[str, dict[int, list[float]]] = {k: {} for k in engines}
    lengths: dict[int, list[int]] = {}
    order = list(engines)
    for c in range(args.conversations):
        conv = list(system)
        for t in range(args.turns):
            prompt = conv + users[c * args.turns + t]
            lengths.setdefault(t, []).append(len(prompt))
            got = {}
            order.reverse()  # alternate which engine runs first
            for name in order:
                got[name], s = _turn(engines[name], prompt, args.max_tokens)
                ttft[name].setdefault(t, []).append(s)
            if got["cache"] != got["none"]:
                print(f"conversation {c} turn {t}: the answers differ", file=sys.stderr)
                return 1
            conv = prompt + got["cache"]
    kv = engines["cache"].kv
    print(f"mode {args.mode}, {args.conversations} conversations x {args.turns} turns, "
          f"{args.max_tokens} tokens per answer, prefix cache {args.prefix_cache_mb} MiB "
          f"({kv.num_blocks} blocks of {kv.block_size}), answers identical: yes")
    print("| turn | prompt tokens (mean) | TTFT p50 ms, no cache | with cache | ratio |")
    print("|---|---|---|---|---|")
    for t in range(args.turns):
        a, b = statistics.median(ttft["none"][t]), statistics.median(ttft["cache"][t])
        print(f"| {t + 1} | {statistics.mean(lengths[t]):.0f} | {1e3 * a:.1f} | "
              f"{1e3 * b:.1f} | {b / a:.2f} |")
    alla = statistics.median([x for v in ttft["none"].values() for x in v])
    allb = statistics.median([x for v in ttft["cache"].values() for x in v])
    print(f"| all | | {1e3 * alla:.1f} | {1e3 * allb:.1f} | {allb / alla:.2f} |")
    st = kv.stats
    print(f"blocks looked up {st.queried}, found {st.hit}, stored {st.stored}, "
          f"evicted {st.evicted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
