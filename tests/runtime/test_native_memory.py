"""``specserve/runtime/native_memory.py``: glibc's ``malloc_trim`` really hands free heap pages
back (RSS measured), the :class:`Trimmer`'s two intervals (idle, busy) on a fake clock, and
oneDNN's cache capacity set only where the operator set none. The serving loop's ticks:
``tests/triton/test_serving_loop.py``."""

from __future__ import annotations

import ctypes.util
import sys
from pathlib import Path

import pytest

from specserve.runtime.native_memory import (
    DEFAULT_ONEDNN_CACHE,
    ONEDNN_CACHE_ENV,
    Trimmer,
    cap_primitive_cache,
    malloc_trim,
    trimmer,
)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


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
    assert cap_primitive_cache(env=env) == str(DEFAULT_ONEDNN_CACHE)
    assert env == {ONEDNN_CACHE_ENV: str(DEFAULT_ONEDNN_CACHE)}
    env = {ONEDNN_CACHE_ENV: "4096"}
    assert cap_primitive_cache(64, env=env) == "4096" and env[ONEDNN_CACHE_ENV] == "4096"
