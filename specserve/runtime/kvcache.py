"""What one forward of a transformer with a static KV cache needs besides its weights: the
cache (:class:`KVCache`: per-layer K/V buffers [B, n_kv, S_max, D] and per-row lengths, row views
for in-flight batching), the attention mask of new tokens over it (:func:`step_mask`: chains and
tree attention, Medusa, Cai et al. 2024), and the RoPE rows and write slots of a forward
(:class:`RopeModel`, shared by :class:`~specserve.runtime.model.Transformer` and the EAGLE-3
head). Rotary embeddings: Su et al. 2021, "RoFormer".

The CPU buffers are anonymous memory maps (:func:`lazy_zeros`): zero pages the kernel maps only
when first written ("MAP_ANONYMOUS: the mapping is not backed by any file; its contents are
initialized to zero", mmap(2)), so a cache sized for the model's whole context (SmolLM2: 8,192
positions x 16 rows, 6 GB in float32) costs resident memory only for the positions rows reach;
``torch.zeros`` wrote every page at load (7 GB per served model).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import torch
from torch import nn

from specserve.errors import SpecserveError
from specserve.runtime import cpu_attention
from specserve.runtime.cpu_attention import KeyRows, key_rows
from specserve.runtime.kv_pool import Plane
from specserve.runtime.model_config import ModelConfig

LAZY_MIN_BYTES = 1 << 20  # smaller buffers: torch.zeros (a map per buffer is not worth it)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
               ) -> torch.Tensor:
    """A zero tensor whose CPU pages become resident only when written (an anonymous memory
    map, which the tensor keeps alive); elsewhere, or below ``LAZY_MIN_BYTES``, ``torch.zeros``."""
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < LAZY_MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    private = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(private, dtype=dtype).view(shape)


class KVCache:
    """Static per-layer K/V buffers [B, n_kv, S_max, D] and per-row valid lengths."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [lazy_zeros(shape, dtype, device) for _ in range(cfg.num_layers)]
        self.v = [lazy_zeros(shape, dtype, device) for _ in range(cfg.num_layers)]
        self.batch, self.max_len = batch, max_len
        self.lengths: list[int] = [0] * batch

    def view(self, start: int, stop: int) -> KVCache:
        """Rows ``start..stop-1`` as a cache of their own that shares this one's storage
        (tensor slices are views: a forward on it writes here). Lengths are the caller's."""
        v = KVCache.__new__(KVCache)
        v.k = [buf[start:stop] for buf in self.k]
        v.v = [buf[start:stop] for buf in self.v]
        v.batch, v.max_len = stop - start, self.max_len
        v.lengths = [0] * (stop - start)
        return v

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``src`` into row ``dst`` (slot reuse)."""
        for buf in (*self.k, *self.v):
            buf[dst, :, :length] = buf[src, :, :length]

    def plane(self, name: str) -> Plane:
        """What one position of a row is in a prefix cache (:mod:`specserve.runtime.kv_pool`):
        K and V of every layer, [2 * layers, n_kv, D]."""
        k = self.k[0]
        return Plane(name, (2 * len(self.k), k.shape[1], k.shape[3]), k.dtype)

    def export(self, row: int, positions: torch.Tensor) -> torch.Tensor:
        """Row ``row``'s K/V at ``positions`` [N] as [N, 2 * layers, n_kv, D] (a copy)."""
        x = torch.stack([buf[row][:, positions] for buf in (*self.k, *self.v)])  # [2L, kv, N, D]
        return x.permute(2, 0, 1, 3).contiguous()

    def restore(self, row: int, data: torch.Tensor, at: int = 0) -> None:
        """Positions at..at+N-1 of row ``row`` take ``data`` [N, 2 * layers, n_kv, D] (an
        :meth:`export`, from a prefix cache)."""
        x = data.permute(1, 2, 0, 3)  # [2L, kv, N, D]
        n = data.shape[0]
        for i, buf in enumerate((*self.k, *self.v)):
            buf[row, :, at:at + n] = x[i]

    def keep_nodes(self, row: int, nodes: list[int]) -> None:
        """Move the K/V of tree nodes ``nodes`` (written at length+node) to length+0..n-1."""
        if nodes == list(range(len(nodes))):
            return
        base = self.lengths[row]
        src = torch.tensor([base + n for n in nodes], device=self.k[0].device)
        dst = torch.arange(base, base + len(nodes), device=src.device)
        for buf in (*self.k, *self.v):
            buf[row, :, dst] = buf[row, :, src]


