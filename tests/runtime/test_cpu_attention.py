"""The CPU attention kernel (``runtime/cpu_attention.py``, ``csrc/attn_rows.c``): each row over
its own keys. Checked against ``F.scaled_dot_product_attention`` with the boolean mask the
model builds otherwise (:func:`step_mask`), over uniform and ragged rows, windows, chains,
draft-tree levels and grouped-query heads; then whole forwards and a whole speculative decode
with and without it; then when it is used and how it is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specserve.runtime import cpu_attention
from specserve.runtime.cpu_attention import key_rows
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.kvcache import step_mask
from specserve.runtime.proposers import DraftModelProposer
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)
needs_kernel = pytest.mark.skipif(cpu_attention._kernel() is None,
                                  reason="no C compiler here: the model uses SDPA")


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int],
               start: int, node: torch.Tensor) -> torch.Tensor:
    """SDPA over keys start..span-1 with step_mask's boolean mask -> [B, T, H * D]."""
    b, h, t, d = q.shape
    span = max(lens) + node.shape[1]
    mask = step_mask(torch.tensor(lens), node, span)[..., start:]  # [B, 1, T, span - start]
    out = F.scaled_dot_product_attention(q, k[:, :, start:span], v[:, :, start:span],
                                         attn_mask=mask, enable_gqa=h != k.shape[1])
    return out.transpose(1, 2).reshape(b, t, h * d)


CASES = [  # (lens, start, T, W, heads, kv heads, head dim, node: chain | tree)
    ([30], 0, 1, 1, 4, 4, 64, "chain"),
    ([17, 40, 3, 29], 0, 1, 1, 4, 4, 64, "chain"),       # ragged decode
    ([17, 40, 3, 29], 0, 5, 5, 4, 4, 64, "chain"),       # ragged verify of 4 drafts
    ([50, 50, 50], 0, 5, 5, 2, 2, 64, "chain"),          # uniform
    ([60, 44, 71], 30, 1, 1, 2, 2, 64, "chain"),         # a windowed draft (start > 0)
    ([60, 44, 71], 30, 3, 3, 2, 2, 64, "chain"),
    ([25, 9], 0, 4, 7, 4, 4, 64, "tree"),                # a tree level: T new, W slots
    ([33, 12, 20], 0, 5, 5, 8, 2, 64, "chain"),          # grouped-query (4 heads per KV)
    ([33, 12, 20], 0, 16, 16, 4, 1, 128, "chain"),       # the most new tokens, head dim 128
    ([0, 0], 0, 6, 6, 4, 4, 32, "chain"),                # a short prompt's prefill
]


@needs_kernel
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_equals_sdpa_with_the_mask(case: tuple) -> None:  # type: ignore[type-arg]
    """Same output as SDPA with step_mask's mask within 2e-6 (float32; seed 0). Stale values
    beyond each row's keys (a shorter row's later slots) must not count."""
    lens, start, t, w, h, hkv, d, kind = case
    g = torch.Generator().manual_seed(0)
    b, s_max = len(lens), max(lens) + w + 8
    q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)  # [B, H, T, D], as the model's
    k = torch.randn(b, hkv, s_max, d, generator=g) * 3  # stale slots hold large values too
    v = torch.randn(b, hkv, s_max, d, generator=g)
    if kind == "tree":
        node = torch.rand(t, w, generator=g) < 0.5
        node[torch.arange(t), torch.arange(t)] = True  # a node sees itself
    else:
        node = torch.ones(t, w, dtype=torch.bool).tril()
    with torch.inference_mode():
        got = cpu_attention.attend(q, k, v, key_rows(lens, start, node))
    want = _reference(q, k, v, lens, start, node)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_row_views_of_a_pool() -> None:
    """Rows 2..3 of a larger buffer (the in-flight pool's view) read their own rows."""
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(5, 2, 48, 64, generator=g), torch.randn(5, 2, 48, 64, generator=g)
    q = torch.randn(2, 2, 3, 64, generator=g)
    node = torch.ones(3, 3, dtype=torch.bool).tril()
    with torch.inference_mode():
        got = cpu_attention.attend(q, k[2:4], v[2:4], key_rows([20, 31], 0, node))
    torch.testing.assert_close(got, _reference(q, k[2:4], v[2:4], [20, 31], 0, node),
                               atol=2e-6, rtol=2e-6)


