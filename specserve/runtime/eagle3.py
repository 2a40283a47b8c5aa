"""EAGLE-3 draft heads (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test"), in the portable Hugging Face layout that vLLM
(``vllm/model_executor/models/llama_eagle3.py``), SGLang and TensorRT-LLM's PyTorch backend
(``speculative_model_dir``) load: ``config.json`` with ``architectures:
["LlamaForCausalLMEagle3"]`` and a ``model.safetensors`` holding

- ``fc.weight`` [H, n*Ht]: fuses the target's residual stream before the layers
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (n of them, usually 3; vLLM's semantics:
  id i is the input of target layer i, ``num_hidden_layers`` the output of the last one);
- one decoder layer ``midlayer.*``: ``input_layernorm`` on the token embedding (the target's:
  the head has none of its own), ``hidden_norm`` on the feature, q/k/v over their concatenation
  [embedding, feature] (2H inputs), the feature as the residual, ``post_attention_layernorm``
  and the MLP;
- ``norm.weight``, ``lm_head.weight`` [draft_vocab, H] over a reduced draft vocabulary,
  ``d2t`` [draft_vocab] int64 (target id = draft id + d2t[draft id]) and ``t2d`` [vocab] bool;
  a head over the whole vocabulary has neither (vLLM 0.32 refuses a ``d2t`` then: its
  ``draft_id_to_target_id`` exists only when ``draft_vocab_size != vocab_size``).

The feature of position t is the fused target state; the next draft step's feature is the
head's own output before the final norm (``hidden_prenorm`` in vLLM), and a step at position t
pairs feature t with the embedding of token t + 1 and predicts token t + 2.
:func:`ttt_forward` is the training-time test: the same math over whole sequences, every step's
query attending to the step-0 keys up to its position and to its own earlier steps' keys
(tests/runtime/test_eagle3.py checks it against the cached inference path step by step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from specserve.errors import SpecserveError
from specserve.runtime.cpu_linear import Linear, lay_out, linear
from specserve.runtime.kvcache import KVCache, RopeModel, StepInputs
from specserve.runtime.model import (
    Attention,
    RMSNorm,
    _attention,
    _rms_norm,
    rope_inv_freq,
)
from specserve.runtime.model_config import ModelConfig

ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE12_ARCHITECTURES = ("LlamaForCausalLMEagle", "EAGLEModel", "EagleLlamaForCausalLM")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high target layers: vLLM's (2, L // 2, L - 3) from 6 layers on; for a
    smaller target the inputs of its last three layers (4 layers: 1, 2, 3; 0 = embeddings)."""
    if num_layers >= 6:
        return (2, num_layers // 2, num_layers - 3)
    return tuple(sorted({max(i, 0) for i in range(num_layers - 3, num_layers)}))


@dataclass(frozen=True)
class Eagle3Config:
    """The head's shape (its ``config.json``) and the target layers it reads."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple[tuple[str, Any], ...]
    max_position_embeddings: int
    vocab_size: int            # the target's
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab_size: int,
                   aux_layer_ids: tuple[int, ...] | None = None,
                   intermediate_size: int | None = None,
                   num_heads: int | None = None) -> Eagle3Config:
        """A head shaped like one layer of ``target``; a slimmer MLP (``intermediate_size``)
        or fewer attention heads (``num_heads``, as many KV heads) make each draft step
        cheaper where the target is shallow."""
        ids = aux_layer_ids or default_aux_layers(target.num_layers)
        nh = num_heads or target.num_heads
        nkv = target.num_kv_heads if num_heads is None else num_heads
        return cls(target.hidden_size, intermediate_size or target.intermediate_size,
                   nh, nkv, target.head_dim, target.rms_norm_eps,
                   target.rope_theta, target.rope_scaling, target.max_position_embeddings,
                   target.vocab_size, draft_vocab_size, target.hidden_size, tuple(ids))

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> Eagle3Config:
        arch = list(cfg.get("architectures") or [])
        if ARCHITECTURE not in arch:
            old = [a for a in arch if a in EAGLE12_ARCHITECTURES or "eagle" in a.lower()]
            what = f"an EAGLE-1/2 checkpoint ({old[0]})" if old else f"architectures {arch}"
            raise SpecserveError(f"{where}: {what}, not an EAGLE-3 head "
                                 f"(architectures must include {ARCHITECTURE})")
        if int(cfg.get("num_hidden_layers", 1)) != 1:
            raise SpecserveError(f"{where}: EAGLE-3 heads have one decoder layer, got "
                                 f"num_hidden_layers={cfg.get('num_hidden_layers')}")
        eagle = dict(cfg.get("eagle_config") or {})
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get(
            "eagle_aux_hidden_state_layer_ids")
        if not ids:
            raise SpecserveError(f"{where}: no eagle_config.eagle_aux_hidden_state_layer_ids "
                                 "(which target layers the head reads)")
        m = ModelConfig.from_hf({**cfg, "num_hidden_layers": 1})
        return cls(m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim,
                   m.rms_norm_eps, m.rope_theta, m.rope_scaling, m.max_position_embeddings,
                   m.vocab_size, int(cfg.get("draft_vocab_size") or m.vocab_size),
                   int(cfg.get("target_hidden_size") or m.hidden_size),
                   tuple(int(i) for i in ids))

    def to_hf(self, dtype: str = "float32") -> dict[str, Any]:
        """``config.json`` for vLLM / SGLang / TensorRT-LLM (Llama keys + the EAGLE-3 ones)."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURE], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "hidden_act": "silu",
            "tie_word_embeddings": False, "torch_dtype": dtype,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                             "use_aux_hidden_state": True},
        }
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out

    def model_config(self) -> ModelConfig:
        """As a one-layer :class:`ModelConfig` (KV cache shape, RoPE)."""
        return ModelConfig(self.vocab_size, self.hidden_size, self.intermediate_size, 1,
                           self.num_heads, self.num_kv_heads, self.head_dim, self.rms_norm_eps,
                           self.rope_theta, self.rope_scaling, self.max_position_embeddings,
                           False, "llama", None)

    def check_target(self, target: ModelConfig, where: str) -> None:
        """Refuse a head that does not fit ``target`` (one line each)."""
        if self.target_hidden_size != target.hidden_size:
            raise SpecserveError(f"{where}: the head reads hidden size {self.target_hidden_size}"
                                 f", the target has {target.hidden_size}")
        if self.hidden_size != target.hidden_size:
            raise SpecserveError(f"{where}: head hidden size {self.hidden_size} != the target's "
                                 f"{target.hidden_size} (it uses the target's embeddings)")
        if self.vocab_size != target.vocab_size:
            raise SpecserveError(f"{where}: head vocab_size {self.vocab_size} != the target's "
                                 f"{target.vocab_size}: draft and target vocabularies must match")
        bad = [i for i in self.aux_layer_ids if not 0 <= i <= target.num_layers]
        if bad:
            raise SpecserveError(f"{where}: target layer ids {bad} out of range for a "
                                 f"{target.num_layers}-layer target (0..{target.num_layers})")
        if self.draft_vocab_size > self.vocab_size:
            raise SpecserveError(f"{where}: draft_vocab_size {self.draft_vocab_size} > vocab_size "
                                 f"{self.vocab_size}")