def step_mask(lengths: torch.Tensor, node_mask: torch.Tensor, span: int) -> torch.Tensor:
    """Attention mask [B, 1, T, span] for T new tokens whose keys sit at ``lengths[b] + w``.

    lengths: [B] int64 valid cache length per row; node_mask: [T, W] bool (new i sees slot w
    after the valid length; W = T for one forward's own tokens, more when earlier forwards of a
    draft tree wrote slots there too). Keys before ``lengths[b]`` are all visible.
    """
    w = node_mask.shape[1]
    keys = torch.arange(span, device=lengths.device)
    rel = keys[None, :] - lengths[:, None]  # [B, S]
    past = rel < 0
    in_new = (rel >= 0) & (rel < w)
    new = node_mask[:, rel.clamp(0, w - 1)].permute(1, 0, 2)  # [B, T, S]
    return (past[:, None, :] | (in_new[:, None, :] & new))[:, None]


@dataclass
class StepInputs:
    """Per-forward inputs shared by all layers (:meth:`RopeModel.step_inputs` builds them)."""

    cos: torch.Tensor  # [B or 1, T, 1, D] in the model dtype
    sin: torch.Tensor  # [B or 1, T, 1, D], signed: [-sin, sin]
    write: torch.Tensor | int  # common write offset, or [B, T] absolute slots
    span: int  # keys attended: cache[:, :, start:span]
    mask: torch.Tensor | None  # [B, 1, T, span - start] bool, None when every key is visible
    start: int = 0  # keys before it are not attended (a windowed draft: Transformer.run)
    rows: KeyRows | None = None  # set: the CPU kernel attends (runtime/cpu_attention.py), no mask
    # set: every row's new token i sees keys 0 .. past + i, what ``mask`` says (a chain at one
    # offset: a prefill); long ones take runtime/prefill_attention.py
    past: int | None = None


