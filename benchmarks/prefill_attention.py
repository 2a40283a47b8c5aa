"""A long prefill's causal attention on CPU: ATen's SDPA with the causal mask against
``runtime/prefill_attention.py`` (query blocks), then whole prefill forwards with and without it.

Part 1 times one layer's attention at SmolLM2-135M's shapes (9 query heads over 3 key heads,
head dim 64), ``--past`` cached tokens and T new ones, one torch thread, for SDPA and each block
size in ``--blocks``, alternated in every round; the median of ``--rounds`` is kept. Part 2
(``--model DIR``, an imported checkpoint such as ``checkpoints/smollm2``) times the model's
prefill forward of T random tokens after ``--past`` cached ones (last row's logits included)
with the block path and without it (``prefill_attention.MIN_NEW`` raised past T), alternated.

    PYTHONPATH=. .venv/bin/python benchmarks/prefill_attention.py --model checkpoints/smollm2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from specserve.runtime import prefill_attention


def _ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def layer_fns(t: int, past: int, blocks: list[int],
              g: torch.Generator) -> list[Callable[[], object]]:
    """SDPA with the causal mask, then the block path at each block size, on one layer's
    random q [1, 9, T, 64] and keys / values [1, 3, past + T, 64]."""
    q = torch.randn(1, t, 9, 64, generator=g).transpose(1, 2)  # [1, nh, T, D], the model's
    k = torch.randn(1, 3, past + t, 64, generator=g)
    v = torch.randn(1, 3, past + t, 64, generator=g)
    mask = torch.ones(t, past + t, dtype=torch.bool).tril_(past)[None, None]
    fns: list[Callable[[], object]] = [
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)]
    return fns + [lambda b=b: prefill_attention.attend(q, k, v, past, b) for b in blocks]


def layer_table(lengths: list[int], past: int, blocks: list[int], rounds: int) -> None:
    print(f"one layer's attention, ms (9 / 3 heads of 64, {past} cached tokens; median of "
          f"{rounds})")
    print("T      SDPA " + " ".join(f"  blk{b:<3d}" for b in blocks) + "  best / SDPA")
    g = torch.Generator().manual_seed(0)
    for t in lengths:
        fns = layer_fns(t, past, blocks, g)
        times: list[list[float]] = [[] for _ in fns]
        for _ in range(rounds + 1):  # the first round warms up
            for i, fn in enumerate(fns):
                times[i].append(_ms(fn))
        med = [statistics.median(ts[1:]) for ts in times]
        print(f"{t:<5d} {med[0]:6.2f} " + " ".join(f"{m:7.2f}" for m in med[1:])
              + f"  {min(med[1:]) / med[0]:.2f}")


def forward_table(model_dir: Path, lengths: list[int], past: int, rounds: int) -> None:
    from specserve.runtime.model import load_model

    m = load_model(model_dir).decode_layout()
    cache = m.new_cache(1, past + max(lengths) + 1)
    g = torch.Generator().manual_seed(1)
    default = prefill_attention.MIN_NEW
    print(f"\n{model_dir.name}: prefill forward after {past} cached tokens, ms (median of "
          f"{rounds})")
    print("T      SDPA   blocks  blocks / SDPA")
    for t in lengths:
        ids = torch.randint(100, 40000, (1, past + t), generator=g)

        def run(ids: torch.Tensor = ids, t: int = t) -> None:
            cache.lengths = [past]
            h = m(ids[:, past:], cache)
            m.logits(h[:, -1:])

        times: dict[int, list[float]] = {default: [], 1 << 30: []}
        with torch.inference_mode():
            cache.lengths = [0]
            m(ids[:, :past], cache)  # the cached prefix
            for r in range(rounds + 1):
                order = (default, 1 << 30) if r % 2 else (1 << 30, default)
                for min_new in order:
                    prefill_attention.MIN_NEW = min_new
                    times[min_new].append(_ms(run))
        prefill_attention.MIN_NEW = default
        sdpa, blk = (statistics.median(times[x][1:]) for x in (1 << 30, default))
        print(f"{t:<5d} {sdpa:6.0f} {blk:8.0f}  {blk / sdpa:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="96,128,192,256,384,512")
    ap.add_argument("--past", type=int, default=16, help="cached tokens before the new ones")
    ap.add_argument("--blocks", default="16,32,64,128")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--model", type=Path, default=None, help="also whole prefill forwards")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lengths = [int(x) for x in args.lengths.split(",")]
    with torch.inference_mode():
        layer_table(lengths, args.past, [int(x) for x in args.blocks.split(",")], args.rounds)
    if args.model is not None:
        forward_table(args.model, [t for t in lengths if t >= 128], args.past,
                      max(3, args.rounds // 2))


if __name__ == "__main__":
    main()
