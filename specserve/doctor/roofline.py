"""This machine's limits and a checkpoint's decoding step against them (a roofline).

A decoding step on the CPU reads every weight once (a plain step, or a verify step of
batch x (K + 1) rows when the linears read each weight once for all rows) and does
2 * params FLOPs per row; it can be no faster than the larger of bytes / read bandwidth and
FLOPs / FMA rate. :func:`measure` finds the two rates on one thread:

- read bandwidth: a float32 GEMV (one row) over a matrix of ``size_mb`` (at least 512 MB by
  default, more than most last-level caches) on huge pages where the engine puts its weights
  (:mod:`specserve.runtime.huge_pages`), best of ``repeats`` after a warm-up: matrix bytes /
  seconds; the faster of ``torch.mv`` and, where built, the engine's own few-row kernel on the
  matrix as panels (:mod:`specserve.runtime.cpu_linear`: 29.8-34.5 against ``torch.mv``'s ~20
  GB/s on a 2-core AMD EPYC), so that a share of it is a share of what this machine can read;
- FMA rate: a float32 GEMM (``torch.mm``, 1024 cubed: compute-bound, in cache), best of
  ``repeats``: 2 * 1024^3 FLOPs / seconds.

It also names the CPU (``/proc/cpuinfo``) and says whether any two CPUs this process may run on
are SMT siblings of one core (``/sys/devices/system/cpu/cpu*/topology/thread_siblings_list``):
two threads on siblings share a core's FMA units and caches. :func:`roofline` (pure) puts a
step of a checkpoint against the measured rates. Attention and the KV cache are left out (small
at short contexts), and so is an untied embedding, of which a step reads one row per token.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specserve.errors import SpecserveError

GEMM_N = 1024  # FMA-rate probe: a 1024-cube float32 product (~8 MB, compute-bound)
DEFAULT_MB = 512


@dataclass(frozen=True)
class Machine:
    """One thread's read bandwidth and FMA rate here, and what CPU this is."""

    cpu: str
    cpus: int  # CPUs this process may run on
    smt_siblings: bool  # two of them are hyperthreads of one core
    read_gbs: float  # GB/s (1e9 bytes)
    gflops: float  # float32 FLOP/s / 1e9 (2 per FMA)
    method: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Roofline:
    """One decoding step of ``rows`` rows (batch x (K + 1)) against a :class:`Machine`."""

    dtype: str
    rows: int
    bytes_per_step: int  # weights read once per step
    flops_per_step: float  # 2 * params read * rows
    bandwidth_ms: float  # bytes / read bandwidth
    compute_ms: float  # FLOPs / FMA rate
    bound: str  # "bandwidth" | "compute"
    rows_at_balance: float  # rows at which the compute time reaches the bandwidth time

    @property
    def step_ms(self) -> float:
        """The least a step can take: the larger of the two."""
        return max(self.bandwidth_ms, self.compute_ms)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "step_ms": round(self.step_ms, 3)}


def roofline(params: int, dtype_bytes: int, rows: int, read_gbs: float, gflops: float,
             dtype: str = "float32") -> Roofline:
    """A step that reads ``params`` weights of ``dtype_bytes`` each once and multiplies them
    by ``rows`` rows, on a machine reading ``read_gbs`` GB/s and computing ``gflops``."""
    if params <= 0 or dtype_bytes <= 0 or rows <= 0:
        raise SpecserveError(f"roofline: params {params}, dtype bytes {dtype_bytes} and rows "
                             f"{rows} must be positive")
    if read_gbs <= 0 or gflops <= 0:
        raise SpecserveError(f"roofline: measured rates must be positive (read {read_gbs} "
                             f"GB/s, {gflops} GFLOP/s)")
    nbytes = params * dtype_bytes
    flops = 2.0 * params * rows
    bw_ms = nbytes / (read_gbs * 1e9) * 1e3
    fl_ms = flops / (gflops * 1e9) * 1e3
    return Roofline(dtype=dtype, rows=rows, bytes_per_step=nbytes, flops_per_step=flops,
                    bandwidth_ms=round(bw_ms, 3), compute_ms=round(fl_ms, 3),
                    bound="compute" if fl_ms > bw_ms else "bandwidth",
                    rows_at_balance=round(rows * bw_ms / fl_ms, 1))


