"""Timing the reference decoder's forward on this machine (``specserve predict --measure``).

T(n): one verify-style forward of ``n`` new tokens per row over a KV cache, the quantity the
speedup model of :mod:`specserve.spec.predictor` needs. Jobs are timed round robin
so that load from other processes on a shared machine hits them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specserve.errors import SpecserveError

STATS: dict[str, Callable[[list[float]], float]] = {"min": min, "median": statistics.median}


def step_clock(device: Any) -> Callable[[], float]:
    """The clock the draft-length policy and the proposers time steps with (``device``, a
    ``torch.device``): on a CPU with one torch thread, this thread's CPU time (what the step
    itself used: other processes on the machine barely move it, where they would stretch wall
    time and bend the measured curve); else wall time."""
    import torch

    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _forward_job(model: Any, n: int, batch: int, kv_len: int, seed: int = 0) -> Any:
    """A closure running one verify-style forward (hidden states + logits of ``n`` new tokens
    per row over ``kv_len`` cached ones) of a :class:`specserve.runtime.model.Transformer`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cache = model.new_cache(batch, kv_len + n)
    cache.lengths = [kv_len] * batch
    lengths = torch.full((batch,), kv_len, dtype=torch.long)  # [B]
    depth = torch.arange(n)  # [n]
    tokens = torch.randint(0, model.cfg.vocab_size, (batch, n), generator=g)  # [B, n]
    return lambda: model.logits(model(tokens, cache, lengths, depth, None))


def _prefill_job(model: Any, length: int, chunk: int, seed: int = 0) -> Any:
    """A closure running the in-flight batcher's prefill of one ``length``-token prompt
    (:class:`specserve.runtime.scheduler.Scheduler`): ``chunk``-token forwards over a one-row
    cache that grows by each, then the logits of the last token (the first one sampled)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cache = model.new_cache(1, length)
    tokens = torch.randint(0, model.cfg.vocab_size, (1, length), generator=g)  # [1, L]

    def run() -> Any:
        hidden = None
        for start in range(0, length, chunk):
            cache.lengths = [start]
            hidden = model(tokens[:, start:start + chunk], cache)  # [1, <= chunk, H]
        assert hidden is not None
        return model.logits(hidden[:, -1])  # [1, V]
    return run


def _heads_job(heads: Any, hidden_size: int, batch: int, topk: int) -> Any:
    """A closure running one Medusa-heads pass and its top-k (the per-step proposal)."""
    import torch

    hidden = torch.randn(batch, hidden_size, generator=torch.Generator().manual_seed(0))
    return lambda: heads(hidden).topk(topk, dim=-1)


def _round_robin(jobs: dict[str, Any], reps: int) -> dict[str, list[float]]:
    """Seconds of ``reps`` timed calls per job, after two warmup rounds. Jobs are timed in turn
    so load from other processes hits them alike."""
    import torch

    samples: dict[str, list[float]] = {k: [] for k in jobs}
    with torch.inference_mode():
        for i in range(reps + 2):
            for name, job in jobs.items():
                t0 = time.perf_counter()
                job()
                if i >= 2:
                    samples[name].append(time.perf_counter() - t0)
    return samples


def measure_step_times(model_dir: Path, ns: list[int], *, batch: int, kv_len: int, reps: int,
                       draft_dir: Path | None = None, medusa_dir: Path | None = None,
                       medusa_topk: int = 10, stat: str = "min",
                       threads: int | None = 1, prefill_lens: Sequence[int] = (),
                       prefill_chunk: int = 256) -> dict[str, Any]:
    """Time T(n) for each ``n`` with the reference decoder's model, plus one draft step or one
    Medusa-heads pass, and the prefill of one prompt of each of ``prefill_lens`` tokens (in
    ``prefill_chunk`` chunks, as the served batcher runs it). Returns ``{"step_s": {n: s},
    "draft_step_s": s|None, "heads_s": s|None, "prefill_s": {L: s}, "samples_s": {job: [s,
    ...]}}`` (``stat`` of the samples). ``threads``: torch CPU threads (the Triton reference
    model uses SPECSERVE_TORCH_THREADS, default 1); None leaves torch's setting alone.
    """
    import torch

    from specserve.runtime.checkpoint import load_medusa_heads
    from specserve.runtime.model import load_model

    if reps < 1 or stat not in STATS:
        raise SpecserveError(f"--reps must be >= 1 and --stat one of {sorted(STATS)}")
    if threads is not None:
        torch.set_num_threads(threads)
    target = load_model(model_dir)
    jobs = {f"t{n}": _forward_job(target, n, batch, kv_len) for n in sorted({1, *ns})}
    if draft_dir is not None:
        # as DraftModelProposer serves it: one-token forwards in the decode layout
        jobs["draft"] = _forward_job(load_model(draft_dir).decode_layout(), 1, batch, kv_len)
    if medusa_dir is not None:
        heads = load_medusa_heads(medusa_dir, target.cfg.hidden_size, target.cfg.vocab_size)
        jobs["heads"] = _heads_job(heads, target.cfg.hidden_size, batch, medusa_topk)
    for n in sorted(set(prefill_lens)):
        jobs[f"p{n}"] = _prefill_job(target, n, max(1, prefill_chunk))
    samples = _round_robin(jobs, reps)
    t = {k: float(STATS[stat](v)) for k, v in samples.items()}
    return {"step_s": {int(k[1:]): v for k, v in t.items() if k.startswith("t")},
            "draft_step_s": t.get("draft"), "heads_s": t.get("heads"),
            "prefill_s": {int(k[1:]): v for k, v in t.items() if k.startswith("p")},
            "samples_s": samples}
