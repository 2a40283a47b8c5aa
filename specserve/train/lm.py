"""Small Llama models (Touvron et al. 2023) and a deterministic next-token training loop
(AdamW, linear warmup then cosine decay, as in nanoGPT), on CPU or CUDA.

Step counts are fixed up front (not stopped by a clock), so a run is a pure function of its
data, schedule, seed and dtype; the demo derives the counts from a time budget instead.
``Schedule.bf16`` turns on bfloat16 autocast: callers pass what :mod:`specserve.cpu_dtype`
chose for the machine (float32 where the CPU has no bfloat16 instructions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

StepFn = Callable[[int, int, float], None]  # (step, total_steps, loss)


@dataclass(frozen=True)
class LlamaShape:
    """Architecture of a small Llama."""

    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 1024


@dataclass(frozen=True)
class Schedule:
    """Optimisation schedule: ``steps`` batches of ``batch_size`` x ``seq_len`` tokens."""

    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    bf16: bool = False  # bfloat16 autocast (specserve.cpu_dtype.choose_dtype decides)


@dataclass(frozen=True)
class TrainResult:
    """Loss per step and the mean of the last 10% of steps."""

    losses: tuple[float, ...]

    @property
    def final_loss(self) -> float:
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)


def lr_at(step: int, s: Schedule) -> float:
    """Learning rate at ``step`` (0-based): linear warmup, cosine decay to ``min_lr_ratio``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    span = max(1, s.steps - s.warmup_steps)
    frac = min(1.0, (step - s.warmup_steps) / span)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_llama(shape: LlamaShape, tok: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    """A freshly initialised LlamaForCausalLM (fp32) over ``tok``'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def stream_batch(tokens: torch.Tensor, batch: int, seq_len: int,
                 g: torch.Generator) -> torch.Tensor:
    """Random windows [batch, seq_len] of the token stream ``tokens`` [N]."""
    import torch

    starts = torch.randint(0, tokens.numel() - seq_len, (batch,), generator=g)
    return torch.stack([tokens[s:s + seq_len] for s in starts.tolist()])


def rows_batch(seqs: torch.Tensor, batch: int, g: torch.Generator) -> torch.Tensor:
    """Random rows [batch, T] of the sequence matrix ``seqs`` [N, T]."""
    import torch

    return seqs[torch.randint(0, seqs.shape[0], (batch,), generator=g)]


def train_lm(model: torch.nn.Module, next_batch: Callable[[torch.Generator], torch.Tensor],
             s: Schedule, seed: int, on_step: StepFn | None = None) -> TrainResult:
    """Train ``model`` on next-token cross-entropy for ``s.steps`` batches from ``next_batch``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95),
                            weight_decay=s.weight_decay)
    model.train()
    losses: list[float] = []
    for step in range(s.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        x = next_batch(g).to(device)  # [B, T]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step + 1, s.steps, losses[-1])
    model.eval()
    return TrainResult(tuple(losses))
