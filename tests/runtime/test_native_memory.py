"""``specserve/runtime/native_memory.py``: glibc's ``malloc_trim`` really hands free heap pages
back (RSS measured), the :class:`Trimmer`'s two intervals (idle, busy) on a fake clock, and
oneDNN's cache capacity set only where the operator set none. The serving loop's ticks:
``tests/serving/test_loop.py``."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from specserve.runtime.native_memory import (
    CACHE_ENVS,
    DEFAULT_PRIMITIVE_CACHE,
    Trimmer,
    cap_primitive_cache,
    malloc_trim,
    trimmer,
)
from tests.helpers.soak import rss_bytes


def _rss_mb() -> float:
    return rss_bytes() / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
                    reason="glibc only")
def test_malloc_trim_returns_fragmented_heap_pages() -> None:
    """~100 MB of 2000-byte buffers (above pymalloc's 512 bytes: glibc's heap), every 64th
    kept so the heap cannot shrink from its top: free() alone keeps the pages, the trim gives
    at least half of them back."""
    bufs = [bytearray(2000) for _ in range(50_000)]
    keep = bufs[::64]
    del bufs
    before = _rss_mb()
    assert malloc_trim() is True
    assert before - _rss_mb() > 45, "malloc_trim gave less than half of ~95 MB back"
    assert len(keep) == 782


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_trimmer_intervals_idle_and_busy() -> None:
    clock, calls = Clock(), []
    t = Trimmer(busy_every_s=10, idle_every_s=1, trim=lambda: calls.append(clock.t) or True,
                clock=clock)
    clock.t = 0.5
    assert not t.tick(idle=True) and not t.tick(idle=False)
    clock.t = 1.0
    assert not t.tick(idle=False)  # busy: not before 10 s
    assert t.tick(idle=True)  # idle: 1 s has passed
    clock.t = 1.5
    assert not t.tick(idle=True)  # counted from the last trim
    clock.t = 10.9
    assert not t.tick(idle=False)
    clock.t = 11.0
    assert t.tick(idle=False)
    assert calls == [1.0, 11.0] and t.trims == 2


def test_trimmer_off_at_zero() -> None:
    assert trimmer(0) is None
    made = trimmer(3)
    assert made is not None and made.busy_every_s == 3


def test_cap_primitive_cache_keeps_the_operators_value() -> None:
    env: dict[str, str] = {}
    want = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(DEFAULT_PRIMITIVE_CACHE),
            "LRU_CACHE_CAPACITY": str(DEFAULT_PRIMITIVE_CACHE)}
    assert set(CACHE_ENVS) == set(want)
    assert cap_primitive_cache(env=env) == want and env == want
    env = {"LRU_CACHE_CAPACITY": "4096"}
    assert cap_primitive_cache(64, env=env) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
                                                "LRU_CACHE_CAPACITY": "4096"}


_CACHE_PROBE = r"""
import ctypes, sys
from specserve.runtime.native_memory import cap_primitive_cache
cap_primitive_cache(int(sys.argv[1]))
import torch
torch.set_num_threads(1)

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks "
                                                "fsmblks uordblks fordblks keepcost").split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(256, 256))
def run(rows):
    torch.ops.mkldnn._linear_pointwise(torch.randn(rows, 256), w, None, "none", [], "")
for rows in range(2, 34):  # warm: the caches' fixed parts
    run(rows)
before = libc.mallinfo2().uordblks
for rows in range(34, 434):  # 400 new shapes, as prefills of every length make
    run(rows)
print((libc.mallinfo2().uordblks - before) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
                    reason="glibc only")
def test_capped_primitive_caches_bound_what_new_shapes_keep() -> None:
    """400 new input shapes through ``mkldnn._linear_pointwise`` (the op runtime/cpu_linear.py
    runs) in a fresh process: with both caches capped at 16 entries glibc's in-use bytes grow
    less than a quarter of what they grow at the default 1024 (the caps are read, by name,
    before torch's first oneDNN op)."""
    import subprocess

    def growth(cap: int) -> float:
        out = subprocess.run([sys.executable, "-c", _CACHE_PROBE, str(cap)], check=True,
                             capture_output=True, text=True, timeout=120).stdout
        return float(out.split()[-1])

    capped, default = growth(16), growth(1024)
    assert default > 4, f"the default caches kept only {default:.1f} MB: probe too small"
    assert capped < default / 4, f"capped {capped:.1f} MB vs default {default:.1f} MB"


def test_kv_cache_pages_resident_only_where_written() -> None:
    """A KV cache sized for a long context (SmolLM2's layout, 8 layers x 16 rows x 4,096
    positions: 384 MB of float32) costs resident memory only for the positions written (an
    anonymous map); its values are zeros until written, and a write lands where it should."""
    import torch

    from specserve.runtime.kvcache import KVCache
    from specserve.runtime.model_config import ModelConfig

    cfg = ModelConfig(vocab_size=64, hidden_size=576, intermediate_size=64, num_layers=8,
                      num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                      rope_theta=1e4, rope_scaling=(), max_position_embeddings=4096,
                      tie_word_embeddings=True, model_type="llama", eos_token_id=None)
    before = _rss_mb()
    cache = KVCache(cfg, 16, 4096, torch.float32, "cpu")
    grown = _rss_mb() - before
    assert grown < 48, f"a 384 MB cache made {grown:.0f} MB resident before any write"
    cache.k[3][5, :, :10] = 1.0
    assert float(cache.k[3][5, :, :10].sum()) == 3 * 10 * 64
    assert float(cache.k[3][5, :, 10:].abs().sum()) == 0 and float(cache.v[0].abs().sum()) == 0
