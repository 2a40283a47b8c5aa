"""The few-row float32 linear kernel (``runtime/cpu_linear.py``, ``csrc/linear_rows.c``).

Checked against ``F.linear`` within float32 rounding over 1..16 rows, odd shapes (N and K not
multiples of the vector width), bias, strided inputs, and each of its code paths (AVX-512,
AVX2, plain C) where this CPU runs them; then when ``linear`` takes it, the layouts
``lay_out`` makes with and without it, and whole forwards and a speculative decode of the tiny
model with and without it; then how it is built and what happens without a compiler."""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specserve.runtime import cpu_linear, native_build
from specserve.runtime.cpu_linear import MAX_ROWS, Linear, lay_out, linear, rows_linear
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import load_model
from specserve.runtime.proposers import DraftModelProposer
from tests.helpers.tiny import TinyCheckpoint

torch.set_num_threads(1)
needs_kernel = pytest.mark.skipif(cpu_linear._kernel() is None,
                                  reason="no C compiler here: MKL / oneDNN only")
EPS = torch.finfo(torch.float32).eps
SHAPES = [(576, 576), (13, 37), (5, 8), (7, 1), (1, 9), (33, 100), (4, 16), (1030, 17)]  # (N, K)


def _bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Float32 rounding bound for two orders of summation of one linear: each differs from the
    exact sum by at most (K + 1) * eps * sum |terms| (the classic dot-product bound), so the
    two by twice that."""
    mag = F.linear(x.abs().double(), w.abs().double(), None if b is None else b.abs().double())
    return 2 * (w.shape[1] + 1) * EPS * mag.float() + 1e-30


def _check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    want = F.linear(x, w, b)
    assert got.shape == want.shape
    err = (got - want).abs()
    assert bool((err <= _bound(x, w, b)).all()), float(err.max())


def _inputs(m: int, n: int, k: int, bias: bool,
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)  # [M, K]
    w = torch.randn(n, k, generator=g)  # [N, K]
    return x, w, (torch.randn(n, generator=g) if bias else None)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", SHAPES)
def test_equals_f_linear(n: int, k: int, bias: bool) -> None:
    """Every row count 1..MAX_ROWS, within float32 rounding of F.linear (:func:`_bound`)."""
    for m in range(1, MAX_ROWS + 1):
        x, w, b = _inputs(m, n, k, bias, seed=m)
        with torch.inference_mode():
            _check(rows_linear(x, w, b), x, w, b)


@needs_kernel
def test_strided_inputs_and_leading_dims() -> None:
    """x [B, T, K] as a strided view (rows apart, the last dim strided too), a weight whose
    rows are a slice of a wider tensor (row stride > K): same as F.linear, shape [B, T, N]."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(40, 70, generator=g)
    w = wide[:, 3:60]  # [40, 57], row stride 70
    base = torch.randn(3, 5, 2 * 57, generator=g)
    x = base[:, 1:4, ::2]  # [3, 3, 57], last dim stride 2
    b = torch.randn(40, generator=g)
    with torch.inference_mode():
        got = rows_linear(x, w, b)
    assert got.shape == (3, 3, 40)
    _check(got.reshape(9, 40), x.reshape(9, 57), w, b)


def _variant(flags: tuple[str, ...], tmp: Path) -> Callable[..., int]:
    return cpu_linear.bind(ctypes.CDLL(str(native_build.build(cpu_linear.SOURCE, tmp, flags))))