def params_read(tensors: dict[str, Any], tied: bool) -> int:
    """Weights a step reads, from a checkpoint's tensors (name -> ``.shape``): all of them
    less an untied input embedding (one row per token)."""
    total = 0
    for name, t in tensors.items():
        if not tied and name.endswith("embed_tokens.weight"):
            continue
        n = 1
        for d in t.shape:
            n *= int(d)
        total += n
    return total


def cpu_name(cpuinfo: str) -> str:
    """``model name`` of ``/proc/cpuinfo``'s text (else the machine type)."""
    for line in cpuinfo.splitlines():
        if line.startswith(("model name", "Model")) and ":" in line:
            return line.split(":", 1)[1].strip()
    import platform

    return platform.machine() or "unknown"


def siblings(cpus: set[int], lists: dict[int, str]) -> bool:
    """Whether two of ``cpus`` share a core, from each CPU's ``thread_siblings_list``
    (``"0,4"``, ``"0-1"``)."""
    for cpu in cpus:
        text = lists.get(cpu, str(cpu)).strip()
        mates: set[int] = set()
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            mates.update(range(int(lo), int(hi or lo) + 1))
        if len(mates & cpus) > 1:
            return True
    return False


def _topology(cpus: set[int]) -> dict[int, str]:
    out = {}
    for cpu in cpus:
        p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            out[cpu] = p.read_text()
        except OSError:
            pass
    return out


def _best_s(fn: Any, repeats: int) -> float:
    fn()  # warm-up: first touch, kernel selection
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _read_bytes_per_s(rows: int, cols: int, repeats: int) -> tuple[float, str]:
    """Bytes per second of the faster GEMV over a [rows, cols] float32 matrix, and its name."""
    import torch

    from specserve.runtime import cpu_linear
    from specserve.runtime.huge_pages import huge_empty

    w = huge_empty(rows * cols * 4).view(torch.float32).view(rows, cols).uniform_(-1, 1)
    x = torch.randn(1, cols)  # [1, cols]
    best, how = _best_s(lambda: torch.mv(w, x[0]), repeats), "torch.mv"
    width = cpu_linear.panel_width()
    if width and rows % (width * cpu_linear.panel_pad()) == 0 and cpu_linear.usable(x):
        panels = cpu_linear.to_panels(w, width, huge_empty(rows * cols * 4).view(
            torch.float32).view(-1, cols, width))  # [G, cols, width]
        own = _best_s(lambda: cpu_linear.rows_linear(x, w, None, panels), repeats)
        if own < best:
            best, how = own, "specserve's few-row kernel, panels"
    return w.numel() * 4 / best, how


def _flops_per_s(repeats: int) -> float:
    import torch

    a, b = torch.randn(GEMM_N, GEMM_N), torch.randn(GEMM_N, GEMM_N)
    return 2 * GEMM_N ** 3 / _best_s(lambda: torch.mm(a, b), repeats)


def measure(size_mb: int = DEFAULT_MB, repeats: int = 5) -> Machine:
    """Measure this machine on one torch thread (a second or two at 512 MB; the thread count
    is restored)."""
    if size_mb <= 0 or repeats <= 0:
        raise SpecserveError(f"roofline probe: size {size_mb} MB and repeats {repeats} must be "
                             "positive")
    import torch

    from specserve.runtime.huge_pages import enabled as huge_pages_enabled

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cols = 4096
    rows = max(1, size_mb * (1 << 20) // (4 * cols))
    try:
        with torch.inference_mode():
            (read, how), flops = _read_bytes_per_s(rows, cols, repeats), _flops_per_s(repeats)
    finally:
        torch.set_num_threads(threads)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    mb = rows * cols * 4 / (1 << 20)
    return Machine(cpu=cpu_name(info), cpus=len(cpus),
                   smt_siblings=siblings(cpus, _topology(cpus)),
                   read_gbs=round(read / 1e9, 2), gflops=round(flops / 1e9, 1),
                   method=f"one thread; read: float32 GEMV ({how}) over {mb:.0f} MB"
                          f"{' on huge pages' if huge_pages_enabled() else ''}, "
                          f"best of {repeats}; FMA: float32 GEMM {GEMM_N}^3, best of {repeats}")
