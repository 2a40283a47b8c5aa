"""Self-distillation data: the target's own greedy continuations of prompts.

Training a draft on the target's outputs rather than on raw text (DistillSpec, Zhou et al.
2024) and Medusa heads on the base model's own generations (Cai et al. 2024, §2.3.2
self-distillation) aligns the proposer with exactly what the target emits at T=0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ProgressFn = Callable[[int, int], None]  # (done, total)


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the KV cache ``cache``; earlier ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def greedy_continue(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int,
                    batch_size: int = 64, on_batch: ProgressFn | None = None) -> torch.Tensor:
    """Greedy (argmax) continuation with a KV cache, EOS not special.

    prompts: [N, P] int64 -> returns [N, P + new_tokens] int64 (prompt then continuation).
    """
    import torch

    device = next(model.parameters()).device
    outs: list[torch.Tensor] = []
    model.eval()
    cache_kw = _cache_kwarg(model)
    with torch.inference_mode():
        for start in range(0, prompts.shape[0], batch_size):
            x = prompts[start:start + batch_size].to(device)  # [b, P]
            out = model(input_ids=x, use_cache=True)
            past = out[cache_kw]
            nxt = out.logits[:, -1].argmax(-1)  # [b]
            gen = [nxt]
            for _ in range(new_tokens - 1):
                out = model(input_ids=nxt[:, None], use_cache=True, **{cache_kw: past})
                past = out[cache_kw]
                nxt = out.logits[:, -1].argmax(-1)
                gen.append(nxt)
            outs.append(torch.cat([x, torch.stack(gen, dim=1)], dim=1).cpu())
            if on_batch is not None:
                on_batch(min(start + batch_size, prompts.shape[0]), prompts.shape[0])
    return torch.cat(outs)


def sample_prompts(stream: torch.Tensor, n: int, prompt_len: int,
                   g: torch.Generator) -> torch.Tensor:
    """``n`` random windows [n, prompt_len] of a token stream [N] (distillation prompts)."""
    import torch

    starts = torch.randint(0, stream.numel() - prompt_len, (n,), generator=g)
    return torch.stack([stream[s:s + prompt_len] for s in starts.tolist()])


def sampled_prompts(model: torch.nn.Module, bos_id: int, n: int, prompt_len: int,
                    g: torch.Generator, temperature: float = 1.0) -> torch.Tensor:
    """Prompts [n, prompt_len] sampled from the model itself after BOS (no data needed).

    Sampling (not argmax) makes the prompts diverse; the continuation is then greedy.
    """
    import torch

    device = next(model.parameters()).device
    x = torch.full((n, 1), bos_id, dtype=torch.int64)
    with torch.inference_mode():
        for _ in range(prompt_len - 1):
            logits = model(input_ids=x.to(device)).logits[:, -1].float().cpu()  # [n, V]
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=g)  # [n, 1]
            x = torch.cat([x, nxt], dim=1)
    return x
