"""The CPU layer kernels (``runtime/cpu_layer.py``, ``csrc/layer_rows.c``): each element-wise
kernel against the ATen ops it replaces (float32, seeded inputs, within 2e-6 relative), then
whole forwards of the tiny model by the one-call path, by the row path (ATen's linears, the C
element-wise kernels) and by ATen (decode, ragged rows, verify chains, prefills, captured
layers)."""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from specserve.runtime import cpu_layer, native_build
from specserve.runtime.model import RMSNorm, Transformer, _rms, load_model
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)
needs_kernel = pytest.mark.skipif(cpu_layer._kernel() is None,
                                  reason="no C compiler here: the model uses ATen")
TOL = dict(rtol=2e-6, atol=2e-6)


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@needs_kernel
def test_rms_and_add_rms_equal_aten() -> None:
    g = _g()
    x, r = torch.randn(5, 576, generator=g), torch.randn(5, 576, generator=g)
    w = torch.randn(576, generator=g)
    torch.testing.assert_close(cpu_layer.rms(x, w, 1e-5), _rms(x, w, 1e-5), **TOL)
    want_x = x + r
    y = cpu_layer.add_rms(x, r, w, 1e-5)
    torch.testing.assert_close(x, want_x, rtol=0, atol=0)  # the residual add, in place
    torch.testing.assert_close(y, _rms(want_x, w, 1e-5), **TOL)


@needs_kernel
@pytest.mark.parametrize(("b", "t", "ragged"), [(1, 1, False), (3, 1, True), (2, 5, True),
                                                 (2, 4, False)])
def test_rope_and_kv_write_equal_aten(b: int, t: int, ragged: bool) -> None:
    """q and k heads rotated as the model's roll-based RoPE (signed sin table); each row's k
    and v heads at its own slot; nothing else in the cache written."""
    g = _g()
    nh, nkv, d, s = 3, 1, 64, 40
    qkv = torch.randn(b * t, (nh + 2 * nkv) * d, generator=g)
    table_cos, table_sin = torch.randn(s, d, generator=g), torch.randn(s, d, generator=g)
    lens = [7 + 5 * i for i in range(b)] if ragged else [9] * b
    pos = torch.tensor(lens)[:, None] + torch.arange(t)  # [B, T]
    if ragged:
        cos, sin = table_cos[pos][:, :, None], table_sin[pos][:, :, None]  # [B, T, 1, D]
    else:
        cos, sin = table_cos[9:9 + t][None, :, None], table_sin[9:9 + t][None, :, None]
    kbuf, vbuf = torch.zeros(b, nkv, s, d), torch.zeros(b, nkv, s, d)
    heads = qkv.view(b, t, nh + 2 * nkv, d)
    qk = heads[:, :, :nh + nkv]
    want = qk * cos + qk.roll(d // 2, dims=-1) * sin  # model._attention's RoPE
    want_k, want_v = torch.zeros_like(kbuf), torch.zeros_like(vbuf)
    for i in range(b):
        want_k[i, :, pos[i]] = want[i, :, nh:].transpose(0, 1)
        want_v[i, :, pos[i]] = heads[i, :, nh + nkv:].transpose(0, 1)
    cpu_layer.rope_kv(qkv, (cos, sin), kbuf, vbuf, pos.reshape(-1), t, nh, nkv)
    torch.testing.assert_close(qkv.view(b, t, -1, d)[:, :, :nh + nkv], want, **TOL)
    torch.testing.assert_close(kbuf, want_k, **TOL)
    torch.testing.assert_close(vbuf, want_v, rtol=0, atol=0)


@needs_kernel
def test_silu_mul_equals_aten() -> None:
    gu = torch.randn(4, 2 * 1536, generator=_g()) * 4
    g, u = gu.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_layer.silu_mul(gu), F.silu(g) * u, **TOL)


@contextmanager
def _aten() -> Iterator[None]:
    """The model's ATen ops, as with no C compiler (the library unloaded meanwhile)."""
    saved = list(cpu_layer._loaded)
    cpu_layer._loaded[:] = [None]
    try:
        yield
    finally:
        cpu_layer._loaded[:] = saved


