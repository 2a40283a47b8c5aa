"""The portable EAGLE-3 directory (``config.json`` + ``model.safetensors``) that vLLM
(``vllm/model_executor/models/llama_eagle3.py``: ``midlayer.*`` mapped to ``layers.0.*``, ``d2t``
renamed ``draft_id_to_target_id``, ``t2d`` skipped), SGLang (its exporter checks ``fc.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``) and TensorRT-LLM's PyTorch backend
(``speculative_model_dir``) read; :class:`~specserve.runtime.eagle3.Eagle3Head` in and out.
Weights through safetensors only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specserve.errors import SpecserveError
from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head
from specserve.runtime.model_config import ModelConfig

WEIGHTS = "model.safetensors"

def _hf_names(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """Our weights under the portable names (q/k/v and gate/up split as HF keeps them)."""
    c, a = head.cfg, head.attn
    q, k, v = a.qkv.weight.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                                  c.num_kv_heads * c.head_dim])
    gate, up = head.gate_up.weight.chunk(2)
    m = "midlayer."
    return {"fc.weight": head.fc.weight, m + "input_layernorm.weight": head.embed_norm.weight,
            m + "hidden_norm.weight": head.hidden_norm.weight,
            m + "self_attn.q_proj.weight": q, m + "self_attn.k_proj.weight": k,
            m + "self_attn.v_proj.weight": v, m + "self_attn.o_proj.weight": a.o.weight,
            m + "post_attention_layernorm.weight": head.mlp_norm.weight,
            m + "mlp.gate_proj.weight": gate, m + "mlp.up_proj.weight": up,
            m + "mlp.down_proj.weight": head.down.weight, "norm.weight": head.norm.weight,
            "lm_head.weight": head.lm_head.weight, "d2t": head.d2t, "t2d": head.t2d}


REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight")
MAPS = ("d2t", "t2d")  # required when draft_vocab_size < vocab_size


def save_eagle3(head: Eagle3Head, out_dir: str | Path, extra: dict[str, Any] | None = None
                ) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into ``out_dir`` (created)."""
    from safetensors.torch import save_file

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    dtype = str(head.dtype).removeprefix("torch.")
    cfg = {**head.cfg.to_hf(dtype), **(extra or {})}
    tensors = {k: t.detach().contiguous().cpu() for k, t in _hf_names(head).items()}
    if head.cfg.draft_vocab_size == head.cfg.vocab_size:
        if bool(head.d2t.any()):
            raise SpecserveError("eagle3: a head over the whole vocabulary must map ids to "
                                 "themselves (d2t all zero)")
        for k in MAPS:
            del tensors[k]
    save_file(tensors, str(d / WEIGHTS), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return d


def read_eagle3_config(head_dir: str | Path) -> Eagle3Config:
    d = Path(head_dir)
    p = d / "config.json"
    if not p.is_file():
        raise SpecserveError(f"{d}: no config.json (not an EAGLE-3 head directory)")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise SpecserveError(f"{p}: not JSON ({e.msg})") from None
    return Eagle3Config.from_hf(raw, str(p))


def load_eagle3(head_dir: str | Path, target: ModelConfig, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Eagle3Head:
    """Read and check a portable head against ``target``; weights via safetensors only."""
    from safetensors.torch import load_file

    from specserve.checkpoint import read_safetensors_header

    d = Path(head_dir)
    cfg = read_eagle3_config(d)
    cfg.check_target(target, str(d / "config.json"))
    w = d / WEIGHTS
    if not w.is_file():
        raise SpecserveError(f"{d}: no {WEIGHTS}")
    names = read_safetensors_header(w)
    need = REQUIRED + (MAPS if cfg.draft_vocab_size < cfg.vocab_size else ())
    missing = [k for k in need if k not in names]
    if missing:
        raise SpecserveError(f"{w}: missing {', '.join(missing)} (an EAGLE-3 head with "
                             f"draft_vocab_size {cfg.draft_vocab_size} of {cfg.vocab_size} "
                             f"needs {', '.join(need)})")
    sd = load_file(str(w))
    head = Eagle3Head(cfg)
    ours = {k: t for k, t in _hf_names(head).items() if k in need or k not in MAPS}
    for k, t in ours.items():
        if k not in sd:
            raise SpecserveError(f"{w}: missing tensor {k}")
        if tuple(sd[k].shape) != tuple(t.shape):
            raise SpecserveError(f"{w}: {k} has shape {tuple(sd[k].shape)}, the config says "
                                 f"{tuple(t.shape)}")
    with torch.no_grad():
        c = cfg
        head.attn.qkv.weight.copy_(torch.cat([sd["midlayer.self_attn.q_proj.weight"],
                                              sd["midlayer.self_attn.k_proj.weight"],
                                              sd["midlayer.self_attn.v_proj.weight"]]))
        head.gate_up.weight.copy_(torch.cat([sd["midlayer.mlp.gate_proj.weight"],
                                             sd["midlayer.mlp.up_proj.weight"]]))
        for k, t in ours.items():
            if "q_proj" in k or "k_proj" in k or "v_proj" in k or "gate_proj" in k \
                    or "up_proj" in k:
                continue
            t.copy_(sd[k])
    ids = head.target_ids()
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
        raise SpecserveError(f"{w}: d2t maps draft ids outside the target vocabulary")
    return head.to(device=device, dtype=dtype)
