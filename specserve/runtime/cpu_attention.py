"""Attention of a few new tokens per row over the KV cache, on CPU, each row over its own keys.

Decode (T = 1), verify (T = K + 1) and draft-tree levels attend few new tokens per row. ATen's
CPU flash kernel (``F.scaled_dot_product_attention``) takes one key span for the whole batch,
so every row is padded to the longest with masked keys (a third of them at batch 16 on the
builtin prompts), and at T this small its per-(row, head) cost dominates: an ablation put
decode attention at ~30% of an in-flight step at c = 16 (docs/results.md, "The C
kernels"). ``csrc/attn_rows.c`` reads row b's keys ``start[b] .. len[b] - 1`` and its new
slots only: the semantics of :func:`specserve.runtime.kvcache.step_mask` (keys before a row's
length all visible, new slot w visible to new token t iff ``node[t, w]``), without padding.

The C file is compiled once per machine on first use and cached (``runtime/native_build.py``:
``cc -O3 -march=native``, keyed by source, flags, compiler and CPU flags), and called
through ctypes (which releases the GIL for the call). Used only where it applies: CPU,
float32, at most :data:`MAX_NEW` new tokens, one torch thread (the kernel is single-threaded),
no autograd. Anywhere else, or with no C compiler, or with ``SPECSERVE_CPU_ATTENTION=off``, the
model keeps ``F.scaled_dot_product_attention`` with the boolean mask: the same function of
the same inputs (checked against it in ``tests/runtime/test_cpu_attention.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.runtime import native_build

MAX_NEW = 16  # new tokens per row the kernel takes (decode, verify, tree levels); more: SDPA
ENV = "SPECSERVE_CPU_ATTENTION"  # "off" (or 0/false/sdpa): always SDPA
SOURCE = Path(__file__).parent / "csrc" / "attn_rows.c"
_OFF = ("off", "0", "false", "sdpa")


@dataclass(frozen=True)
class KeyRows:
    """Which keys each row of a forward attends: ``start [B]`` and ``lens [B]`` (int64, CPU:
    keys ``start[b] .. lens[b] - 1``, all visible), ``node [T, W]`` (uint8: new slot
    ``lens[b] + w`` is visible to new token t iff ``node[t, w]``), ``max_past`` >= every
    ``lens[b] - start[b]``."""

    start: torch.Tensor
    lens: torch.Tensor
    node: torch.Tensor
    max_past: int


def key_rows(lens: list[int], start: int, node: torch.Tensor) -> KeyRows:
    """Rows of cache lengths ``lens`` attending from key ``start`` on, new slots per ``node``
    [T, W] (bool)."""
    n = torch.tensor(lens, dtype=torch.int64)
    return KeyRows(torch.full_like(n, start), n, node.to("cpu", torch.uint8).contiguous(),
                   max(lens) - start)


def prepare() -> bool:
    """Build (or find) and load the kernel now, not in the first forward; True if available."""
    return _kernel() is not None


def usable(dtype: torch.dtype, device: torch.device, t: int) -> bool:
    """Whether a forward of ``t`` new tokens per row takes the kernel (see the module doc)."""
    return (device.type == "cpu" and dtype == torch.float32 and t <= MAX_NEW
            and not torch.is_grad_enabled() and torch.get_num_threads() == 1
            and _kernel() is not None)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: KeyRows) -> torch.Tensor:
    """Attention output [B, T, H * D] (the input of the output projection).

    q: [B, H, T, D]; k, v: [B, Hkv, S_max, D] (whole cache buffers, or row views of them); the
    last dim of each contiguous. Scale 1/sqrt(D), as SDPA's default."""
    fn = _kernel()
    assert fn is not None, "cpu_attention.attend without cpu_attention.usable"
    b, h, t, d = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty(b, t, h, d, dtype=q.dtype)  # [B, T, H, D]
    w = rows.node.shape[1]
    rc = fn(q.data_ptr(), q.stride(0), q.stride(1), q.stride(2),
            k.data_ptr(), k.stride(0), k.stride(1), k.stride(2),
            v.data_ptr(), v.stride(0), v.stride(1), v.stride(2),
            rows.start.data_ptr(), rows.lens.data_ptr(), rows.node.data_ptr(), w,
            out.data_ptr(), out.stride(0), out.stride(1), out.stride(2),
            b, h, k.shape[1], t, d, rows.max_past, d ** -0.5)
    if rc != 0:
        raise MemoryError("cpu attention: scratch allocation failed")
    return out.view(b, t, h * d)


_loaded: list[Callable[..., int] | None] = []  # [] until first asked


def _kernel() -> Callable[..., int] | None:
    """The compiled kernel, or None (switched off, or no compiler: logged once)."""
    if not _loaded:
        lib = native_build.load(SOURCE, ENV, "CPU attention kernel",
                                "F.scaled_dot_product_attention", _OFF)
        _loaded.append(None if lib is None else _bind(lib))
    return _loaded[0]


def _bind(lib: ctypes.CDLL) -> Callable[..., int]:
    fn: Any = lib.specserve_attn_rows_f32
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, i64, i64,
                   ptr, ptr, ptr, ctypes.c_int, ptr, i64, i64, i64,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   i64, ctypes.c_float]
    fn.restype = ctypes.c_int
    kernel: Callable[..., int] = fn
    return kernel


def build(out_dir: Path | None = None) -> Path:
    """The kernel's shared library for this machine (:func:`native_build.build`)."""
    return native_build.build(SOURCE, out_dir)
