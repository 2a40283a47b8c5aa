"""Few-row linears on CPU: does a step of m rows cost what one row costs?

Times one decoding step's linears of SmolLM2-135M (Llama; hidden 576, intermediate 1536, 30
layers, 9 / 3 heads of 64: per layer the fused qkv 960 x 576, o 576 x 576, fused gate/up
3072 x 576 and down 576 x 1536; then the tied 49152 x 576 LM head) for m = 1, 2, 4, 5, 8, 16
rows, one torch thread, random weights. ``--copies`` distinct copies of the model's weights are
cycled (default 2 in float32: 1.08 GB, 4 in bfloat16: the same bytes), so the working set is
bigger than the last-level cache (480 MiB on the Xeon this was written on) and every step reads
its weights from memory. Methods, timed alternately (every method and row count in each round,
the median of ``--rounds`` kept):

- ``F.linear``: the weight as ``nn.Linear`` keeps it (row-major [N, K]);
- ``mkl col-major``: ``F.linear`` on a column-major weight (the engine's float32 one-row path);
- ``onednn packed``: ``mkldnn._linear_pointwise`` on a prepacked weight (the engine's float32
  multi-row and bfloat16 path; on AMX / AVX-512-BF16 CPUs oneDNN's bf16 kernels run on those);
- ``rows kernel``: ``runtime/csrc/linear_rows.c`` (where a C compiler is found; bfloat16
  weights widened to float32 as they load);
- ``panels``: the same library's panel kernel on the weights as panels (float32, AVX-512).

Printed per method and m: ms per step (one copy of the weights), the ratio to m = 1 of the same
method, and the effective read bandwidth (weight bytes / time).

    PYTHONPATH=. .venv/bin/python benchmarks/fewrow_linear.py --dtype float32 --rounds 5

``--step``: whole float32 forwards of a SmolLM2-135M-shaped model (random weights, tied LM
head, logits for every new token), one sequence with 64 tokens cached, T = 1 (a plain step)
and T = 5 (a verify step of K = 4), laid out with the few-row kernel (with panels and without)
and without it (the MKL / oneDNN layouts), alternated. A 1.2 GB buffer is summed before
each timed step, so every step reads its weights from memory: without that, on a machine
whose L3 holds most of the model, whichever layout ran just before on the same weights found
them cached (one read the same weights at T = 1 and T = 5, the other two different copies),
and that decided the table.

    PYTHONPATH=. .venv/bin/python benchmarks/fewrow_linear.py --step --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specserve.runtime import cpu_linear
from specserve.runtime.model import Transformer
from specserve.runtime.model_config import ModelConfig

HIDDEN, INTER, LAYERS, VOCAB = 576, 1536, 30, 49152
SHAPES = [(960, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # [N, K]
ROWS = (1, 2, 4, 5, 8, 16)

Weights = list[torch.Tensor]
Method = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def model_weights(copies: int, dtype: torch.dtype) -> Weights:
    """``copies`` models' worth of distinct weights [N, K], in step order."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(copies):
        for _ in range(LAYERS):
            out += [(torch.randn(n, k, generator=g) * 0.02).to(dtype) for n, k in SHAPES]
        out.append((torch.randn(VOCAB, HIDDEN, generator=g) * 0.02).to(dtype))
    return out


def methods(ws: Weights, dtype: torch.dtype) -> dict[str, tuple[Weights, Method]]:
    """Each method with the weight layout it runs on."""
    pointwise = torch.ops.mkldnn._linear_pointwise
    found: dict[str, tuple[Weights, Method]] = {"F.linear": (ws, F.linear)}
    if dtype == torch.float32:
        found["mkl col-major"] = ([w.t().contiguous().t() for w in ws], F.linear)
    if cpu_linear.can_prepack(dtype):
        found["onednn packed"] = ([cpu_linear.prepack(w) for w in ws],
                                  lambda x, w: pointwise(x, w, None, "none", [], ""))
    if cpu_linear.prepare():
        found["rows kernel"] = (ws, lambda x, w: cpu_linear.rows_linear(x, w, None))
    width = cpu_linear.panel_width()
    if cpu_linear.prepare() and width and dtype == torch.float32:
        pairs = [(cpu_linear.to_panels(w, width), w) for w in ws]  # [G, K, width], [N, K]
        row_major = {id(p): w for p, w in pairs}
        found["panels"] = ([p for p, _ in pairs], lambda x, p: cpu_linear.rows_linear(
            x, row_major[id(p)], None, p))
    return found


