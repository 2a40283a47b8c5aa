"""Linear layers for CPU decoding: weight layouts that make few-row matmuls fast.

Decoding multiplies one row (a decode step) or a few (a verify forward of K+1 tokens, a tree) by
every weight, which is memory-bound, and the default kernels leave bandwidth unused on CPU:

- bfloat16: ``F.linear`` with one row ran a 1.1B model's gate/up weight (11264 x 2048) at 11 GB/s
  where this machine reads memory at 31 GB/s; the same weight prepacked into oneDNN's blocked
  layout (``mkldnn._reorder_linear_weight``) and run by ``mkldnn._linear_pointwise`` (the op
  PyTorch's inductor emits for frozen CPU linears) ran at 17 GB/s, 1.2-1.9x faster over the
  shapes measured (1-9 rows), with output equal to ``F.linear``'s bit for bit.
- float32: MKL's GEMM runs one row 1.1-1.5x faster with column-major weights; oneDNN prepacked
  is 1.1-2.9x faster than MKL for 2-33 rows but slower for one row and for small weights (a
  fixed ~14 us a call). So fp32 keeps column-major weights and, for weights large enough, a
  prepacked copy used only for multi-row inputs.

Numbers: ``docs/benchmarks.md`` ("oneDNN prepacked weights"). Checked in
``tests/runtime/test_model.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specserve.cpu_dtype import onednn_bf16

# oneDNN's fixed cost (~14 us a call here) loses to MKL below about this many weights.
MULTI_ROW_MIN = 1 << 17


class Linear(nn.Linear):
    """``nn.Linear`` with an optional oneDNN-prepacked copy of the weight for multi-row inputs
    (set by :func:`lay_out` for float32)."""

    multi_row: torch.Tensor | None = None

    def _apply(self, fn: Any, recurse: bool = True) -> Linear:
        """``.to()``, ``.float()``...: back to a plain dense weight first (the prepacked forms
        are redone by :func:`lay_out`)."""
        self.multi_row = None
        if self.weight.is_mkldnn:
            self.weight = nn.Parameter(self.weight.to_dense(), requires_grad=False)
        super()._apply(fn, recurse)
        return self


def prepack(w: torch.Tensor) -> torch.Tensor:
    """``w`` [N, K] in oneDNN's blocked layout for ``mkldnn._linear_pointwise`` (the op PyTorch's
    inductor emits for frozen CPU linears)."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(w.detach())
    return packed


def linear(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    """``F.linear``, or oneDNN's kernel on a prepacked weight: always when the weight itself is
    prepacked (bf16), and for inputs of more than one row when a prepacked copy exists (fp32)."""
    w = lin.weight
    if not w.is_mkldnn and lin.multi_row is not None and x.numel() > x.shape[-1]:
        w = lin.multi_row
    if w.is_mkldnn:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, w, lin.bias, "none", [], "")
        return out
    return F.linear(x, w, lin.bias)


def can_prepack(dtype: torch.dtype) -> bool:
    """oneDNN can run ``dtype`` prepacked here: float32 wherever oneDNN is built in, bfloat16
    only with its bf16 kernels (:func:`specserve.cpu_dtype.onednn_bf16`, the same check that
    makes ``--dtype auto`` serve float32 on an AVX2-only CPU)."""
    if dtype == torch.float32:
        return bool(torch.backends.mkldnn.is_available())
    return onednn_bf16()


def lay_out(linears: Sequence[Linear], dtype: torch.dtype, multi_row_limit_bytes: int = 1 << 30,
            multi_row_min: int = MULTI_ROW_MIN) -> None:
    """Lay CPU weights out for decoding, in place (same values).

    bfloat16: every weight prepacked. float32: column-major, plus a prepacked multi-row copy of
    each weight with more than ``multi_row_min`` elements while all of them total at most
    ``multi_row_limit_bytes`` (the copy doubles their memory). Other dtypes: unchanged.
    Idempotent."""
    todo = [lin for lin in linears if not lin.weight.is_mkldnn]
    if dtype == torch.bfloat16 and can_prepack(dtype):
        for lin in todo:
            lin.weight = nn.Parameter(prepack(lin.weight), requires_grad=False)
    elif dtype == torch.float32:
        size = sum(lin.weight.numel() * 4 for lin in todo)
        dual = size <= multi_row_limit_bytes and can_prepack(dtype)
        with torch.no_grad():
            for lin in todo:
                if dual and lin.multi_row is None and lin.weight.numel() > multi_row_min:
                    lin.multi_row = prepack(lin.weight.contiguous())
                if lin.weight.stride(0) != 1:
                    lin.weight.data = lin.weight.data.t().contiguous().t()
