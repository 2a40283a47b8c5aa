"""A compact Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) with a static KV cache.

The forward follows the Llama architecture (Touvron et al. 2023, arXiv 2302.13971): RMSNorm,
rotary position embeddings (Su et al., arXiv 2104.09864; ``rope_theta``, and the "llama3" and
"linear" ``rope_scaling`` types), grouped-query attention (Ainslie et al., arXiv 2305.13245) and a
SwiGLU MLP. Qwen2's q/k/v biases and tied embeddings are read from the checkpoint. Qwen3 (arXiv
2505.09388; transformers' ``Qwen3Attention``) RMS-normalizes every query and key head over
``head_dim`` (its own ``q_norm``/``k_norm`` weights, eps ``rms_norm_eps``) before RoPE; its
``head_dim`` need not be ``hidden_size / num_heads``. Mistral's sliding window is not applied
(identical output while sequences are shorter than the window); Qwen2/Qwen3 configs that switch
one on are refused by :func:`specserve.checkpoint.check_family`.
In the spirit of gpt-fast: one small file, preallocated cache, fused q/k/v and gate/up matmuls.

One call, :meth:`Transformer.run` (``forward``: its hidden states alone), handles prefill,
single-token decode, a chain of K draft tokens and a whole Medusa tree: callers pass per-row
cache lengths, position ids and a boolean ``node_mask`` [T, T] saying which of the T new tokens
see each other (causal for a chain, the tree ancestor mask from
:func:`specserve.spec.tree.build_tree_buffers` for a tree). New K/V are written
at ``length[b] + t``; only ``KVCache.lengths`` decides what is valid, so rolling back is setting a
length, and a tree path is kept by :meth:`KVCache.keep_nodes`. A forward is pure apart from the
cache slots it writes: no hooks, no state on the model; what EAGLE-3 reads (the residual stream
at a few layers, Li et al. 2025) comes back in :class:`Forward` when the caller names the layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from specserve.checkpoint import load_state_dict
from specserve.errors import SpecserveError
from specserve.runtime import cpu_attention, cpu_forward, cpu_layer
from specserve.runtime.checkpoint import load_target_config
from specserve.runtime.cpu_linear import MAX_ROWS, MULTI_ROW_MIN, Linear, lay_out, linear
from specserve.runtime.cpu_linear import usable as rows_usable
from specserve.runtime.huge_pages import move_to_huge_pages
from specserve.runtime.kvcache import KVCache, RopeModel, StepInputs
from specserve.runtime.model_config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse rotary frequencies [D/2] (float32), with llama3/linear scaling applied."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    sc = dict(cfg.rope_scaling)
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), \
            float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen) - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(is_mid, mid, scaled)
    elif kind != "default":
        raise SpecserveError(f"rope_scaling type {kind!r} not supported (default, linear, llama3)")
    return inv.float()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class Attention(nn.Module):
    """Weights of one attention block (fused q/k/v; Qwen3's per-head q/k norms over
    ``head_dim``); the math is in :func:`_attention`."""

    def __init__(self, cfg: ModelConfig, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=qkv_bias)
        self.o = Linear(self.nh * self.hd, cfg.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., D] computed in float32, scaled by ``weight`` (broadcast against x) in
    the model dtype (as HF Llama/Qwen3)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        xf = x.float()  # training (an EAGLE-3 head): the same math without in-place ops
        return weight * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    if x.dtype == torch.float32:  # the same ops without the (no-op) casts: ~20% less time
        n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # [..., 1]
        out: torch.Tensor = weight * (x * n.square_().div_(x.shape[-1]).add_(eps).rsqrt_())
        return out
    xf = x.float()
    # mean(x^2) via vector_norm: one fast reduction (mean() costs several times more on CPU)
    inv = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1])
    y: torch.Tensor = weight * (xf * inv.add_(eps).rsqrt_()).to(x.dtype)
    return y


def _rms_norm(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """RMSNorm over the last dim with ``norm``'s weight and eps."""
    return _rms(x, norm.weight, norm.eps)


def _qk_norm(qk: torch.Tensor, a: Attention) -> torch.Tensor:
    """Qwen3's q_norm on each query head and k_norm on each key head, in one pass.

    qk: [B, T, nh+nkv, D] -> same shape; the weights stacked per head: [nh+nkv, D]."""
    assert a.q_norm is not None and a.k_norm is not None
    w = torch.cat([a.q_norm.weight.expand(a.nh, a.hd), a.k_norm.weight.expand(a.nkv, a.hd)])
    return _rms(qk, w, a.q_norm.eps)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, qkv_bias, o_bias)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=mlp_bias)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=mlp_bias)