VARIANTS = {"native": (), "no-avx512bf16": ("-mno-avx512bf16",), "avx2": ("-mno-avx512f",),
            "plain": ("-mno-avx2", "-mno-fma")}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kernel built for one code path (x86 only: the flags name x86 extensions)."""
    if cpu_linear._kernel() is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 code paths need a C compiler on x86")
    fn = _variant(native_build.FLAGS + VARIANTS[request.param], tmp_path)
    monkeypatch.setattr(cpu_linear, "_loaded", [fn])
    yield request.param


def test_each_code_path_equals_f_linear(variant: str) -> None:
    """AVX-512 with and without its BF16 dot (where built), AVX2 + FMA, and the plain C loop:
    all rows, odd shapes, bias,
    float32 and bfloat16 weights."""
    for n, k in SHAPES:
        for m in (1, 2, 3, 4, 5, 7, 8, 16):
            x, w, b = _inputs(m, n, k, True, seed=n + k + m)
            with torch.inference_mode():
                _check(rows_linear(x, w, b), x, w, b)
                _check_bf16(x.bfloat16(), w.bfloat16(), b.bfloat16())


def test_each_code_path_reads_panels(variant: str) -> None:
    """The panel kernel where built (AVX-512: 16 columns a panel; none with AVX2 or plain C):
    every row count 1..MAX_ROWS (each its own tile shape), odd shapes (N not a multiple of the
    panel or of the widest tile, K odd), bias and not."""
    width = cpu_linear.panel_width()
    avx512 = {b"avx512f", b"avx512dq"} <= set(native_build.cpu_flags().split())
    assert width == (16 if avx512 and variant not in ("plain", "avx2") else 0)
    if not width:  # panels of another build's width (16): the row-major weight is read
        x, w, b = _inputs(5, 37, 33, True)
        with torch.inference_mode():
            _check(rows_linear(x, w, b, cpu_linear.to_panels(w, 16)), x, w, b)
        return
    for n, k in SHAPES:
        for m in range(1, MAX_ROWS + 1):
            x, w, b = _inputs(m, n, k, m % 2 == 0, seed=n + k + m)
            with torch.inference_mode():
                _check(rows_linear(x, w, b, cpu_linear.to_panels(w, width)), x, w, b)


@needs_kernel
def test_panels_layout() -> None:
    """p[g, k, j] = w[g W + j, k], zero beyond N, the panel count a multiple of the pad; strided
    rows of x read as they are."""
    width, pad = cpu_linear.panel_width(), cpu_linear.panel_pad()
    w = torch.randn(37, 5)
    p = cpu_linear.to_panels(w, 8)
    assert p.shape == (-(-37 // (8 * pad)) * pad, 5, 8) and p.is_contiguous()
    assert torch.equal(p[2, :, 3], w[19]) and torch.equal(p[4, :, 4], w[36])
    assert not p[4, :, 5:].any() and not p[5:].any()
    out = torch.full(p.shape, float("nan"))
    assert cpu_linear.to_panels(w, 8, out) is out and torch.equal(out, p)
    if width:
        wide = torch.randn(6, 2 * 57)
        x = wide[:, ::2]  # [6, 57], rows 114 apart, last dim stride 2
        w = torch.randn(30, 57)
        with torch.inference_mode():
            _check(rows_linear(x, w, None, cpu_linear.to_panels(w, width)), x, w, None)
            none = rows_linear(x[:0], w, None, cpu_linear.to_panels(w, width))  # no rows
        assert none.shape == (0, 30)


@needs_kernel
def test_lay_out_makes_panels_and_a_new_weight_drops_them() -> None:
    """float32 weights get panels within the budget (none beyond it); assigning another weight
    (a tied LM head) drops the copies of the old one, so that no stale copy is ever read."""
    lin = Linear(64, 48)
    lay_out([lin], torch.float32, panel_limit_bytes=64 * 48 * 4)
    width = cpu_linear.panel_width()
    assert (lin.panels is not None) == bool(width)
    if width:
        assert lin.panels is not None
        assert torch.equal(lin.panels, cpu_linear.to_panels(lin.weight, width))
    lin.weight = torch.nn.Parameter(torch.randn(48, 64), requires_grad=False)
    assert lin.panels is None and lin.multi_row is None
    other = Linear(64, 48)
    lay_out([other], torch.float32, panel_limit_bytes=64 * 48 * 4 - 1)
    assert other.panels is None and other.few_rows


def _check_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """bfloat16: the float32 linear of the same bfloat16 values, rounded once to bfloat16 (half
    an ulp, 2^-9 relative, allowed a whole one) plus the float32 summation bound."""
    got = rows_linear(x, w, b)
    assert got.dtype == torch.bfloat16
    x32, w32 = x.float(), w.float()
    b32 = None if b is None else b.float()
    want = F.linear(x32, w32, b32)
    err = (got.float() - want).abs()
    assert bool((err <= want.abs() * 2.0 ** -8 + _bound(x32, w32, b32)).all()), float(err.max())


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", SHAPES)
def test_bfloat16_weights(n: int, k: int, bias: bool) -> None:
    """bfloat16 x and W (widened as they load), every row count: F.linear's result within
    bfloat16 rounding (:func:`_check_bf16`)."""
    for m in range(1, MAX_ROWS + 1):
        x, w, b = _inputs(m, n, k, bias, seed=m)
        with torch.inference_mode():
            _check_bf16(x.bfloat16(), w.bfloat16(), None if b is None else b.bfloat16())


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = cpu_linear.rows_linear

    def counted(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                panels: torch.Tensor | None = None) -> torch.Tensor:
        calls.append(x.numel() // x.shape[-1])
        return real(x, w, b, panels)
    monkeypatch.setattr(cpu_linear, "rows_linear", counted)
    return calls


@needs_kernel
def test_when_linear_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Laid out in float32: up to MAX_ROWS rows take the kernel; more rows, autograd, two
    threads, float16 input, or SPECSERVE_CPU_LINEAR=off do not; all equal F.linear."""
    lin = Linear(64, 48)
    lay_out([lin], torch.float32)
    assert lin.few_rows and lin.multi_row is None and lin.weight.is_contiguous()
    calls = _spy(monkeypatch)
    g = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        for rows in (1, 5, MAX_ROWS, MAX_ROWS + 1):
            x = torch.randn(rows, 64, generator=g)
            _check(linear(x, lin), x, lin.weight, lin.bias)
        assert calls == [1, 5, MAX_ROWS]
        torch.set_num_threads(2)
        try:
            linear(x[:2], lin)
        finally:
            torch.set_num_threads(1)
        half = Linear(64, 48, dtype=torch.float16)
        half.few_rows = True  # as if laid out: a float16 input still goes to F.linear
        linear(x[:2].half(), half)
    linear(torch.randn(2, 64), lin)  # autograd on
    monkeypatch.setattr(cpu_linear, "_loaded", [])
    monkeypatch.setenv(cpu_linear.ENV, "off")
    assert not cpu_linear.prepare()
    with torch.inference_mode():
        linear(x[:2], lin)
    assert calls == [1, 5, MAX_ROWS]