class Eagle3Head(RopeModel):
    """The head's weights and its cached forward (one layer; the target's embedding)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg, mc = cfg, cfg.model_config()
        h, n_aux = cfg.hidden_size, len(cfg.aux_layer_ids)
        self.fc = Linear(n_aux * cfg.target_hidden_size, h, bias=False)
        self.embed_norm = RMSNorm(h, cfg.rms_norm_eps)       # midlayer.input_layernorm
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)      # midlayer.hidden_norm
        self.attn = Attention(replace(mc, hidden_size=2 * h), False, False)
        self.attn.o = Linear(cfg.num_heads * cfg.head_dim, h, bias=False)
        self.mlp_norm = RMSNorm(h, cfg.rms_norm_eps)         # post_attention_layernorm
        self.gate_up = Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = Linear(cfg.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(mc), persistent=False)
        self._rope = None
        self.embed_weight: torch.Tensor | None = None  # the target's (bind)
        self.d2t: torch.Tensor
        self.t2d: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def bind(self, embed_weight: torch.Tensor) -> None:
        """Use the target's token embedding [V, H]."""
        self.embed_weight = embed_weight

    def decode_layout(self) -> Eagle3Head:
        """The CPU decoding layout of its linears (as :meth:`Transformer.decode_layout`; same
        values; inference only, not for training)."""
        if self.device.type == "cpu":
            lay_out([m for m in self.modules() if isinstance(m, Linear)], self.dtype)
        return self

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.cfg.model_config(), batch, max_len, self.dtype, self.device)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Target states [..., n*Ht] -> features [..., H]."""
        return linear(aux, self.fc)

    def embed_and_norm(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """The layer's attention input [B, T, 2H]: [input_layernorm(embed), hidden_norm(feat)]."""
        assert self.embed_weight is not None, "Eagle3Head.bind(target embedding) first"
        e = F.embedding(tokens, self.embed_weight)  # [B, T, H]
        return torch.cat([_rms_norm(e, self.embed_norm), _rms_norm(feats, self.hidden_norm)], -1)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """x [.., H] after attention -> the layer output before the final norm (prenorm)."""
        g, u = linear(_rms_norm(x, self.mlp_norm), self.gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(g) * u, self.down)

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, cache: KVCache,
                lengths: torch.Tensor | None = None,
                step: StepInputs | None = None) -> torch.Tensor:
        """tokens [B, T], feats [B, T, H] at positions ``cache.lengths[b] + t`` (or where
        ``step``, e.g. :meth:`level_inputs`, puts them) -> the next features (prenorm)
        [B, T, H]; the cache is written, ``cache.lengths`` left to the caller (as
        :meth:`Transformer.forward`)."""
        st = step if step is not None else self.step_inputs(tokens, cache, lengths)
        x = feats + _attention(self.embed_and_norm(tokens, feats), self.attn, cache.k[0],
                               cache.v[0], st)
        return self.mlp(x)

    def draft_logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the draft vocabulary [..., Vd]."""
        return linear(_rms_norm(prenorm, self.norm), self.lm_head).float()

    def target_ids(self) -> torch.Tensor:
        """[Vd] int64: the target id of every draft id."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def to_target(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., Vd] -> [..., V] logits, -inf outside the draft vocabulary."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.cfg.vocab_size),
                                    float("-inf"))
        out[..., self.target_ids()] = draft_logits
        return out


