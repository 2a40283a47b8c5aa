"""The shape and numerics of a Llama-family checkpoint (:class:`ModelConfig`, read from its
Hugging Face ``config.json``; field names follow transformers' ``LlamaConfig`` / ``Qwen3Config``),
torch-free: the KV cache (:mod:`specserve.runtime.kvcache`) and the model
(:mod:`specserve.runtime.model`) are both built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QK_NORM_TYPES = ("qwen3",)  # families with per-head q/k RMSNorm (``self_attn.q_norm/k_norm``)


@dataclass(frozen=True)
class ModelConfig:
    """The shape and numerics of a Llama-family checkpoint (from its ``config.json``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple[tuple[str, Any], ...]
    max_position_embeddings: int
    tie_word_embeddings: bool
    model_type: str
    eos_token_id: int | None
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or {})
        scaling.update({k: v for k, v in rope.items() if k != "rope_theta"})
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        heads = int(cfg["num_attention_heads"])
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=tuple(sorted((str(k), v) for k, v in scaling.items()
                                      if not isinstance(v, (dict, list)))),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            model_type=str(cfg.get("model_type")),
            eos_token_id=int(eos[0]) if isinstance(eos, list) and eos else
            (int(eos) if isinstance(eos, int) else None),
            qk_norm=cfg.get("model_type") in QK_NORM_TYPES,
        )
