"""Native memory of a long-running serving process: the two caches below Python that grow
under mixed traffic while no Python object does (issue 29: "a 10-minute mixed soak ... its RSS
stays flat"; traced in ``docs/reliability.md`` §3).

- **glibc's free lists.** Freed chunks stay in malloc's arenas; pages inside the heap are handed
  back to the kernel only by ``malloc_trim(3)`` ("since glibc 2.8 this function frees memory in
  all arenas and in all chunks with whole free pages"). A serving loop frees tensors of many
  sizes (prefill chunks of any length, batches of any size), so the heap fragments and RSS
  creeps. :class:`Trimmer` calls ``malloc_trim(0)`` from the serving loop: when the loop goes
  idle (no request is waiting on it then) and, under unbroken load, at most every
  ``busy_every_s``.
- **oneDNN's primitive cache.** One primitive per (op, shapes), LRU, capacity read once from
  ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` at the cache's first use (oneDNN docs, "Primitive Cache";
  default 1024). Prefill lengths after prefix reuse take every value, so the cache fills with
  prefill shapes a decode step never reuses. :func:`cap_primitive_cache` sets a smaller default
  before torch runs its first oneDNN op; a value already in the environment is kept.

Glibc only: elsewhere (musl, macOS) :func:`malloc_trim` does nothing and says so (False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable, MutableMapping

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
# enough for every decode-time shape of a target and a draft (each linear at each batch size
# and verify width seen in a run: docs/reliability.md), far below oneDNN's 1024
DEFAULT_ONEDNN_CACHE = 256
BUSY_EVERY_S = 10.0  # under unbroken load, trim at most this often
IDLE_EVERY_S = 1.0  # going idle, at most this often

_libc: ctypes.CDLL | None = None
_looked_up = False


def cap_primitive_cache(capacity: int = DEFAULT_ONEDNN_CACHE,
                        env: MutableMapping[str, str] | None = None) -> str:
    """Set ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to ``capacity`` unless the environment already
    names one (the operator's value wins); the value now in force. Effective only before the
    process's first oneDNN primitive is made."""
    env = os.environ if env is None else env
    return env.setdefault(ONEDNN_CACHE_ENV, str(capacity))


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
