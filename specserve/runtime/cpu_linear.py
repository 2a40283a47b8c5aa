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

In float32 neither reads the weights once for a few rows: on the real model (SmolLM2-135M, 540
MB) 5 rows cost about twice one row with MKL and 1.4x with oneDNN prepacked. So where it builds,
float32 takes a kernel of ours for up to :data:`MAX_ROWS` rows (``csrc/linear_rows.c``: each
block of 4 weight rows read from memory once and dotted with every input row while it sits in
L1), on the weight in ``nn.Linear``'s own row-major layout (the column-major one is dropped;
more rows keep the prepacked copy), and a tied LM head takes it too; so does bfloat16 where
oneDNN has no bfloat16 kernels (:func:`uses_kernel`; summed in float32, rounded once, as
``F.linear``). Built and cached like the attention kernel (``runtime/native_build.py``); used
only with one torch thread and no autograd; with no C compiler or ``SPECSERVE_CPU_LINEAR=off``
the layouts above remain.

Numbers: ``docs/results.md`` ("The C kernels: decode attention and few-row linears";
``benchmarks/fewrow_linear.py``). Checked in ``tests/runtime/test_model.py`` and
``tests/runtime/test_cpu_linear_kernel.py``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specserve.cpu_dtype import onednn_bf16
from specserve.runtime import native_build

# oneDNN's fixed cost (~14 us a call here) loses to MKL below about this many weights.
MULTI_ROW_MIN = 1 << 17
MAX_ROWS = 16  # rows the few-row kernel takes (decode, verify, small batches); more: BLAS
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
ENV = "SPECSERVE_CPU_LINEAR"  # "off" (or 0/false): never the few-row kernel
SOURCE = Path(__file__).parent / "csrc" / "linear_rows.c"
_OFF = ("off", "0", "false")


