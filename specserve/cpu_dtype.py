"""The training and serving dtype this machine runs fast: bfloat16 or float32.

bfloat16 autocast is fast only where the CPU has bfloat16 instructions (AVX-512 BF16 or AMX,
which oneDNN uses); on an AVX2-only CPU (AMD Zen 3, most laptops and CI runners) oneDNN and
ATen emulate it and a bfloat16 matmul runs tens of times slower than the float32 one (measured
here under ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``: 14 ms against 0.35 ms for a
256 x 256 product; docs/results.md, "Training time and dtype"). So ``auto`` asks oneDNN whether it
has bfloat16 kernels (``torch.ops.mkldnn._is_mkldnn_bf16_supported``, the check PyTorch's own
inductor makes before it emits bf16 oneDNN ops), then times one small matmul in each dtype and
keeps bfloat16 only when both agree it is faster. CUDA: bfloat16 (every GPU this project
targets has bf16 tensor cores). The probe takes a few milliseconds and is cached per process.

Neutral module (docs/architecture.md): imports only ``errors``, the standard library, and torch
inside functions, so ``train/``, ``runtime/``, ``build/`` and the CLI can all use it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import Any

from specserve.errors import SpecserveError

REQUESTS = ("auto", "float32", "bfloat16")
PROBE_SIZE = 256  # a 256 x 256 matmul: ~0.1-0.4 ms in a fast dtype on one core
PROBE_BUDGET_S = 0.02  # per dtype (at least 3 runs); the minimum of the repeats is kept


@dataclass(frozen=True)
class CpuProbe:
    """What this CPU says about bfloat16: ATen's kernel level, oneDNN's bf16 support, and the
    best time of a ``PROBE_SIZE``-square matmul in each dtype (microseconds)."""

    cpu_capability: str
    onednn_bf16: bool
    float32_us: float
    bfloat16_us: float

    @property
    def bf16_fast(self) -> bool:
        return self.onednn_bf16 and self.bfloat16_us < self.float32_us


@dataclass(frozen=True)
class DtypeChoice:
    """The chosen dtype, what was asked for, why, and the evidence (``probe`` on CPU)."""

    dtype: str  # "float32" | "bfloat16"
    requested: str  # "auto" | "float32" | "bfloat16"
    device: str  # "cpu" | "cuda"
    reason: str
    probe: CpuProbe | None = None

    @property
    def bf16(self) -> bool:
        return self.dtype == "bfloat16"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _best_us(dtype: Any, size: int, budget_s: float) -> float:
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g).to(dtype)
    b = torch.randn(size, size, generator=g).to(dtype)
    a @ b  # warm-up: kernel selection, first-touch
    best, spent = float("inf"), 0.0
    for i in range(8):  # at least 3 timed runs: one slow sample on a busy machine decides nothing
        t = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
        if spent > budget_s and i >= 2:
            break
    return round(best * 1e6, 1)


def onednn_bf16() -> bool:
    """oneDNN has bfloat16 kernels on this CPU (AVX-512 BF16 / AMX; not under an AVX2 cap)."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available()
                    and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without these private ops
        return False


@functools.lru_cache(maxsize=1)
def probe_cpu() -> CpuProbe:
    """Measure once per process (a few ms; up to ~0.2 s where bf16 is emulated)."""
    import torch

    return CpuProbe(cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
                    onednn_bf16=onednn_bf16(),
                    float32_us=_best_us(torch.float32, PROBE_SIZE, PROBE_BUDGET_S),
                    bfloat16_us=_best_us(torch.bfloat16, PROBE_SIZE, PROBE_BUDGET_S))


def pick(probe: CpuProbe) -> tuple[str, str]:
    """(dtype, reason) for ``auto`` on a CPU with this probe (pure)."""
    why = (f"{probe.cpu_capability}, oneDNN bf16 {'yes' if probe.onednn_bf16 else 'no'}, "
           f"matmul {probe.float32_us:g} us float32 / {probe.bfloat16_us:g} us bfloat16")
    return ("bfloat16" if probe.bf16_fast else "float32"), why


def choose_dtype(requested: str = "auto", device: str = "cpu") -> DtypeChoice:
    """The dtype to train or serve in on ``device`` ("cpu", "cuda", "cuda:N"): ``requested``
    when it names one, else the fast one (:func:`pick`; CUDA: bfloat16)."""
    if requested not in REQUESTS:
        raise SpecserveError(f"--dtype {requested!r}: choose one of {', '.join(REQUESTS)}")
    kind = device.split(":")[0]
    if kind != "cpu":
        dtype = "bfloat16" if requested == "auto" else requested
        return DtypeChoice(dtype, requested, kind, "requested" if requested != "auto"
                           else f"{kind}: bf16 tensor cores")
    probe = probe_cpu()
    if requested != "auto":
        return DtypeChoice(requested, requested, kind, "requested", probe)
    dtype, why = pick(probe)
    return DtypeChoice(dtype, requested, kind, why, probe)
