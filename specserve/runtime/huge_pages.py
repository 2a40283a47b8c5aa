"""CPU weights on transparent huge pages: one 2 MiB-aligned anonymous mapping advised
``MADV_HUGEPAGE`` (madvise(2); the kernel's "Transparent Hugepage Support" admin guide: with
``enabled`` set to ``madvise``, the common default, only such regions get huge pages).

A decode step streams every weight once. On 4 KiB pages that is a page walk every 4 KiB, and
each of the ~120 weights of a small model starts its stream on cold TLB entries: on the real
model (SmolLM2-135M, 538 MB, float32) one row through every linear read 12.4 GB/s on 4 KiB
pages and 14.8 GB/s on 2 MiB pages, one thread, same kernel (2026-12-07, 2-core Xeon). The
probe of ``doctor --roofline`` reads from huge pages too, so a share of it compares like
with like.

:func:`huge_empty` gives such a buffer (falling back to ``torch.empty`` off Linux, below
:data:`MIN_BYTES`, or with ``SPECSERVE_HUGE_PAGES=off``); :func:`move_to_huge_pages` copies
parameters into one and points them at it (same values, same shapes and strides).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Sequence

import torch

ENV = "SPECSERVE_HUGE_PAGES"  # "off" (or 0/false): ordinary pages
HUGE = 2 << 20  # x86-64's transparent huge page
MIN_BYTES = 8 << 20  # smaller: not worth a mapping of its own
MADV_HUGEPAGE = 14  # linux/mman.h
ALIGN = 64  # bytes: each tensor starts on a cache line
_OFF = ("off", "0", "false")


def enabled() -> bool:
    """Linux, and not switched off by :data:`ENV`."""
    return sys.platform.startswith("linux") and os.environ.get(ENV, "").lower() not in _OFF


def huge_empty(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 CPU tensor of ``nbytes`` starting on a 2 MiB boundary of a
    mapping advised for huge pages (the tensor keeps the mapping alive); a plain
    ``torch.empty`` where :func:`enabled` is false or ``nbytes`` < :data:`MIN_BYTES`."""
    if not enabled() or nbytes < MIN_BYTES:
        return torch.empty(nbytes, dtype=torch.uint8)
    size = (nbytes + HUGE - 1) // HUGE * HUGE + HUGE  # room to align the start
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    flat = torch.frombuffer(region, dtype=torch.uint8)  # [size]
    skip = -flat.data_ptr() % HUGE
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.madvise(ctypes.c_void_p(flat.data_ptr() + skip), ctypes.c_size_t(size - skip),
                 MADV_HUGEPAGE)  # advice only: a kernel without THP ignores or refuses it
    return flat[skip:skip + nbytes]


def move_to_huge_pages(params: Sequence[torch.Tensor]) -> int:
    """Copy the dense CPU tensors among ``params`` (each once; prepacked oneDNN tensors and
    other devices are left) into one huge-page buffer and set each one's ``.data`` to its copy;
    returns the bytes moved (0 when :func:`enabled` is false or there is too little)."""
    seen: set[int] = set()
    todo = []
    for p in params:
        if (id(p) in seen or p.device.type != "cpu" or p.is_mkldnn or not p.is_contiguous()
                or getattr(p, "on_huge_pages", False)):  # moved already: a second layout
            continue
        seen.add(id(p))
        todo.append(p)
    offsets, total = [], 0
    for p in todo:
        offsets.append(total)
        total += (p.numel() * p.element_size() + ALIGN - 1) // ALIGN * ALIGN
    if not enabled() or total < MIN_BYTES:
        return 0
    arena = huge_empty(total)
    for p, off in zip(todo, offsets, strict=True):
        n = p.numel() * p.element_size()
        dst = arena[off:off + n].view(p.dtype).view(p.shape)
        dst.copy_(p.detach())
        p.data = dst
        p.on_huge_pages = True  # type: ignore[attr-defined]
    return total