def _forward(m: Transformer, path: str, tokens: torch.Tensor, lens: list[int],
             **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One forward after ragged prefills of ``lens`` tokens (on the ATen path) by ``path``
    ("one call": cpu_forward.one_call, "rows": cpu_forward.rows, "aten"): hidden, aux, the K
    cache."""
    g = torch.Generator().manual_seed(1)
    cache = m.new_cache(len(lens), 64)
    with torch.inference_mode():
        with _aten():
            for i, n in enumerate(lens):
                view = cache.view(i, i + 1)
                view.lengths = [0]
                m.run(torch.randint(0, m.cfg.vocab_size, (1, n), generator=g), view)
        cache.lengths = list(lens)
        m._fusable = False if path == "rows" else None
        one_call = m._fused_rows(torch.zeros(*tokens.shape, m.cfg.hidden_size),
                                 m.step_inputs(tokens, cache))
        with _aten() if path == "aten" else nullcontext():
            assert one_call == (path == "one call") or path == "aten"
            f = m.run(tokens, cache, **kw)
    m._fusable = None
    return f.hidden, f.aux, torch.stack(cache.k)


def _distinct_norms(tiny_models: TinyModels) -> Transformer:
    """The tiny target with its norms' weights made distinct (trained or fresh, they may all be
    near one), so a layer normalised with another's weight shows."""
    m = load_model(tiny_models.ckpt.target).decode_layout(multi_row_min=0)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for norm in (x for x in m.modules() if isinstance(x, RMSNorm)):
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) + 0.5)
    return m


@needs_kernel
@pytest.mark.parametrize(("lens", "t", "path"), [
    ([12], 1, "one call"), ([5, 19, 11], 1, "one call"), ([8, 8], 1, "one call"),
    ([6, 14], 5, "one call"), ([6, 14], 5, "rows"), ([4, 9, 7, 3], 5, "rows"),
    ([6, 14], 20, "rows"), ([0, 0], 24, "rows")])
def test_forwards_equal_the_aten_path(tiny_models: TinyModels, lens: list[int], t: int,
                                      path: str) -> None:
    """Decode (uniform and ragged rows), verify chains of 5 (one call, and 20 rows: the
    attention kernel with ATen's linears) and prefills (20 and 24 new tokens a row: SDPA):
    hidden states, the layers an EAGLE-3 head captures and the whole K cache within float32
    rounding of the ATen path."""
    m = _distinct_norms(tiny_models)
    tokens = torch.randint(0, m.cfg.vocab_size, (len(lens), t), generator=_g())
    capture = (0, 1, len(m.layers))
    want = _forward(m, "aten", tokens, lens, capture=capture)
    got = _forward(m, path, tokens, lens, capture=capture)
    for a, b in zip(got, want, strict=True):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_the_weight_table_is_made_once_per_layout(tiny_models: TinyModels,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The one C call reads the layers' addresses from a table made once per layout: two
    decode steps build it once; ``decode_layout`` (weights moved, copies redone) and ``.to()``
    drop it, so the next forward reads the addresses of the day, with the same outputs."""
    m = load_model(tiny_models.ckpt.target)
    made: list[int] = []
    real = cpu_layer.weight_table

    def counted(w: Any) -> cpu_layer.WeightTable:
        made.append(len(w))
        return real(w)
    monkeypatch.setattr(cpu_layer, "weight_table", counted)

    def step() -> torch.Tensor:
        cache = m.new_cache(2, 16)
        with torch.inference_mode():
            return m(torch.tensor([[5], [9]]), cache)
    first = step()
    assert torch.equal(step(), first) and made == [len(m.layers)]
    m.decode_layout()
    assert torch.equal(step(), first) and len(made) == 2
    m.to(torch.float32)
    assert m._weights is None


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_layer, "_loaded", [])
    monkeypatch.setenv(cpu_layer.ENV, "off")
    assert not cpu_layer.usable(torch.zeros(1, 1, 8), 64)


@needs_kernel
def test_avx2_build_equals_the_aten_path(tiny_models: TinyModels, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The library built for an AVX2-only CPU (the 256-bit linear code, CI's machines) gives the
    same forward: a ragged verify chain against ATen."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 code paths need x86")
    flags = native_build.FLAGS + ("-mno-avx512f",)
    lib = ctypes.CDLL(str(native_build.build(cpu_layer.SOURCES, tmp_path, flags)))
    cpu_layer._bind(lib)
    monkeypatch.setattr(cpu_layer, "_loaded", [lib])
    test_forwards_equal_the_aten_path(tiny_models, [6, 14], 5, "one call")