def _attention(x: torch.Tensor, a: Attention, kbuf: torch.Tensor, vbuf: torch.Tensor,
               st: StepInputs) -> torch.Tensor:
    b, t, _ = x.shape  # x: [B, T, H]
    nh, nkv, hd = a.nh, a.nkv, a.hd
    qkv = linear(x, a.qkv).view(b, t, nh + 2 * nkv, hd)
    qk = qkv[:, :, :nh + nkv]  # [B, T, nh+nkv, D]: rotate q and k together
    if a.q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
        qk = _qk_norm(qk, a)
    # rotate_half(x) * sin == roll(x, D/2) * [-sin, sin] (st.sin carries the sign): 2 fewer ops
    qk = qk * st.cos + qk.roll(hd // 2, dims=-1) * st.sin
    q, k, v = qk[:, :, :nh].transpose(1, 2), qk[:, :, nh:], qkv[:, :, nh + nkv:]
    if isinstance(st.write, int):  # every row writes at the same offset
        kbuf[:, :, st.write:st.write + t] = k.transpose(1, 2)
        vbuf[:, :, st.write:st.write + t] = v.transpose(1, 2)
    else:
        rows = torch.arange(b, device=x.device)[:, None]
        kbuf[rows, :, st.write] = k
        vbuf[rows, :, st.write] = v
    # the CPU kernel (each row over its own keys), a long prefill by blocks, or SDPA
    return linear(cpu_forward.attend(q, kbuf, vbuf, st), a.o)  # attend: [B, T, nh D]


def _block(x: torch.Tensor, blk: Block, kbuf: torch.Tensor, vbuf: torch.Tensor,
           st: StepInputs) -> torch.Tensor:
    x = x + _attention(_rms_norm(x, blk.attn_norm), blk.attn, kbuf, vbuf, st)
    g, u = linear(_rms_norm(x, blk.mlp_norm), blk.gate_up).chunk(
        2, dim=-1)
    return x + linear(F.silu(g) * u, blk.down)


@dataclass(frozen=True)
class Forward:
    """What one :meth:`Transformer.run` returns: ``hidden [B, T, H]`` after the final norm, and
    ``aux [B, T, len(capture) * H]``, the residual stream before each captured layer
    (concatenated in ``capture`` order), or None when none was asked for."""

    hidden: torch.Tensor
    aux: torch.Tensor | None = None


class Transformer(RopeModel):
    """Llama-family causal LM: tokens + cache in, final-norm hidden states out."""

    inv_freq: torch.Tensor

    def __init__(self, cfg: ModelConfig, qkv_bias: bool = False, o_bias: bool = False,
                 mlp_bias: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            Block(cfg, qkv_bias, o_bias, mlp_bias) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fusable: bool | None = None  # every linear takes the few-row kernel (decode_layout)
        self._weights: cpu_layer.WeightTable | None = None  # one_call's, made once per layout

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def decode_layout(self, multi_row_limit_bytes: int = 1 << 30,
                      multi_row_min: int = MULTI_ROW_MIN) -> Transformer:
        """Lay the CPU linear weights out for decoding (same values; a no-op on other devices):
        see :func:`specserve.runtime.cpu_linear.lay_out`. An embedding tied to the LM head
        stays as it is (the few-row kernel still takes it). The weights then move to huge
        pages (:mod:`specserve.runtime.huge_pages`). Also builds or loads the CPU attention
        kernel (cpu_attention.py) before the first forward needs it."""
        if self.device.type == "cpu":
            cpu_attention.prepare()
            lins = [m for m in self.modules() if isinstance(m, Linear)]
            tied = [m for m in lins if m.weight is self.embed.weight]
            lay_out([m for m in lins if m not in tied], self.dtype, multi_row_limit_bytes,
                    multi_row_min, shared=tied)
            move_to_huge_pages([t for m in lins for t in (m.panels, m.weight)
                                if t is not None])  # every step streams them
            self._fusable = None
            self._weights = None
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> Transformer:
        """``.to()``, ``.float()``...: the cached weight addresses go with the old tensors."""
        self._fusable = None
        self._weights = None
        super()._apply(fn, recurse)
        return self

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.cfg, batch, max_len, self.dtype, self.device)

    def forward(self, tokens: torch.Tensor, cache: KVCache, lengths: torch.Tensor | None = None,
                depth: torch.Tensor | None = None,
                node_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [B, T, H] (after the final norm) of T new tokens per row: the
        ``hidden`` of :meth:`run` without captured layers."""
        return self.run(tokens, cache, lengths, depth, node_mask).hidden

    def run(self, tokens: torch.Tensor, cache: KVCache, lengths: torch.Tensor | None = None,
            depth: torch.Tensor | None = None, node_mask: torch.Tensor | None = None,
            capture: Sequence[int] = (), window: int = 0) -> Forward:
        """One forward of T new tokens per row.

        tokens: [B, T] int64, written at ``cache.lengths[b] + t``; lengths: [B] int64 copy of
        ``cache.lengths`` (made here when None); depth: [T] int64 position offset of each new
        token (None: 0..T-1, a chain; tree depths otherwise); node_mask: [T, T] bool (None:
        causal); capture: layer indices whose input residual stream goes into
        :attr:`Forward.aux` (``len(layers)``: the last layer's output, before the final norm;
        EAGLE-3). The cache is written but ``cache.lengths`` is left to the caller.
        """
        st = self.step_inputs(tokens, cache, lengths, depth, node_mask, window)
        x = F.embedding(tokens, self.embed.weight)  # [B, T, H]
        blocks = cast(Sequence[Block], self.layers)  # the ModuleList itself: no copy a forward
        if self._fused_rows(x, st):  # up to 16 rows: every layer in one C call
            if self._weights is None:
                self._weights = cpu_layer.weight_table(cpu_forward.layer_weights(blocks))
            return Forward(*cpu_forward.one_call(blocks, self.norm, self.cfg, x, cache, st,
                                                 capture, self._weights))
        if not self.cfg.qk_norm and cpu_layer.usable(x, self.cfg.head_dim):
            return Forward(*cpu_forward.rows(blocks, self.norm, self.cfg, x, cache, st, capture))
        aux: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            if i in capture:
                aux.append(x)
            x = _block(x, cast(Block, layer), cache.k[i], cache.v[i], st)
        if len(self.layers) in capture:
            aux.append(x)
        return Forward(_rms_norm(x, self.norm), torch.cat(aux, dim=-1) if aux else None)

    def _fused_rows(self, x: torch.Tensor, st: StepInputs) -> bool:
        """Whether this forward's layers take the C path (:mod:`specserve.runtime.cpu_layer`):
        the attention kernel attends (``st.rows``), every linear takes the few-row kernel for
        these B T rows, no Qwen3 q/k norms."""
        if st.rows is None or x.shape[0] * x.shape[1] > MAX_ROWS or self.cfg.qk_norm:
            return False
        if self._fusable is None:
            blocks = cast(Sequence[Block], self.layers)
            self._fusable = all(lin.few_rows for blk in blocks for lin in (
                blk.attn.qkv, blk.attn.o, blk.gate_up, blk.down))
        return self._fusable and cpu_layer.usable(x, self.cfg.head_dim) and rows_usable(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [..., V] from hidden states [..., H]."""
        return linear(hidden, self.lm_head).float()


_LAYER_MAP = {"input_layernorm.weight": "attn_norm.weight",
              "post_attention_layernorm.weight": "mlp_norm.weight",
              "self_attn.o_proj.weight": "attn.o.weight", "self_attn.o_proj.bias": "attn.o.bias",
              "mlp.down_proj.weight": "down.weight", "mlp.down_proj.bias": "down.bias"}


def _convert(sd: dict[str, torch.Tensor], cfg: ModelConfig, src: Path) -> dict[str, torch.Tensor]:
    """HF state dict -> ours (fused q/k/v and gate/up)."""
    def take(name: str) -> torch.Tensor:
        if name not in sd:
            raise SpecserveError(f"{src}: missing tensor {name!r}")
        return sd[name]

    out = {"embed.weight": take("model.embed_tokens.weight"),
           "norm.weight": take("model.norm.weight")}
    out["lm_head.weight"] = out["embed.weight"] if cfg.tie_word_embeddings or \
        "lm_head.weight" not in sd else sd["lm_head.weight"]
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        for hf, ours in _LAYER_MAP.items():
            if p + hf in sd or not hf.endswith("bias"):
                out[q + ours] = take(p + hf)
        out[q + "attn.qkv.weight"] = torch.cat(
            [take(f"{p}self_attn.{n}_proj.weight") for n in "qkv"])
        if cfg.qk_norm:
            for n in "qk":
                out[f"{q}attn.{n}_norm.weight"] = take(f"{p}self_attn.{n}_norm.weight")
        if f"{p}self_attn.q_proj.bias" in sd:
            out[q + "attn.qkv.bias"] = torch.cat(
                [take(f"{p}self_attn.{n}_proj.bias") for n in "qkv"])
        out[q + "gate_up.weight"] = torch.cat([take(p + "mlp.gate_proj.weight"),
                                               take(p + "mlp.up_proj.weight")])
        if p + "mlp.gate_proj.bias" in sd:
            out[q + "gate_up.bias"] = torch.cat([take(p + "mlp.gate_proj.bias"),
                                                 take(p + "mlp.up_proj.bias")])
    return out


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> Transformer:
    """Load a local HF Llama/Mistral/Qwen2/Qwen3 directory (safetensors) into a
    :class:`Transformer`."""
    d = Path(model_dir)
    cfg = ModelConfig.from_hf(load_target_config(d))
    sd = load_state_dict(d)
    l0 = "model.layers.0."
    model = Transformer(cfg, qkv_bias=l0 + "self_attn.q_proj.bias" in sd,
                        o_bias=l0 + "self_attn.o_proj.bias" in sd,
                        mlp_bias=l0 + "mlp.gate_proj.bias" in sd)
    ours = _convert(sd, cfg, d)
    expected = model.state_dict()
    for name, tensor in ours.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise SpecserveError(
                f"{d}: tensor for {name!r} has shape {list(tensor.shape)}, config.json implies "
                f"{list(expected[name].shape)}")
    model.load_state_dict(ours, strict=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = model.inv_freq.float()  # keep RoPE angles in float32
    return model.decode_layout()
