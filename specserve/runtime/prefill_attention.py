"""Causal attention of a long prefill on the CPU, query block by query block.

A prefill of T new tokens per row after ``p`` cached ones attends causally: new token i sees
keys ``0 .. p + i``. ATen's CPU flash kernel (``F.scaled_dot_product_attention``) takes that as
a boolean mask [T, p + T], turned into an additive one at every call, and runs about 30 GFLOPS
at head dim 64 here. Split into blocks of :data:`BLOCK` queries, each block is two GEMMs over
only the keys it can see (``p + t1`` for a block ending at ``t1``, so little of the causal
triangle is computed and thrown away), a triangular ``-inf`` on its own diagonal block and a
softmax in between: the blockwise exact attention that FlashAttention tiles (Dao et al., 2022,
"FlashAttention", section 3.1), with the whole key span of a block in one softmax instead of
an online one. With grouped-query attention (Ainslie et al., 2023) the ``nh / nkv`` query heads
of one key head share its GEMM.

Measured on SmolLM2-135M (9 query heads over 3 key heads, head dim 64; one thread, 16 cached
tokens; ``benchmarks/prefill_attention.py``, 2026-12-07, 2-core AMD EPYC): one layer's
attention 0.64-0.74x SDPA's at 512 new tokens, 0.66-0.97x at 256, 0.85-1.05x at 128; whole
prefill forwards 0.94x at 512, 0.96-0.99x at 256, 0.99x at 160, 1.02-1.04x at 128 (the linears
are most of it), so it is used from :data:`MIN_NEW` new tokens. Float32 on the CPU only,
without autograd; equal to SDPA's output within float32 rounding
(``tests/runtime/test_prefill_attention.py``).
"""

from __future__ import annotations

import torch

BLOCK = 32  # queries per block (16-96 measured; 32 best from 192 to 512 new tokens)
MIN_NEW = 160  # new tokens per row from which it is used (at 128 a forward took 2-4% more)


def usable(q: torch.Tensor) -> bool:
    """Whether q [B, nh, T, D] takes :func:`attend`: float32 on the CPU, no autograd, at
    least :data:`MIN_NEW` new tokens."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and q.shape[2] >= MIN_NEW
            and not torch.is_grad_enabled())


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int,
           block: int = BLOCK) -> torch.Tensor:
    """Causal attention [B, nh, T, D] of q [B, nh, T, D] whose token i sits at position
    ``past + i``, over keys and values [B, nkv, >= past + T, D] (nh a multiple of nkv; the
    cache buffers themselves). Scale 1/sqrt(D), as SDPA's default."""
    b, nh, t, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qs = (q * d ** -0.5).view(b, nkv, g, t, d)  # [B, nkv, g, T, D]
    out = torch.empty(b, nkv, g, t, d, dtype=q.dtype)
    diag = torch.full((block, block), float("-inf"), dtype=q.dtype).triu_(1)  # [blk, blk]
    for t0 in range(0, t, block):
        t1 = min(t, t0 + block)
        n, end = t1 - t0, past + t1  # this block's queries; the keys they see
        qb = qs[:, :, :, t0:t1].reshape(b, nkv, g * n, d)  # [B, nkv, g n, D]
        s = torch.matmul(qb, k[:, :, :end].transpose(-1, -2))  # [B, nkv, g n, end]
        s.view(b, nkv, g, n, end)[..., past + t0:].add_(diag[:n, :n])  # keys after query i
        p = torch.softmax(s, dim=-1)
        out[:, :, :, t0:t1] = torch.matmul(p, v[:, :, :end]).view(b, nkv, g, n, d)
    return out.view(b, nh, t, d)