class Linear(nn.Linear):
    """``nn.Linear`` with an optional oneDNN-prepacked copy of the weight for multi-row inputs
    (set by :func:`lay_out` for float32), and whether the few-row kernel takes it."""

    multi_row: torch.Tensor | None = None
    few_rows: bool = False  # set by lay_out: up to MAX_ROWS rows take the kernel (row-major)
    panels: torch.Tensor | None = None  # set by lay_out: the float32 weight as panels

    def __setattr__(self, name: str, value: Any) -> None:
        """A new ``weight`` (a tied LM head, a reload) drops the copies made of the old one."""
        if name == "weight" and self.__dict__.get("_parameters", {}).get("weight") is not value:
            self.__dict__["multi_row"] = None  # plain attributes: no Module bookkeeping
            self.__dict__["panels"] = None
        super().__setattr__(name, value)

    def _apply(self, fn: Any, recurse: bool = True) -> Linear:
        """``.to()``, ``.float()``...: back to a plain dense weight first (the prepacked forms
        are redone by :func:`lay_out`)."""
        self.multi_row = None
        self.few_rows = False
        self.panels = None
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
    prepacked (bf16), and for inputs of more than one row when a prepacked copy exists (fp32);
    the few-row kernel where :func:`lay_out` chose it and the call qualifies (:func:`usable`)."""
    w = lin.weight
    if lin.few_rows and x.numel() <= MAX_ROWS * x.shape[-1] and usable(x):
        return rows_linear(x, w, lin.bias, lin.panels)
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
            multi_row_min: int = MULTI_ROW_MIN, shared: Sequence[Linear] = (),
            panel_limit_bytes: int = 1 << 30) -> None:
    """Lay CPU weights out for decoding, in place (same values).

    Where the few-row kernel serves ``dtype`` (:func:`uses_kernel`): every weight row-major
    and contiguous for it (up to :data:`MAX_ROWS` rows), and in float32 a copy as panels
    (:func:`to_panels`, which the kernel reads faster where built) while they total at most
    ``panel_limit_bytes``, and the prepacked copies below for more rows; ``shared`` (weights
    that must keep their layout, a tied LM head) take the kernel too where already row-major,
    and panels. Otherwise bfloat16: every weight prepacked;
    float32: column-major, plus a prepacked multi-row copy of each weight with more than
    ``multi_row_min`` elements while all of them total at most ``multi_row_limit_bytes`` (the
    copy doubles their memory). Other dtypes: unchanged. Idempotent."""
    todo = [lin for lin in linears if not lin.weight.is_mkldnn]
    if uses_kernel(dtype):
        _lay_out_rows(todo, shared)
        if dtype == torch.float32:
            _panel_copies([*todo, *(lin for lin in shared if lin.few_rows)], panel_limit_bytes)
            _prepack_copies(todo, multi_row_limit_bytes, multi_row_min)
    elif dtype == torch.bfloat16 and can_prepack(dtype):
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


def uses_kernel(dtype: torch.dtype) -> bool:
    """The few-row kernel is built and serves ``dtype``: float32; bfloat16 only where oneDNN
    has no bfloat16 kernels (AVX2-only CPUs, where it emulates them). Where it has them (AVX-512
    BF16, AMX) its prepacked bfloat16 costs the same for 1 to 16 rows, and ours, faster for
    one or two rows, slower from four (``docs/results.md``, "The C kernels")."""
    ok = dtype == torch.float32 or (dtype == torch.bfloat16 and not can_prepack(dtype))
    return ok and prepare()


def _prepack_copies(linears: Sequence[Linear], limit: int, multi_row_min: int) -> None:
    """The prepacked multi-row copies (for more than MAX_ROWS rows) of weights with more than
    ``multi_row_min`` elements, while they total at most ``limit`` bytes."""
    big = [lin for lin in linears if lin.weight.numel() > multi_row_min]
    if sum(lin.weight.numel() * 4 for lin in big) <= limit and can_prepack(torch.float32):
        for lin in big:
            if lin.multi_row is None:
                lin.multi_row = prepack(lin.weight)


def _panel_copies(linears: Sequence[Linear], limit: int) -> None:
    """Panels (:func:`to_panels`) of every float32 weight of ``linears`` where the kernel has
    them, if they total at most ``limit`` bytes."""
    width = panel_width()
    todo = [lin for lin in linears if lin.panels is None and lin.weight.dtype == torch.float32]
    if width and sum(lin.weight.numel() * 4 for lin in todo) <= limit:
        for lin in todo:
            lin.panels = to_panels(lin.weight, width)


def panel_width() -> int:
    """Output columns per panel of the built kernel (16 with AVX-512); 0: none (AVX2, plain C)."""
    kernels = _kernel()
    return 0 if kernels is None else kernels.width


def panel_pad() -> int:
    """The panel count of :func:`to_panels` is a multiple of this (the kernel's widest tile)."""
    kernels = _kernel()
    return 1 if kernels is None else kernels.pad


def to_panels(w: torch.Tensor, width: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 ``w`` [N, K] as the kernel's panels [G, K, width]: ``p[g, k, j] = w[g width +
    j, k]``, zero beyond N, G a multiple of the kernel's pad (``csrc/linear_rows.c``); written
    into ``out`` [G, K, width] (a huge-page buffer) where given."""
    n, k = w.shape
    pad = panel_pad()
    groups = -(-n // (width * pad)) * pad
    if out is None:
        out = torch.empty(groups, k, width)
    assert out.shape == (groups, k, width) and out.is_contiguous()
    with torch.no_grad():
        full = n // width
        out[:full].copy_(w[:full * width].reshape(full, width, k).transpose(1, 2))
        out[full:].zero_()
        if n % width:
            out[full, :, :n % width].copy_(w[full * width:].t())
    return out


def _lay_out_rows(linears: Sequence[Linear], shared: Sequence[Linear]) -> None:
    """Row-major contiguous weights (undoing a column-major layout), marked for the kernel."""
    with torch.no_grad():
        for lin in linears:
            if not lin.weight.is_contiguous():
                lin.weight.data = lin.weight.data.contiguous()
            lin.few_rows = True
    for lin in shared:
        lin.few_rows = lin.weight.dtype in KERNEL_DTYPES and lin.weight.stride(-1) == 1


def prepare() -> bool:
    """Build (or find) and load the few-row kernel now; True if available."""
    return _kernel() is not None


def usable(x: torch.Tensor) -> bool:
    """Whether ``x`` (float32 or bfloat16 rows on CPU) may take the kernel: no autograd, one
    torch thread (the kernel is single-threaded), built."""
    return (x.dtype in KERNEL_DTYPES and x.device.type == "cpu" and not torch.is_grad_enabled()
            and torch.get_num_threads() == 1 and _kernel() is not None)


def rows_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                panels: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` by the few-row kernel: x [..., K] (at most :data:`MAX_ROWS`
    rows in all) and w [N, K] with contiguous rows, both float32 or both bfloat16 (summed in
    float32, rounded to bfloat16 once at the end, as ``F.linear``), bias [N] or None; read from
    ``panels`` (:func:`to_panels` of a float32 w) where given and of the loaded kernel's width
    (panels of another build's width: w is read)."""
    kernels = _kernel()
    assert kernels is not None, "cpu_linear.rows_linear without cpu_linear.usable"
    n, k = w.shape
    x2 = x.reshape(-1, k)  # [M, K]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    assert m <= MAX_ROWS and w.stride(-1) == 1 and w.dtype == x.dtype
    out = torch.empty(m, n)  # [M, N] float32
    b = None if bias is None else bias.float().contiguous()
    if panels is not None and x2.dtype == torch.float32 and panels.shape[-1] == kernels.width:
        rc = kernels.panels(x2.data_ptr(), x2.stride(0), panels.data_ptr(),
                            None if b is None else b.data_ptr(), out.data_ptr(), n, m, n, k)
        if rc != 0:
            raise (MemoryError if rc == 1 else ValueError)(f"cpu_linear: the panel kernel "
                                                           f"returned {rc} for {m} rows")
    else:
        fn = kernels.bf16 if w.dtype == torch.bfloat16 else kernels.f32
        fn(x2.data_ptr(), x2.stride(0), w.data_ptr(), w.stride(0),
           None if b is None else b.data_ptr(), out.data_ptr(), n, m, n, k)
    return out.view(*x.shape[:-1], n).to(x.dtype)


@dataclass(frozen=True)
class Kernels:
    """The library's entry points: float32 and bfloat16 x and weights (float32 bias, y), and
    float32 weights as panels (``width`` output columns each, their count a multiple of
    ``pad``; width 0: no panel kernel on this CPU)."""

    f32: Callable[..., int]
    bf16: Callable[..., int]
    panels: Callable[..., int]
    width: int
    pad: int


_loaded: list[Kernels | None] = []  # [] until first asked


def _kernel() -> Kernels | None:
    """The compiled kernel, or None (switched off, or no compiler: logged once)."""
    if not _loaded:
        lib = native_build.load(SOURCE, ENV, "CPU few-row linear kernel", "MKL / oneDNN", _OFF)
        _loaded.append(None if lib is None else bind(lib))
    return _loaded[0]


def bind(lib: ctypes.CDLL) -> Kernels:
    """The kernel's entry points in a loaded library, typed for ctypes."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fns = []
    for name in ("specserve_linear_rows_f32", "specserve_linear_rows_bf16"):
        fn: Any = getattr(lib, name)
        fn.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int]
        fn.restype = ctypes.c_int
        fns.append(fn)
    panels: Any = lib.specserve_linear_panels_f32
    panels.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    panels.restype = ctypes.c_int
    return Kernels(fns[0], fns[1], panels, int(lib.specserve_panel_width()),
                   int(lib.specserve_panel_pad()))


def build(out_dir: Path | None = None) -> Path:
    """The kernel's shared library for this machine (:func:`native_build.build`)."""
    return native_build.build(SOURCE, out_dir)