def _forwards(model: torch.nn.Module, lens: list[int], t: int, window: int,
              kernel: bool, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    """Hidden states of one forward of T new tokens over rows of ``lens`` positions."""
    monkeypatch.setattr(cpu_attention, "_loaded", [] if kernel else [None])
    g = torch.Generator().manual_seed(2)
    cache = model.new_cache(len(lens), 96)
    with torch.inference_mode():
        prefix = torch.randint(0, model.cfg.vocab_size, (len(lens), max(lens)), generator=g)
        cache.lengths = [0] * len(lens)
        model(prefix, cache)  # rows hold max(lens) positions; shorter rows' tails are stale
        cache.lengths = list(lens)
        tokens = torch.randint(0, model.cfg.vocab_size, (len(lens), t), generator=g)
        st = model.step_inputs(tokens, cache, window=window)
        assert (st.rows is not None) == kernel
        return model.run(tokens, cache, window=window).hidden


@needs_kernel
@pytest.mark.parametrize("lens,t,window", [([12, 30, 7], 5, 0), ([12, 30, 7], 1, 0),
                                           ([20, 20], 4, 0), ([25, 40, 31], 1, 8)])
def test_a_forward_equals_the_sdpa_forward(tiny_models: TinyModels, lens: list[int], t: int,
                                           window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny target's whole forward (every layer, K/V written as it goes) agrees within
    1e-5 with the kernel and without it."""
    with_kernel = _forwards(tiny_models.target, lens, t, window, True, monkeypatch)
    without = _forwards(tiny_models.target, lens, t, window, False, monkeypatch)
    torch.testing.assert_close(with_kernel, without, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_speculative_decode_is_unchanged(tiny_models: TinyModels,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A batched draft-target greedy decode gives the same tokens with the kernel as with
    SDPA, and as the target decoding alone (lossless either way)."""
    prompts = [list(range(5, 40)), list(range(60, 81)), [7, 100, 7, 100, 7, 100, 9]]
    params = [SamplingParams(max_tokens=20)] * 3
    out = {}
    for kernel in (True, False):
        monkeypatch.setattr(cpu_attention, "_loaded", [] if kernel else [None])
        dec = SpecDecoder(tiny_models.target,
                          DraftModelProposer(tiny_models.target_copy, max_draft_len=4))
        out[kernel] = [r.token_ids for r in dec.generate(prompts, params)]
    plain = SpecDecoder(tiny_models.target, None).generate(prompts, params)
    assert out[True] == out[False] == [r.token_ids for r in plain]


def test_where_it_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16, more than MAX_NEW new tokens, autograd, two torch threads, switched off: SDPA."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(cpu_attention, "_loaded", [object()])  # as if built
    with torch.inference_mode():
        assert cpu_attention.usable(torch.float32, cpu, cpu_attention.MAX_NEW)
        assert not cpu_attention.usable(torch.bfloat16, cpu, 1)
        assert not cpu_attention.usable(torch.float32, cpu, cpu_attention.MAX_NEW + 1)
        torch.set_num_threads(2)
        try:
            assert not cpu_attention.usable(torch.float32, cpu, 1)
        finally:
            torch.set_num_threads(1)
    assert not cpu_attention.usable(torch.float32, cpu, 1)  # grad enabled
    monkeypatch.setattr(cpu_attention, "_loaded", [])
    monkeypatch.setenv(cpu_attention.ENV, "off")
    assert cpu_attention._kernel() is None


def test_no_compiler_falls_back(monkeypatch: pytest.MonkeyPatch,
                                caplog: pytest.LogCaptureFixture) -> None:
    """Without a C compiler the kernel is unavailable, said once in the log, and the model
    keeps SDPA."""
    monkeypatch.setattr(cpu_attention, "_loaded", [])
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level("WARNING", logger="specserve"):
        assert cpu_attention._kernel() is None
    assert "no C compiler" in caplog.text
    with torch.inference_mode():
        assert not cpu_attention.usable(torch.float32, torch.device("cpu"), 1)


@needs_kernel
def test_build_is_cached_per_source_and_machine(tmp_path: Path) -> None:
    """A second build finds the first one's library; the name carries the key."""
    first = cpu_attention.build(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert cpu_attention.build(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert first.name.startswith("attn_rows-") and not list(tmp_path.glob(".attn_rows-*"))


@needs_kernel
def test_loading_it_keeps_denormals() -> None:
    """The library is built with fast math but must not switch the process to flush-to-zero
    (a -ffast-math link does, through crtfastmath.o): float32 and float64 denormals survive."""
    assert cpu_attention._kernel() is not None  # loaded in this process
    assert float(torch.tensor(1e-40, dtype=torch.float32)) != 0.0
    assert float(torch.tensor(1e-310, dtype=torch.float64) * 1.0) != 0.0


def test_a_compiler_that_fails_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """A compiler that exits non-zero (here: ``false``) leaves SDPA in place, with the reason
    logged, and no half-written library in the cache."""
    monkeypatch.setattr(cpu_attention, "_loaded", [])
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path))
    with caplog.at_level("WARNING", logger="specserve"):
        assert cpu_attention._kernel() is None
    assert "failed" in caplog.text
    assert not [p for p in (tmp_path / "kernels").iterdir()]
