"""A decoder layer's element-wise parts for a few token rows on CPU, in C: RMSNorm, residual add
+ RMSNorm, RoPE with the KV-cache write, SiLU-and-multiply (``csrc/layer_rows.c``).

A decode step of the real model (SmolLM2-135M, 30 layers) spent about 100 ATen calls a layer on
these (6 ms of ATen time a step, plus the Python between them) beside ~35 ms of weight reads:
what kept plain decoding at two thirds of the machine's read bandwidth. With the few-row linear
kernel (:mod:`specserve.runtime.cpu_linear`) and the attention kernel
(:mod:`specserve.runtime.cpu_attention`), a layer becomes nine C calls
(:meth:`specserve.runtime.model.Transformer.run` takes this path where :func:`usable`).

Compiled once per machine and cached as the other kernels (``runtime/native_build.py``); used
only for float32 on CPU with one torch thread, no autograd, and where the linear and attention
kernels run too; ``SPECSERVE_CPU_LAYER=off`` (or no C compiler) keeps the ATen ops. Equal to
them within float32 rounding (``tests/runtime/test_cpu_layer.py``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.runtime import native_build

ENV = "SPECSERVE_CPU_LAYER"  # "off" (or 0/false): the ATen ops
SOURCE = Path(__file__).parent / "csrc" / "layer_rows.c"
MAX_HEAD_DIM = 256  # the RoPE loop's scratch


@dataclass(frozen=True)
class Kernels:
    rms: Any
    add_rms: Any
    rope_kv: Any
    silu_mul: Any


_loaded: list[Kernels | None] = []  # [] until first asked


def _kernel() -> Kernels | None:
    """The compiled kernels, or None (switched off, or no compiler: logged once)."""
    if not _loaded:
        lib = native_build.load(SOURCE, ENV, "CPU layer kernels", "ATen")
        _loaded.append(None if lib is None else _bind(lib))
    return _loaded[0]


def _bind(lib: ctypes.CDLL) -> Kernels:
    i64, ptr, i32, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    sigs = {"specserve_rms_rows": [ptr, i64, ptr, ptr, i64, i32, i32, f32],
            "specserve_add_rms_rows": [ptr, i64, ptr, i64, ptr, ptr, i64, i32, i32, f32],
            "specserve_rope_kv_rows": [ptr, i64, ptr, ptr, i64, i64, ptr, i64, i64, i64,
                                       ptr, i64, i64, i64, ptr, i32, i32, i32, i32, i32],
            "specserve_silu_mul_rows": [ptr, i64, ptr, i64, i32, i32]}
    fns = []
    for name, args in sigs.items():
        fn: Any = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
        fns.append(fn)
    return Kernels(*fns)


def usable(x: torch.Tensor, head_dim: int) -> bool:
    """Whether hidden rows ``x`` [B, T, H] may take the kernels (see the module doc)."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and head_dim <= MAX_HEAD_DIM
            and not torch.is_grad_enabled() and torch.get_num_threads() == 1
            and _kernel() is not None)


def _k() -> Kernels:
    k = _kernel()
    assert k is not None, "cpu_layer called without cpu_layer.usable"
    return k


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows x [M, H] (contiguous rows) by ``weight`` [H]: a new [M, H]."""
    m, h = x.shape
    y = torch.empty(m, h)
    _k().rms(x.data_ptr(), x.stride(0), weight.data_ptr(), y.data_ptr(), h, m, h, eps)
    return y


def add_rms(x: torch.Tensor, add: torch.Tensor, weight: torch.Tensor,
            eps: float) -> torch.Tensor:
    """x += add (rows [M, H], in place); then RMSNorm of x by ``weight`` [H]: a new [M, H]."""
    m, h = x.shape
    y = torch.empty(m, h)
    _k().add_rms(x.data_ptr(), x.stride(0), add.data_ptr(), add.stride(0), weight.data_ptr(),
                 y.data_ptr(), h, m, h, eps)
    return y


def rope_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kbuf: torch.Tensor,
            vbuf: torch.Tensor, slots: torch.Tensor, t: int, nh: int, nkv: int) -> None:
    """Rotate the q and k heads of ``qkv`` [M, (nh + 2 nkv) D] (M = B T rows, in place) by
    ``cos`` / signed ``sin`` [B or 1, T, 1, D]; write row r's k and v heads into its cache row
    at slot ``slots[r]`` (int64 [M]); kbuf / vbuf [B, nkv, S, D] with contiguous slots."""
    m = qkv.shape[0]
    d = cos.shape[-1]
    cbs = cos.stride(0) if cos.shape[0] > 1 else 0
    _k().rope_kv(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), cbs,
                 cos.stride(1), kbuf.data_ptr(), kbuf.stride(0), kbuf.stride(1),
                 kbuf.stride(2), vbuf.data_ptr(), vbuf.stride(0), vbuf.stride(1),
                 vbuf.stride(2), slots.data_ptr(), m, t, nh, nkv, d)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(g) * u of rows gu [M, 2 I] = [g | u]: a new [M, I]."""
    m, two_i = gu.shape
    out = torch.empty(m, two_i // 2)
    _k().silu_mul(gu.data_ptr(), gu.stride(0), out.data_ptr(), out.stride(0), m, two_i // 2)
    return out