def ttt_forward(head: Eagle3Head, aux: torch.Tensor, tokens: torch.Tensor,
                steps: int) -> list[torch.Tensor]:
    """The training-time test over whole sequences: draft-vocabulary logits of every step.

    aux [B, N, n*Ht]: the target's captured states at positions 0..N-1; tokens [B, N]. Step j
    (0-based) at index t pairs feature t (step 0: ``fuse(aux[t])``; later: step j-1's output
    at t) with token t + j + 1, sits at position t + j and predicts token t + j + 2 (the
    target's distribution at position t + j + 1); its query sees the step-0 keys 0..t and the
    keys of steps 1..j at t. Returns ``steps`` tensors [B, N, Vd]; index t of step j is only
    meaningful for t + j + 2 <= N (the caller masks the rest)."""
    b, n, _ = aux.shape
    a = head.attn
    nh, nkv, hd = a.nh, a.nkv, a.hd
    cos_t, sin_t = head.rope_tables(n + steps)
    pad = torch.zeros(b, steps, dtype=tokens.dtype, device=tokens.device)
    toks = torch.cat([tokens, pad], dim=1)  # [B, N+steps]: shifted tokens stay in range
    feats = head.fuse(aux)  # [B, N, H]
    causal = torch.ones(n, n, dtype=torch.bool, device=aux.device).tril()  # [N, N]
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: k, v [B, nkv, N, D]
    out: list[torch.Tensor] = []
    for j in range(steps):
        h = head.embed_and_norm(toks[:, j + 1:j + 1 + n], feats)  # [B, N, 2H]
        qkv = linear(h, a.qkv).view(b, n, nh + 2 * nkv, hd)
        cos, sin = cos_t[j:j + n][None, :, None], sin_t[j:j + n][None, :, None]
        qk = qkv[:, :, :nh + nkv]
        qk = qk * cos + qk.roll(hd // 2, dims=-1) * sin
        q = qk[:, :, :nh].transpose(1, 2)                     # [B, nh, N, D]
        k, v = qk[:, :, nh:].transpose(1, 2), qkv[:, :, nh + nkv:].transpose(1, 2)
        keys.append((k, v))
        rep = nh // nkv
        k0, v0 = (x.repeat_interleave(rep, dim=1) for x in keys[0])  # [B, nh, N, D]
        s0 = (q @ k0.transpose(-1, -2)) / math.sqrt(hd)       # [B, nh, N, N]
        s0 = s0.masked_fill(~causal, float("-inf"))
        diag = [(q * ki.repeat_interleave(rep, dim=1)).sum(-1, keepdim=True) / math.sqrt(hd)
                for ki, _ in keys[1:]]                        # each [B, nh, N, 1]
        p = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1)
        att = p[..., :n] @ v0                                 # [B, nh, N, D]
        for i, (_, vi) in enumerate(keys[1:]):
            att = att + p[..., n + i:n + i + 1] * vi.repeat_interleave(rep, dim=1)
        x = feats + linear(att.transpose(1, 2).reshape(b, n, nh * hd), a.o)
        feats = head.mlp(x)                                   # [B, N, H]: step j's output
        out.append(head.draft_logits(feats))
    return out