class RopeModel(nn.Module):
    """What a transformer with a RoPE KV cache shares (the target and draft LMs, an EAGLE-3
    head): ``inv_freq``, ``_rope``, ``dtype`` and ``device`` come from the subclass."""

    inv_freq: torch.Tensor
    _rope: tuple[torch.Tensor, torch.Tensor] | None

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [>= n, D] in the model dtype for positions 0.. (cached, grown on
        demand); the sin table is ``[-sin, sin]`` so that rotate_half is a roll."""
        tab = self._rope
        if tab is None or tab[0].shape[0] < n or tab[0].dtype != self.dtype \
                or tab[0].device != self.device:
            size = max(n, 2 * (tab[0].shape[0] if tab is not None else 1024))
            ang = torch.arange(size, device=self.device).float()[:, None] * self.inv_freq
            sin = ang.sin()
            tab = self._rope = (torch.cat([ang, ang], dim=-1).cos().to(self.dtype),  # [S, D]
                                torch.cat([-sin, sin], dim=-1).to(self.dtype))
        return tab

    def step_inputs(self, tokens: torch.Tensor, cache: KVCache,
                    lengths: torch.Tensor | None = None, depth: torch.Tensor | None = None,
                    node_mask: torch.Tensor | None = None, window: int = 0) -> StepInputs:
        """RoPE rows, cache write slots and the attention mask of one forward (the arguments
        of :meth:`Transformer.run`), shared by all its layers. ``window`` > 0: keys before
        the shortest row's last ``window`` positions are not attended."""
        b, t = tokens.shape
        lens = cache.lengths
        span = max(lens) + t
        if span > cache.max_len:
            raise SpecserveError(f"sequence length {span} exceeds the KV cache ({cache.max_len})")
        uniform = all(x == lens[0] for x in lens)
        cos_t, sin_t = self.rope_tables(span)
        causal = uniform and depth is None and node_mask is None  # a chain at one offset
        if lengths is None and not (causal or (uniform and depth is None and t == 1)):
            lengths = torch.tensor(lens, device=tokens.device)
        if uniform and depth is None:  # positions L..L+T-1 for every row: views, no gather
            cos, sin = cos_t[lens[0]:span][None, :, None], sin_t[lens[0]:span][None, :, None]
        else:
            assert lengths is not None
            off = depth if depth is not None else torch.arange(t, device=tokens.device)
            pos = lengths[:, None] + off[None, :]  # [B, T]
            cos, sin = cos_t[pos][:, :, None], sin_t[pos][:, :, None]  # [B, T, 1, D]
        write: torch.Tensor | int = lens[0]
        if not uniform:
            assert lengths is not None
            write = lengths[:, None] + torch.arange(t, device=tokens.device)  # [B, T]
        start = max(0, min(lens) - window) if window > 0 else 0
        if cpu_attention.usable(self.dtype, tokens.device, t):  # each row's own keys, no mask
            node = node_mask if node_mask is not None else torch.ones(
                t, t, dtype=torch.bool).tril()
            return StepInputs(cos, sin, write, span, None, start, key_rows(lens, start, node))
        mask = None
        if causal and t > 1:  # new token i sees keys 0..L+i: one op instead of step_mask
            mask = torch.ones(t, span, dtype=torch.bool, device=tokens.device).tril_(lens[0])
            mask = mask[None, None]  # [1, 1, T, span]
        elif not (t == 1 and uniform):
            assert lengths is not None
            if node_mask is None:
                node_mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
            mask = step_mask(lengths, node_mask, span)
        if start and mask is not None:
            mask = mask[..., start:]
        past = lens[0] if causal and t > 1 and not start else None
        return StepInputs(cos, sin, write, span, mask, start, past=past)

    def level_inputs(self, cache: KVCache, pos: int, first_slot: int,
                     visible: torch.Tensor) -> StepInputs:
        """One level of a draft tree (:class:`specserve.spec.tree.TreeLevel`): T new tokens, all
        at position ``cache.lengths[b] + pos``, written at slots ``cache.lengths[b] +
        first_slot + t``, seeing every valid key and the tree slots ``visible [T, W]`` marks."""
        t, w = visible.shape
        lens = cache.lengths
        span = max(lens) + w
        if span > cache.max_len:
            raise SpecserveError(f"sequence length {span} exceeds the KV cache ({cache.max_len})")
        cos_t, sin_t = self.rope_tables(span)
        dev, n = cos_t.device, lens[0]
        rows = key_rows(lens, 0, visible) if cpu_attention.usable(self.dtype, dev, t) else None
        if all(x == n for x in lens):  # one offset: views and one mask for the batch
            cos, sin = cos_t[n + pos:n + pos + 1][None, :, None], \
                sin_t[n + pos:n + pos + 1][None, :, None]  # [1, 1, 1, D]
            mask = None  # every key visible (a chain of inner nodes: a tree's spine)
            if rows is None and not bool(visible.all()):
                past = torch.ones(t, n, dtype=torch.bool, device=dev)
                mask = torch.cat([past, visible.to(dev)], dim=1)[None, None]  # [1, 1, T, span]
            return StepInputs(cos, sin, n + first_slot, span, mask, rows=rows)
        lengths = torch.tensor(lens, device=dev)  # [B]
        at = lengths + pos  # [B]
        cos, sin = cos_t[at][:, None, None], sin_t[at][:, None, None]  # [B, 1, 1, D]
        write = lengths[:, None] + first_slot + torch.arange(t, device=dev)  # [B, T]
        mask = None if rows is not None else step_mask(lengths, visible.to(dev), span)
        return StepInputs(cos, sin, write, span, mask, rows=rows)
