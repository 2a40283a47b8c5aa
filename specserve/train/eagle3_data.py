"""What an EAGLE-3 head learns from (Li et al. 2025, "EAGLE-3", arXiv:2503.01840): the sequences,
the draft vocabulary over them, and per batch the frozen target's captured states and soft targets.

Data: the target's own generations, as SpecForge and vLLM speculators regenerate responses with
the target: prompts sampled from the model after BOS (or, with ``--data``, windows of a text /
JSONL file, or the chat-templated prompts of a chat set from ``specserve prompts``), then the
target's greedy continuations (:mod:`specserve.train.distill`, as
:mod:`specserve.train.medusa_train` does for Medusa; :mod:`specserve.train.draft_train` reads
the same sequences). The last ``heldout_fraction`` of them is kept out of training for the
evaluation.

Draft vocabulary (EAGLE-3 §3.3 uses the 32k most frequent tokens of Llama-3's 128k): the
``draft_vocab`` most frequent ids in the training sequences, ties by lower id, sorted by id so
that ``d2t`` (target id = draft id + d2t[draft id]) is non-negative as vLLM and SGLang keep it;
default ``min(vocab, 32000)``.

Features (:func:`target_batch`): the target runs frozen (no grad) on each batch to give the
captured states of the layers the head reads and the soft targets (its distribution restricted
to the draft vocabulary); nothing is stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from specserve.errors import SpecserveError
from specserve.runtime.model import Transformer
from specserve.train.progress import Reporter


class DistillSource(Protocol):
    """What the self-distilled sequences depend on (train-eagle3's and train-draft's configs):
    the same values (and seed) give the same sequences."""

    @property
    def model(self) -> str: ...
    @property
    def data(self) -> str | None: ...
    @property
    def samples(self) -> int: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def gen_len(self) -> int: ...
    @property
    def device(self) -> str: ...


def make_sequences(cfg: DistillSource, g: torch.Generator, rep: Reporter) -> torch.Tensor:
    """The target's own generations [samples, prompt_len + gen_len]: sampled (or ``--data``)
    prompts, greedy continuations."""
    from specserve.train.distill import (
        chat_prompts,
        greedy_continue,
        is_chat_dataset,
        sample_prompts,
        sampled_prompts,
    )
    from specserve.train.medusa_train import load_causal_lm, read_data_file
    from specserve.train.tokenizer import concat_with_eos, encode_documents

    model, tok = load_causal_lm(cfg.model, cfg.device)
    if cfg.data is not None and is_chat_dataset(Path(cfg.data)):
        prompts = chat_prompts(tok, Path(cfg.data), cfg.samples, cfg.prompt_len, g)
    elif cfg.data is not None:
        stream = concat_with_eos(encode_documents(tok, read_data_file(Path(cfg.data))),
                                 tok.eos_token_id if tok.eos_token_id is not None else 0)
        if stream.numel() <= cfg.prompt_len:
            raise SpecserveError(f"{cfg.data}: {stream.numel()} tokens, need more than "
                                 f"{cfg.prompt_len}")
        prompts = sample_prompts(stream, cfg.samples, cfg.prompt_len, g)
    else:
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if bos is None:
            raise SpecserveError(f"{cfg.model}: tokenizer has neither a BOS nor an EOS token")
        prompts = sampled_prompts(model, bos, cfg.samples, cfg.prompt_len, g)  # [N, P]
    rep.start("self-distill", cfg.samples)
    return greedy_continue(model, prompts, cfg.gen_len, on_batch=lambda d, _t: rep.update(d))


def draft_vocabulary(seqs: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids of ``seqs`` [N, T] (ties: lower id first; ids never seen
    fill up in id order), sorted ascending [size] int64."""
    if not 1 <= size <= vocab:
        raise SpecserveError(f"draft vocabulary size {size} not in [1, {vocab}]")
    counts = torch.bincount(seqs.reshape(-1).long(), minlength=vocab)[:vocab]  # [V]
    order = torch.sort(counts, descending=True, stable=True).indices[:size]
    return order.sort().values


def vocab_maps(ids: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] int64 with target id = draft id + d2t, t2d [V] bool) for sorted draft ``ids``."""
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def draft_index(vocab: int, ids: torch.Tensor) -> torch.Tensor:
    """[V] int64: the draft id of each target id, -1 outside the draft vocabulary."""
    out = torch.full((vocab,), -1, dtype=torch.long)
    out[ids] = torch.arange(ids.numel())
    return out


def target_batch(target: Transformer, rows: torch.Tensor, ids: torch.Tensor,
                 index: torch.Tensor, capture: tuple[int, ...]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Frozen target over rows [B, N]: captured states [B, N, n*H] (the layers ``capture``
    names), restricted log-distribution [B, N, Vd] and the draft id of its argmax [B, N] (-1
    outside the draft vocabulary)."""
    with torch.no_grad():
        cache = target.new_cache(rows.shape[0], rows.shape[1])
        out = target.run(rows, cache, capture=capture)  # hidden [B, N, H]
        assert out.aux is not None
        logits = target.logits(out.hidden)  # [B, N, V]
        logp = F.log_softmax(logits[..., ids], dim=-1)
        top = index[logits.argmax(-1)]
        return out.aux.float(), logp, top
