"""Self-distillation data: the target's own greedy continuations of prompts.

Training a draft on the target's outputs rather than on raw text (DistillSpec, Zhou et al.
2024) and Medusa heads on the base model's own generations (Cai et al. 2024, §2.3.2
self-distillation) aligns the proposer with exactly what the target emits at T=0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.errors import SpecserveError

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


def is_chat_dataset(path: Path) -> bool:
    """Whether ``path`` is a JSONL chat set (its first record has ``messages``, as
    ``specserve prompts`` writes): its prompts are then chat-templated, not text windows."""
    import json

    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError:
                    return False
                return isinstance(obj, dict) and "messages" in obj
    return False


def chat_prompts(tok: Any, path: Path, n: int, prompt_len: int,
                 g: torch.Generator) -> torch.Tensor:
    """``n`` prompts [n, prompt_len] from a chat set: each record's messages rendered with the
    tokenizer's chat template and the assistant's turn opened (``add_generation_prompt``), cut
    to its last ``prompt_len`` tokens so every prompt ends where the model starts answering;
    records shorter than that are skipped; drawn without replacement while they last."""
    import torch

    from specserve.client.datasets import load_dataset

    if getattr(tok, "chat_template", None) is None:
        raise SpecserveError(f"{path}: a chat set needs a tokenizer with a chat template")
    rows = []
    for p in load_dataset(path):
        msgs = [{"role": r, "content": c} for r, c in p.messages] or [
            {"role": "user", "content": p.text}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
        if len(ids) >= prompt_len:
            rows.append(torch.tensor(list(ids)[-prompt_len:], dtype=torch.int64))
    if not rows:
        raise SpecserveError(f"{path}: no chat prompt has {prompt_len} tokens (lower "
                             "--prompt-len)")
    order = torch.randperm(len(rows), generator=g).tolist()
    return torch.stack([rows[order[i % len(rows)]] for i in range(n)])