def step(x: dict[int, torch.Tensor], ws: Weights, fn: Method) -> float:
    """Seconds for every weight of ``ws`` times its input rows (all copies)."""
    t = time.perf_counter()
    for w in ws:
        fn(x[_k(w)], w)
    return time.perf_counter() - t


def _k(w: torch.Tensor) -> int:
    return int(w.size(1))


def smollm2(kernel: bool, panels: bool = True) -> Transformer:
    """A SmolLM2-135M-shaped float32 model, random weights, laid out with or without the
    few-row kernel, and with or without its panels."""
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
                      num_layers=LAYERS, num_heads=9, num_kv_heads=3, head_dim=64,
                      rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=(),
                      max_position_embeddings=8192, tie_word_embeddings=True,
                      model_type="llama", eos_token_id=None)
    torch.manual_seed(0)
    m = Transformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    m.lm_head.weight = m.embed.weight
    m.eval()
    saved = list(cpu_linear._loaded)
    if not kernel:
        cpu_linear._loaded[:] = [None]
    try:
        m.decode_layout()
    finally:
        cpu_linear._loaded[:] = saved
    if not panels:
        for lin in m.modules():
            if isinstance(lin, cpu_linear.Linear):
                lin.panels = None
    return m


def step_table(rounds: int) -> None:
    """Forward + logits of T = 1 and T = 5 new tokens, with and without the kernel."""
    models = {"panels": smollm2(True), "rows kernel": smollm2(True, panels=False),
              "MKL / oneDNN": smollm2(False)}
    times: dict[tuple[str, int], list[float]] = {(n, t): [] for n in models for t in (1, 5)}
    flush = torch.ones(300 << 20)  # [300 Mi] float32, 1.2 GB: evicts the last-level cache
    with torch.inference_mode():
        caches = {}
        for name, m in models.items():
            caches[name] = m.new_cache(1, 128)
            m(torch.randint(0, VOCAB, (1, 64)), caches[name])
            caches[name].lengths = [64]
        for r in range(rounds + 1):  # the first round warms up
            for t in (1, 5):
                for name, m in models.items():
                    tokens = torch.randint(0, VOCAB, (1, t))
                    flush.sum()
                    start = time.perf_counter()
                    m.logits(m(tokens, caches[name]))
                    if r:
                        times[name, t].append(time.perf_counter() - start)
    print(f"{torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread; "
          f"SmolLM2-135M-shaped float32 step, 64 cached tokens, L3 evicted before each step, "
          f"median of {rounds} rounds")
    print("| layout | T = 1 (plain) | T = 5 (verify, K = 4) | T = 5 / T = 1 |")
    print("|---|---|---|---|")
    for name in models:
        one, five = (statistics.median(times[name, t]) for t in (1, 5))
        print(f"| {name} | {one * 1e3:.1f} ms | {five * 1e3:.1f} ms | {five / one:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--copies", type=int, default=None,
                    help="distinct copies of the weights cycled [2 float32, 4 bfloat16]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--step", action="store_true", help="whole model steps (float32)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.step:
        step_table(a.rounds)
        return
    dtype = getattr(torch, a.dtype)
    copies = a.copies or (2 if dtype == torch.float32 else 4)
    ws = model_weights(copies, dtype)
    nbytes = sum(w.numel() * w.element_size() for w in ws) // copies
    found = methods(ws, dtype)
    times: dict[tuple[str, int], list[float]] = {(name, m): [] for name in found for m in a.rows}
    with torch.inference_mode():
        xs = {m: {k: torch.randn(m, k).to(dtype) for k in (HIDDEN, INTER)} for m in a.rows}
        for lw, fn in found.values():  # warm-up: first touch, kernel selection
            step(xs[1], lw[: len(SHAPES) + 1], fn)  # (and the build, before any timing)
        for _ in range(a.rounds):
            for m in a.rows:
                for name, (lw, fn) in found.items():
                    times[name, m].append(step(xs[m], lw, fn) / copies)
    print(f"{torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread; "
          f"{a.dtype}, {nbytes / 1e6:.0f} MB of weights per step, {copies} copies cycled "
          f"({copies * nbytes / 1e6:.0f} MB working set), median of {a.rounds} rounds")
    print("| method | " + " | ".join(f"m = {m}" for m in a.rows) + " |")
    print("|---|" + "---|" * len(a.rows))
    for name in found:
        med = {m: statistics.median(times[name, m]) for m in a.rows}
        cells = [f"{med[m] * 1e3:.1f} ms, {med[m] / med[a.rows[0]]:.2f}x, "
                 f"{nbytes / med[m] / 1e9:.1f} GB/s" for m in a.rows]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
