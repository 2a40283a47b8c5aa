"""The serving engine's parameters every door shares: the defaults of the in-flight loop's
bounds (queued requests, prefill chunk), the prefix-cache budget and its split, how often native
memory goes back to the kernel, and the torch thread counts from the environment. A door reads
its own settings (the Triton model's ``config.pbtxt``: :mod:`specserve.triton.model_params`;
the Dynamo worker's flags) over these defaults."""

from __future__ import annotations

from specserve.errors import SpecserveError

DEFAULT_MAX_PENDING = 4096  # queued requests (parameter specserve_max_pending)
DEFAULT_PREFILL_CHUNK = 256  # prompt tokens prefilled per step (parameter specserve_prefill_chunk)
# prefix cache budget in MiB (parameter specserve_prefix_cache_mb; 0: off): 3/4 for the
# in-flight scheduler's pool, 1/4 for the draft_input_ids (BLS) verify calls' target-only pool.
# On by default: with nothing reused it costs 0-1% of tok/s once the pool's pages are touched
# (3-10% at c = 8-16 while they are first written) and no TTFT; multi-turn chat gets TTFT p50
# 0.24x (docs/results.md, "How much memory? The prefix cache"). 0 turns it off.
DEFAULT_PREFIX_CACHE_MB = 256
# seconds between malloc_trim calls under unbroken load (parameter specserve_malloc_trim_s; 0:
# never; runtime/native_memory.py): RSS flat over a long mixed soak (docs/reliability.md §3)
DEFAULT_MALLOC_TRIM_S = 10.0


def env_threads(name: str, default: int, env: dict[str, str] | None = None) -> int:
    """A thread count from environment variable ``name`` (``SPECSERVE_TORCH_THREADS``: the
    model's torch threads, default 1; ``SPECSERVE_PREFILL_THREADS``: its threads while it
    prefills, default 0 = the same); SpecserveError naming it when not an integer >= 0."""
    import os

    value = (os.environ if env is None else env).get(name, "").strip()
    try:
        n = int(value) if value else default
    except ValueError:
        raise SpecserveError(f"{name} must be an integer, got {value!r}") from None
    if n < 0:
        raise SpecserveError(f"{name} must be >= 0, got {n}")
    return n


def prefix_cache_split(mb: int) -> tuple[int, int]:
    """A prefix-cache budget of ``mb`` MiB as (in-flight pool, verify pool) bytes."""
    total = mb << 20
    return total - total // 4, total // 4
