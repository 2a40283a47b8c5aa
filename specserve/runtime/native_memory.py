"""Native memory of a long-running serving process: what grows below Python under mixed traffic
while no Python object does (the goal: RSS flat over a 10-minute mixed soak; traced
in ``docs/reliability.md`` §3).

- **Two primitive caches.** oneDNN keeps one primitive per (op, shapes) in an LRU cache of
  ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` entries (oneDNN docs, "Primitive Cache"; default 1024),
  and ideep, PyTorch's oneDNN wrapper, keeps its own of ``LRU_CACHE_CAPACITY`` (default 1024).
  Both are read once, at their first use. ``mkldnn._linear_pointwise`` (runtime/cpu_linear.py)
  fills them with one entry per input row count, and prefill lengths after prefix reuse take
  every value: glibc's in-use bytes grew ~9 MB per 80 mixed requests until the caches filled,
  and stayed flat with both disabled (``benchmarks/native_memory.py``). A decode step's shapes
  are few and hot, so a smaller LRU keeps them: :func:`cap_primitive_cache` sets both before
  torch runs its first oneDNN op; a value already in the environment is kept.
- **glibc's free lists.** Freed chunks stay in malloc's arenas; pages inside the heap go back
  to the kernel only through ``malloc_trim(3)`` ("since glibc 2.8 this function frees memory in
  all arenas and in all chunks with whole free pages"). :class:`Trimmer` calls it from the
  serving loop: when the loop goes idle (no request waits on it then) and, under unbroken load,
  at most every ``busy_every_s``.

Glibc only: elsewhere (musl, macOS) :func:`malloc_trim` does nothing and says so (False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable, MutableMapping

# oneDNN's own cache, and ideep's (PyTorch reads it through ideep's lru_cache)
CACHE_ENVS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
# far below the default 1024 and above a decode step's working set (docs/reliability.md §3)
DEFAULT_PRIMITIVE_CACHE = 128
BUSY_EVERY_S = 10.0  # under unbroken load, trim at most this often
IDLE_EVERY_S = 1.0  # going idle, at most this often

_libc: ctypes.CDLL | None = None
_looked_up = False


def cap_primitive_cache(capacity: int = DEFAULT_PRIMITIVE_CACHE,
                        env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each primitive cache's capacity (:data:`CACHE_ENVS`) to ``capacity`` unless the
    environment already names one (the operator's value wins); the values now in force.
    Effective only before the process's first oneDNN primitive is made."""
    env = os.environ if env is None else env
    return {key: env.setdefault(key, str(capacity)) for key in CACHE_ENVS}


def malloc_trim() -> bool:
    """``malloc_trim(0)``: glibc gives free heap pages back to the kernel; True when memory was
    released, False when none was or this C library has no ``malloc_trim``."""
    global _libc, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") else None
        except OSError:
            _libc = None
    return bool(_libc.malloc_trim(0)) if _libc is not None else False


class Trimmer:
    """When to call ``trim`` (default :func:`malloc_trim`) from a serving loop's thread:
    :meth:`tick` between steps, with ``idle`` True when the loop is about to wait for work."""

    def __init__(self, busy_every_s: float = BUSY_EVERY_S, idle_every_s: float = IDLE_EVERY_S,
                 trim: Callable[[], bool] = malloc_trim,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.busy_every_s, self.idle_every_s = busy_every_s, idle_every_s
        self.trim, self.clock = trim, clock
        self.last = clock()
        self.trims = 0

    def tick(self, idle: bool) -> bool:
        """Trim if the interval for this state has passed since the last trim; True if it did."""
        now = self.clock()
        if now - self.last < (self.idle_every_s if idle else self.busy_every_s):
            return False
        self.trim()
        self.last, self.trims = self.clock(), self.trims + 1
        return True


def trimmer(busy_every_s: float) -> Trimmer | None:
    """A :class:`Trimmer` trimming at most every ``busy_every_s`` under load; None for 0 (off)."""
    return Trimmer(busy_every_s=busy_every_s) if busy_every_s > 0 else None