@needs_kernel
def test_more_rows_keep_the_prepacked_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights above ``multi_row_min`` (within the copies' budget) keep oneDNN's prepacked
    copy for more than MAX_ROWS rows, equal to F.linear; under the budget's limit, none."""
    if not cpu_linear.can_prepack(torch.float32):
        pytest.skip("this torch build has no oneDNN")
    lin, over = Linear(64, 48), Linear(64, 48)
    lay_out([lin], torch.float32, multi_row_min=0)
    lay_out([over], torch.float32, multi_row_limit_bytes=100, multi_row_min=0)
    assert lin.few_rows and lin.multi_row is not None and over.multi_row is None
    calls = _spy(monkeypatch)
    x = torch.randn(MAX_ROWS + 3, 64)
    with torch.inference_mode():
        _check(linear(x, lin), x, lin.weight, lin.bias)
        _check(linear(x[:3], lin), x[:3], lin.weight, lin.bias)
    assert calls == [3]


def test_without_it_the_onednn_layouts_remain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switched off: float32 weights column-major plus a prepacked multi-row copy, as before."""
    monkeypatch.setattr(cpu_linear, "_loaded", [])
    monkeypatch.setenv(cpu_linear.ENV, "off")
    lin = Linear(64, 48)
    lay_out([lin], torch.float32, multi_row_min=0)
    assert not lin.few_rows and lin.weight.stride(0) == 1
    assert lin.multi_row is not None or not cpu_linear.can_prepack(torch.float32)


def _greedy(ckpt: TinyCheckpoint, kernel: bool, monkeypatch: pytest.MonkeyPatch,
            tied: bool = False) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of a batched draft-target decode, and the logits of one 5-token verify
    forward, with the models laid out with or without the kernel."""
    monkeypatch.setattr(cpu_linear, "_loaded", [] if kernel else [None])
    target = load_model(ckpt.target)
    if tied:  # the LM head shares the embedding (as SmolLM2's): laid out as it is
        target.lm_head.weight = target.embed.weight
        target.decode_layout()
        assert target.lm_head.few_rows == kernel
    draft = load_model(ckpt.target)
    assert target.layers[0].down.few_rows == kernel  # type: ignore[union-attr]
    prompts = [list(range(5, 40)), list(range(60, 81)), [7, 100, 7, 100, 7, 100, 9]]
    dec = SpecDecoder(target, DraftModelProposer(draft, max_draft_len=4))
    tokens = [r.token_ids for r in dec.generate(prompts, [SamplingParams(max_tokens=20)] * 3)]
    cache = target.new_cache(1, 64)
    with torch.inference_mode():
        target(torch.tensor([prompts[0]]), cache)
        cache.lengths = [len(prompts[0])]
        logits = target.logits(target(torch.tensor([[3, 9, 27, 81, 243]]), cache))
    return tokens, logits


@needs_kernel
@pytest.mark.parametrize("tied", [False, True])
def test_a_model_decodes_the_same(tiny_ckpt: TinyCheckpoint, tied: bool,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny target with every linear (and the LM head, tied or not) on the kernel: the same
    greedy tokens as on MKL / oneDNN, and verify logits within 1e-5."""
    tokens, logits = _greedy(tiny_ckpt, True, monkeypatch, tied)
    want_tokens, want_logits = _greedy(tiny_ckpt, False, monkeypatch, tied)
    assert tokens == want_tokens
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_a_bfloat16_model_is_close(tiny_ckpt: TinyCheckpoint,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny target in bfloat16 as an AVX2-only CPU runs it (oneDNN without bfloat16
    kernels: ours take it), against oneDNN's prepacked weights (or F.linear): verify logits
    within bfloat16 rounding of each other (2% of their range: rounding differs per layer)."""
    out = []
    onednn_bf16 = cpu_linear.can_prepack(torch.bfloat16)
    for kernel in (True, False):
        monkeypatch.setattr(cpu_linear, "_loaded", [] if kernel else [None])
        prepacks_bf16 = not kernel and onednn_bf16
        monkeypatch.setattr(cpu_linear, "can_prepack",
                            lambda d, bf16=prepacks_bf16: d == torch.float32 or bf16)
        m = load_model(tiny_ckpt.target, dtype=torch.bfloat16)
        assert m.layers[0].down.few_rows == kernel  # type: ignore[union-attr]
        cache = m.new_cache(1, 64)
        with torch.inference_mode():
            m(torch.tensor([list(range(5, 40))]), cache)
            cache.lengths = [35]
            out.append(m.logits(m(torch.tensor([[3, 9, 27, 81, 243]]), cache)))
    scale = float(out[1].abs().max())
    assert float((out[0] - out[1]).abs().max()) <= 0.02 * scale


@needs_kernel
def test_bfloat16_stays_on_onednn_where_it_has_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """With oneDNN's bfloat16 kernels, bfloat16 weights are prepacked for them, not ours."""
    monkeypatch.setattr(cpu_linear, "can_prepack", lambda d: True)
    assert cpu_linear.uses_kernel(torch.float32) and not cpu_linear.uses_kernel(torch.bfloat16)
    monkeypatch.setattr(cpu_linear, "can_prepack", lambda d: d == torch.float32)
    assert cpu_linear.uses_kernel(torch.bfloat16)


@needs_kernel
def test_build_is_cached_and_keeps_denormals(tmp_path: Path) -> None:
    """A second build finds the first one's library; loading it leaves float32 denormals on
    (the library is not linked with -ffast-math)."""
    first = cpu_linear.build(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert cpu_linear.build(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert first.name.startswith("linear_rows-") and not list(tmp_path.glob(".linear_rows-*"))
    assert float(torch.tensor(1e-40, dtype=torch.float32)) != 0.0


def test_no_compiler_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                caplog: pytest.LogCaptureFixture) -> None:
    """No C compiler: logged once, ``linear`` keeps MKL / oneDNN, nothing left in the cache."""
    monkeypatch.setattr(cpu_linear, "_loaded", [])
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path))
    with caplog.at_level("WARNING", logger="specserve"):
        assert not cpu_linear.prepare()
    assert "no C compiler" in caplog.text
    lin = Linear(16, 8)
    lay_out([lin], torch.float32)
    assert not lin.few_rows
    x = torch.randn(3, 16)
    with torch.inference_mode():
        assert torch.equal(linear(x, lin), F.linear(x, lin.weight, lin.bias))
    assert not list(tmp_path.rglob("*.so"))
