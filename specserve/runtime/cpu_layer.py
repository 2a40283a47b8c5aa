"""A decoder layer's element-wise parts for a few token rows on CPU, in C, and a whole forward's
layers in one C call (``csrc/layer_rows.c``).

A decode step of the real model (SmolLM2-135M, 30 layers) spent about 100 ATen calls a layer on
RMSNorm, RoPE, the KV write and SiLU-and-multiply (6 ms of ATen time a step, plus the Python
between them) beside ~35 ms of weight reads: what kept plain decoding at two thirds of the
machine's read bandwidth. In C, with the few-row linear kernel (``csrc/linear_rows.c``) and the
attention kernel (``csrc/attn_rows.c``) linked into the same library, a layer was nine calls
from Python, and those calls (ctypes, the tensors between them) still cost ~5 ms a step: so
:func:`layers` runs every layer of a forward in one call (a table of each layer's addresses,
:func:`layer_table`), and :meth:`specserve.runtime.model.Transformer.run` takes it where
:func:`usable`.

Compiled once per machine and cached as the other kernels (``runtime/native_build.py``); used
only for float32 on CPU with one torch thread, no autograd, and where the linear and attention
kernels run too; ``SPECSERVE_CPU_LAYER=off`` (or no C compiler) keeps the ATen ops. Equal to
them within float32 rounding (``tests/runtime/test_cpu_layer.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.runtime import native_build

ENV = "SPECSERVE_CPU_LAYER"  # "off" (or 0/false): the ATen ops
CSRC = Path(__file__).parent / "csrc"
SOURCES = (CSRC / "layer_rows.c", CSRC / "linear_rows.c", CSRC / "attn_rows.c")
MAX_HEAD_DIM = 256  # the RoPE loop's scratch
LAYER_FIELDS = 22  # int64 addresses and strides per layer in layer_table (layer_rows.c's enum)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors as :func:`layer_table` reads them: norm weights [H], linear
    weights [N, K] (row-major, contiguous), their biases (None: none) and the same weights as
    panels (:func:`specserve.runtime.cpu_linear.to_panels`; None: none, the row-major one is
    read)."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    qkv_panels: torch.Tensor | None = None
    o_panels: torch.Tensor | None = None
    gate_up_panels: torch.Tensor | None = None
    down_panels: torch.Tensor | None = None


_loaded: list[ctypes.CDLL | None] = []  # [] until first asked


def _kernel() -> ctypes.CDLL | None:
    """The compiled library, its entry points typed, or None (switched off, or no compiler:
    logged once)."""
    if not _loaded:
        lib = native_build.load(SOURCES, ENV, "CPU layer kernels", "ATen")
        if lib is not None:
            _bind(lib)
        _loaded.append(lib)
    return _loaded[0]


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr, i32, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    sigs = {"specserve_rms_rows": [ptr, i64, ptr, ptr, i64, i32, i32, f32],
            "specserve_add_rms_rows": [ptr, i64, ptr, i64, ptr, ptr, i64, i32, i32, f32],
            "specserve_rope_kv_rows": [ptr, i64, ptr, ptr, i64, i64, ptr, i64, i64, i64,
                                       ptr, i64, i64, i64, ptr, i32, i32, i32, i32, i32],
            "specserve_silu_mul_rows": [ptr, i64, ptr, i64, i32, i32],
            "specserve_layers_rows_f32": [ptr, i32, ptr, ptr, ptr, ptr, ptr, i32, ptr, ptr, i64,
                                          i64, ptr, ptr, ptr, ptr, i32, i64, i32, i32, i32,
                                          i32, i32, i32, i32, f32]}
    for name, args in sigs.items():
        fn: Any = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int if name == "specserve_layers_rows_f32" else None


def usable(x: torch.Tensor, head_dim: int) -> bool:
    """Whether hidden rows ``x`` [B, T, H] may take the kernels (see the module doc)."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and head_dim <= MAX_HEAD_DIM
            and not torch.is_grad_enabled() and torch.get_num_threads() == 1
            and _kernel() is not None)


