"""A :class:`~specserve.runtime.model.Transformer`'s layers on the CPU kernels, the two paths
:meth:`~specserve.runtime.model.Transformer.run` takes before torch's own ops: for up to 16 rows
every layer in one C call (:func:`one_call`, :func:`specserve.runtime.cpu_layer.layers`); for
more (prefills, batched verify steps) ATen's linears and attention with the C element-wise
kernels between them (:func:`rows`). The math is the reference forward's (Llama: Touvron et al.
2023; ``model._block``): equal within float32 rounding (``tests/runtime/test_cpu_layer.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from specserve.runtime import cpu_attention, cpu_layer, prefill_attention
from specserve.runtime.cpu_linear import Linear, linear
from specserve.runtime.kvcache import KVCache, StepInputs
from specserve.runtime.model_config import ModelConfig

Out = tuple[torch.Tensor, torch.Tensor | None]  # hidden [B, T, H], captured layers or None


class Weighted(Protocol):
    """A norm as read here (``model.RMSNorm``)."""

    @property
    def weight(self) -> torch.Tensor: ...


class AttentionLike(Protocol):
    @property
    def qkv(self) -> Linear: ...
    @property
    def o(self) -> Linear: ...


class BlockLike(Protocol):
    """One decoder layer's modules as these paths read them (``model.Block``: the model
    imports this module, so the type is structural)."""

    @property
    def attn_norm(self) -> Weighted: ...
    @property
    def attn(self) -> AttentionLike: ...
    @property
    def mlp_norm(self) -> Weighted: ...
    @property
    def gate_up(self) -> Linear: ...
    @property
    def down(self) -> Linear: ...


def one_call(layers: Sequence[BlockLike], norm: Weighted, cfg: ModelConfig, x: torch.Tensor,
             cache: KVCache, st: StepInputs, capture: Sequence[int],
             weights: cpu_layer.WeightTable | None = None) -> Out:
    """Every layer of x [B, T, H] in one C call: per layer RMSNorm (fused with the last
    residual add), q/k/v, RoPE and the KV write, attention, o, add + RMSNorm, gate/up,
    SiLU-and-multiply, down; then the final ``norm``. ``weights``: the layers'
    :func:`~specserve.runtime.cpu_layer.weight_table` (made here when None)."""
    b, t, h = x.shape
    assert st.rows is not None
    x = x.reshape(b * t, h).contiguous()  # [M, H], the residual stream (updated in place)
    n = len(layers)
    taken = sorted({i for i in capture if 0 <= i <= n})
    cols = [taken.index(i) if i in taken else -1 for i in range(n + 1)]
    table = cpu_layer.layer_table(weights or cpu_layer.weight_table(layer_weights(layers)),
                                  cache.k, cache.v)
    shape = cpu_layer.Shape(b, t, h, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                            cfg.intermediate_size, cfg.rms_norm_eps)
    hidden, aux = cpu_layer.layers(table, norm.weight, x, shape, (st.cos, st.sin),
                                   slots(st.write, b, t), st.rows, cols)
    return hidden.view(b, t, h), None if aux is None else aux.view(b, t, -1)


def rows(layers: Sequence[BlockLike], norm: Weighted, cfg: ModelConfig, x: torch.Tensor,
         cache: KVCache, st: StepInputs, capture: Sequence[int]) -> Out:
    """The layers of a forward :func:`one_call` does not take: the linears and the attention as
    the reference forward runs them, the element-wise parts in C (~10% of a 256-token prefill
    in ATen)."""
    b, t, h = x.shape
    nh, nkv, hd, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    x = x.reshape(b * t, h).contiguous()  # [M, H], the residual stream (updated in place)
    where = slots(st.write, b, t)
    aux: list[torch.Tensor] = []
    y = cpu_layer.rms(x, layers[0].attn_norm.weight, eps) if layers else x
    for i, blk in enumerate(layers):
        if i in capture:
            aux.append(x.clone())
        qkv = linear(y, blk.attn.qkv)  # [M, (nh + 2 nkv) D]
        cpu_layer.rope_kv(qkv, (st.cos, st.sin), cache.k[i], cache.v[i], where, t, nh, nkv)
        q = qkv.view(b, t, nh + 2 * nkv, hd)[:, :, :nh].transpose(1, 2)  # [B, nh, T, D]
        att = attend(q, cache.k[i], cache.v[i], st).reshape(b * t, nh * hd)
        y = cpu_layer.add_rms(x, linear(att, blk.attn.o), blk.mlp_norm.weight, eps)
        act = cpu_layer.silu_mul(linear(y, blk.gate_up))  # [M, I]
        nxt = layers[i + 1].attn_norm.weight if i + 1 < len(layers) else norm.weight
        y = cpu_layer.add_rms(x, linear(act, blk.down), nxt, eps)
    if len(layers) in capture:
        aux.append(x.clone())
    hidden = y if layers else cpu_layer.rms(x, norm.weight, eps)
    return hidden.view(b, t, h), torch.cat(aux, dim=-1).view(b, t, -1) if aux else None


def attend(q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor,
           st: StepInputs) -> torch.Tensor:
    """Attention of q [B, nh, T, D] over the cache (new keys already written): [B, T, nh D],
    by the CPU kernel where ``st.rows`` is set, a long prefill's by query blocks
    (:mod:`specserve.runtime.prefill_attention`), else SDPA with ``st.mask``."""
    if st.rows is not None:
        return cpu_attention.attend(q, kbuf, vbuf, st.rows)
    if st.past is not None and prefill_attention.usable(q):
        out = prefill_attention.attend(q, kbuf, vbuf, st.past)  # [B, nh, T, D]
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)
    out = F.scaled_dot_product_attention(
        q, kbuf[:, :, st.start:st.span], vbuf[:, :, st.start:st.span], attn_mask=st.mask,
        enable_gqa=q.shape[1] != kbuf.shape[1])  # [B, nh, T, D]
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def slots(write: torch.Tensor | int, b: int, t: int) -> torch.Tensor:
    """Each of the B T new rows' cache slot (int64 [B T]): ``write`` + t for every row, or
    its [B, T] slots."""
    if isinstance(write, int):
        return (torch.arange(t) + write).repeat(b)
    return write.reshape(-1).to(torch.int64).contiguous()


def layer_weights(layers: Sequence[BlockLike]) -> list[cpu_layer.LayerWeights]:
    """Each layer's tensors for :func:`specserve.runtime.cpu_layer.layer_table`."""
    return [cpu_layer.LayerWeights(
        blk.attn_norm.weight, blk.attn.qkv.weight, blk.attn.qkv.bias, blk.attn.o.weight,
        blk.attn.o.bias, blk.mlp_norm.weight, blk.gate_up.weight, blk.gate_up.bias,
        blk.down.weight, blk.down.bias, blk.attn.qkv.panels, blk.attn.o.panels,
        blk.gate_up.panels, blk.down.panels) for blk in layers]
