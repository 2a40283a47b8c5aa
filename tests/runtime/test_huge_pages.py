"""Weights on transparent huge pages (``runtime/huge_pages.py``): a buffer starts on a 2 MiB
boundary of a region the kernel was advised to back with huge pages; parameters moved there
keep their values, shapes and ties; a model laid out for decoding has its linears there and
decodes the same tokens; ``SPECSERVE_HUGE_PAGES=off`` leaves ordinary memory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from specserve.runtime import huge_pages
from specserve.runtime.model import load_model

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise: Linux only")


def _advised(ptr: int) -> bool:
    """Whether the mapping holding address ``ptr`` carries MADV_HUGEPAGE ("hg" in its
    VmFlags, proc(5) /proc/PID/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0] if line else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= ptr < hi:
                for rest in lines[i + 1:]:
                    if rest.startswith("VmFlags:"):
                        return "hg" in rest.split()
    return False


@linux
def test_a_buffer_starts_on_a_huge_page_of_an_advised_region() -> None:
    buf = huge_pages.huge_empty(16 << 20)
    assert buf.numel() == 16 << 20 and buf.data_ptr() % huge_pages.HUGE == 0
    assert _advised(buf.data_ptr())
    small = huge_pages.huge_empty(1 << 20)  # below MIN_BYTES: ordinary memory
    assert not _advised(small.data_ptr())


@linux
def test_parameters_keep_values_shapes_and_ties() -> None:
    g = torch.Generator().manual_seed(0)
    a = nn.Parameter(torch.randn(1024, 2048, generator=g))  # 8 MiB
    b = nn.Parameter(torch.randn(513, 7, generator=g))
    want = (a.detach().clone(), b.detach().clone())
    moved = huge_pages.move_to_huge_pages([a, b, a])  # a twice: moved once
    assert moved >= a.numel() * 4 + b.numel() * 4
    assert torch.equal(a, want[0]) and torch.equal(b, want[1])
    assert a.shape == (1024, 2048) and b.shape == (513, 7) and b.data_ptr() % 64 == 0
    assert _advised(a.data_ptr()) and _advised(b.data_ptr())
    where = a.data_ptr()
    assert huge_pages.move_to_huge_pages([a, b]) == 0 and a.data_ptr() == where  # once only


@linux
def test_a_decoding_model_streams_from_huge_pages(tiny_ckpt: object,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model's linears (and the tied head) after decode_layout, MIN_BYTES lowered to
    its size: in an advised region; greedy logits equal to the model left on ordinary pages."""
    target = tiny_ckpt.target  # type: ignore[attr-defined]
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 1)
    on = load_model(target).decode_layout(multi_row_min=0)
    monkeypatch.setenv(huge_pages.ENV, "off")
    off = load_model(target).decode_layout(multi_row_min=0)
    w_on, w_off = on.layers[0].gate_up.weight, off.layers[0].gate_up.weight
    assert _advised(w_on.data_ptr()) and not _advised(w_off.data_ptr())
    assert on.lm_head.weight.data_ptr() == on.embed.weight.data_ptr() or not torch.equal(
        on.embed.weight, on.lm_head.weight)  # a tie stays a tie
    x = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.inference_mode():
        got = on.logits(on.run(x, on.new_cache(1, 16)).hidden)
        want = off.logits(off.run(x, off.new_cache(1, 16)).hidden)
    assert torch.equal(got, want)