def _lib() -> Any:
    lib = _kernel()
    assert lib is not None, "cpu_layer called without cpu_layer.usable"
    return lib


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows x [M, H] (contiguous rows) by ``weight`` [H]: a new [M, H]."""
    m, h = x.shape
    y = torch.empty(m, h)
    _lib().specserve_rms_rows(x.data_ptr(), x.stride(0), weight.data_ptr(), y.data_ptr(), h, m,
                              h, eps)
    return y


def add_rms(x: torch.Tensor, add: torch.Tensor, weight: torch.Tensor,
            eps: float) -> torch.Tensor:
    """x += add (rows [M, H], in place); then RMSNorm of x by ``weight`` [H]: a new [M, H]."""
    m, h = x.shape
    y = torch.empty(m, h)
    _lib().specserve_add_rms_rows(x.data_ptr(), x.stride(0), add.data_ptr(), add.stride(0),
                                  weight.data_ptr(), y.data_ptr(), h, m, h, eps)
    return y


def rope_kv(qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kbuf: torch.Tensor,
            vbuf: torch.Tensor, slots: torch.Tensor, t: int, nh: int, nkv: int) -> None:
    """Rotate the q and k heads of ``qkv`` [M, (nh + 2 nkv) D] (M = B T rows, in place) by
    ``cos`` / signed ``sin`` [B or 1, T, 1, D]; write row r's k and v heads into its cache row
    at slot ``slots[r]`` (int64 [M]); kbuf / vbuf [B, nkv, S, D] with contiguous slots."""
    cos, sin = rope
    cbs = cos.stride(0) if cos.shape[0] > 1 else 0
    _lib().specserve_rope_kv_rows(
        qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), cbs, cos.stride(1),
        kbuf.data_ptr(), kbuf.stride(0), kbuf.stride(1), kbuf.stride(2), vbuf.data_ptr(),
        vbuf.stride(0), vbuf.stride(1), vbuf.stride(2), slots.data_ptr(), qkv.shape[0], t, nh,
        nkv, cos.shape[-1])


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(g) * u of rows gu [M, 2 I] = [g | u]: a new [M, I]."""
    m, two_i = gu.shape
    out = torch.empty(m, two_i // 2)
    _lib().specserve_silu_mul_rows(gu.data_ptr(), gu.stride(0), out.data_ptr(), out.stride(0), m,
                                   two_i // 2)
    return out


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def panel_width() -> int:
    """Output columns per panel this library's linears read (``csrc/linear_rows.c``; 0: none)."""
    lib = _kernel()
    return 0 if lib is None else int(lib.specserve_panel_width())


WEIGHT_FIELDS = 14  # the weights' part of a layer's row in layer_table (then the cache's 8)


@dataclass(frozen=True)
class WeightTable:
    """The weights' columns of :func:`layer_table` ([L, WEIGHT_FIELDS] int64 addresses), and
    the storages they point into, held so that the addresses stay valid while it lives (a
    tensor's ``.data`` swapped later leaves stale values, never freed memory)."""

    table: torch.Tensor
    storages: tuple[Any, ...]


def weight_table(weights: Sequence[LayerWeights]) -> WeightTable:
    """Each layer's weight and bias addresses and its panels' (those of another width than
    this library's read as none): made once per layout, not per forward (building it was ~1.5
    ms of Python a step on a 30-layer model)."""
    width = panel_width()

    def panels(t: torch.Tensor | None) -> int:
        return _ptr(t) if t is not None and t.shape[-1] == width else 0
    rows = [[w.attn_norm.data_ptr(), w.qkv.data_ptr(), _ptr(w.qkv_bias), w.o.data_ptr(),
             _ptr(w.o_bias), w.mlp_norm.data_ptr(), w.gate_up.data_ptr(), _ptr(w.gate_up_bias),
             w.down.data_ptr(), _ptr(w.down_bias), panels(w.qkv_panels), panels(w.o_panels),
             panels(w.gate_up_panels), panels(w.down_panels)] for w in weights]
    held = [t.untyped_storage() for w in weights for t in (
        w.attn_norm, w.qkv, w.qkv_bias, w.o, w.o_bias, w.mlp_norm, w.gate_up, w.gate_up_bias,
        w.down, w.down_bias, w.qkv_panels, w.o_panels, w.gate_up_panels, w.down_panels)
        if t is not None]
    return WeightTable(torch.tensor(rows, dtype=torch.int64).reshape(-1, WEIGHT_FIELDS),
                       tuple(held))


def layer_table(weights: Sequence[LayerWeights] | WeightTable, k: Sequence[torch.Tensor],
                v: Sequence[torch.Tensor]) -> torch.Tensor:
    """The int64 table [L, LAYER_FIELDS] :func:`layers` reads: each layer's weights
    (:func:`weight_table`, or made here), then its K / V cache buffers k[i], v[i] [B, nkv, S,
    D] (D contiguous) and their strides. Every weight float32; linear weights row-major with
    contiguous rows."""
    wt = weights if isinstance(weights, WeightTable) else weight_table(weights)
    rows = []
    for kb, vb in zip(k, v, strict=True):
        assert kb.stride(-1) == 1 and vb.stride(-1) == 1
        rows.append([kb.data_ptr(), vb.data_ptr(), *kb.stride()[:3], *vb.stride()[:3]])
    assert len(rows) == wt.table.shape[0]
    return torch.cat([wt.table, torch.tensor(rows, dtype=torch.int64).reshape(len(rows), -1)],
                     dim=1)


@dataclass(frozen=True)
class Shape:
    """A forward's sizes: B rows of T new tokens; hidden H, nh query and nkv KV heads of D,
    MLP width I, RMSNorm eps."""

    b: int
    t: int
    h: int
    nh: int
    nkv: int
    d: int
    inter: int
    eps: float


def layers(table: torch.Tensor, final_norm: torch.Tensor, x: torch.Tensor, s: Shape,
           rope: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, rows: Any,
           aux_cols: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every layer of a forward (``table``: :func:`layer_table`) on the residual stream ``x``
    [M, H] (M = B T rows, contiguous; updated in place): the final-norm hidden states [M, H],
    and the residual stream entering layer i where ``aux_cols[i] >= 0`` (i = 0 .. L; L: after
    the last) in columns ``aux_cols[i] * H ..`` of [M, n H] (None when none is asked). rope:
    ``cos`` / signed ``sin`` [B or 1, T, 1, D]; slots: each row's cache slot (int64 [M]); rows:
    the attention kernel's :class:`~specserve.runtime.cpu_attention.KeyRows`."""
    lib = _lib()
    m = x.shape[0]
    cos, sin = rope
    n_aux = sum(c >= 0 for c in aux_cols)
    y = torch.empty(m, s.h)
    aux = torch.empty(m, n_aux * s.h) if n_aux else None
    cols = torch.tensor(aux_cols, dtype=torch.int32)
    cbs = cos.stride(0) if cos.shape[0] > 1 else 0
    rc = lib.specserve_layers_rows_f32(
        table.data_ptr(), table.shape[0], final_norm.data_ptr(), x.data_ptr(), y.data_ptr(),
        _ptr(aux), cols.data_ptr(), n_aux, cos.data_ptr(), sin.data_ptr(), cbs, cos.stride(1),
        slots.data_ptr(), rows.start.data_ptr(), rows.lens.data_ptr(), rows.node.data_ptr(),
        rows.node.shape[1], rows.max_past, s.b, s.t, s.h, s.nh, s.nkv, s.d, s.inter, s.eps)
    if rc != 0:
        raise MemoryError("cpu layers: scratch allocation failed")
    return y, aux
