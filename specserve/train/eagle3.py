"""``specserve train-eagle3``: an EAGLE-3 draft head for a local Hugging Face causal LM (Li et al.
2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time
Test"; the head and its portable directory: :mod:`specserve.runtime.eagle3`).

The command: validate, load the frozen target, make the data (:mod:`specserve.train.eagle3_data`),
build and initialize the head, train it (:mod:`specserve.train.eagle3_loop`, loss
:mod:`specserve.train.eagle3_loss`), write the portable head directory
(:func:`specserve.runtime.eagle3_dir.save_eagle3`), ``train_info.json`` and ``eval.json``, staged
and swapped into place. The run's settings:
:class:`specserve.train.eagle3_config.Eagle3TrainConfig`.

Init: the layer's q/k/v read 2H inputs, so no target layer fits: small random weights (std 0.02)
with unit norms; ``lm_head`` starts from the target's ``lm_head`` rows of the draft vocabulary and
``norm`` from the target's final norm, so the head starts in the target's output space (EAGLE-1
kept the target's head frozen; EAGLE-3 trains its own over the reduced vocabulary).

Eval: the saved head decodes held-out prompts through the reference decoder at T = 0
(:class:`specserve.runtime.proposers.eagle3.Eagle3Proposer` at ``max_draft_len``), against plain
decoding: tau, per-position acceptance, tokens/s and the fraction of outputs equal to plain
decoding (lossless: 1.0), in ``eval.json``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch

from specserve.config import write_json_atomic
from specserve.cpu_dtype import choose_dtype
from specserve.errors import SpecserveError
from specserve.outputs import check_replaceable, staged_output
from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head
from specserve.runtime.eagle3_dir import save_eagle3
from specserve.runtime.model import Transformer
from specserve.train.decoder_eval import heldout_eval
from specserve.train.distill_config import SelfDistillResult, tail_mean
from specserve.train.eagle3_config import Eagle3TrainConfig
from specserve.train.eagle3_data import draft_vocabulary, make_sequences, vocab_maps
from specserve.train.eagle3_loop import (
    HeadTrainer,
    heldout_metrics,
    steps_for_minutes,
    train_eagle3_head,
)
from specserve.train.progress import NullReporter, Reporter
from specserve.train.resume import (
    cached_tensors,
    load_state,
    prepare_work,
    save_state,
    work_dir,
)

WRITER = "specserve train-eagle3"
DEFAULT_MAX_DRAFT_VOCAB = 32000


Eagle3Result = SelfDistillResult  # what run_train_eagle3 returns


# --- the head ------------------------------------------------------------------------------

def init_head(head: Eagle3Head, target: Transformer, ids: torch.Tensor, seed: int) -> None:
    """Small random weights, unit norms; lm_head / norm from the target (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    d2t, t2d = vocab_maps(ids, head.cfg.vocab_size)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        head.lm_head.weight.copy_(_dense(target.lm_head.weight)[ids.cpu()])
        head.norm.weight.copy_(_dense(target.norm.weight))
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)


def _dense(w: torch.Tensor) -> torch.Tensor:
    return (w.to_dense() if w.is_mkldnn else w).detach().float().cpu()


# --- the command ---------------------------------------------------------------------------

def load_target(cfg: Eagle3TrainConfig) -> tuple[Transformer, int]:
    """The frozen runtime target (refuses what the reference decoder cannot run) and the draft
    vocabulary size (checked against the target's vocabulary)."""
    from specserve.runtime.model import load_model

    target = load_model(cfg.model, torch.float32, cfg.device)
    vocab = target.cfg.vocab_size
    size = cfg.draft_vocab if cfg.draft_vocab is not None else min(vocab,
                                                                   DEFAULT_MAX_DRAFT_VOCAB)
    if size > vocab:
        raise SpecserveError(f"train-eagle3: --draft-vocab {size} > the target's vocabulary "
                             f"({vocab})")
    for p in target.parameters():
        p.requires_grad_(False)
    return target, size


def run_train_eagle3(cfg: Eagle3TrainConfig, reporter: Reporter | None = None, *,
                     sequences: torch.Tensor | None = None, force: bool = False
                     ) -> Eagle3Result:
    """Train an EAGLE-3 head for ``cfg.model`` and write the portable directory ``cfg.out``
    (staged, swapped into place; an existing ``out`` only with ``force`` and only ours).

    ``sequences`` [N, T] (the target's own greedy continuations) skips data generation."""
    cfg.validate()
    rep = reporter or NullReporter()
    out = Path(cfg.out)
    check_replaceable(out, force, WRITER)
    target, size = load_target(cfg)
    choice = choose_dtype(cfg.dtype, cfg.device)
    rep.log(f"training dtype {choice.dtype} ({choice.reason})")
    torch.manual_seed(cfg.seed)
    work = work_dir(out)
    prepare_work(cfg.to_json(), work, rep)
    seqs = sequences if sequences is not None else cached_tensors(work, lambda: {
        "seqs": make_sequences(cfg, torch.Generator().manual_seed(cfg.seed), rep)}, rep)["seqs"]
    n_held = int(seqs.shape[0] * cfg.heldout_fraction)
    train_seqs, held = seqs[:seqs.shape[0] - n_held], seqs[seqs.shape[0] - n_held:]
    ids = draft_vocabulary(train_seqs, target.cfg.vocab_size, size)
    coverage = float(torch.isin(train_seqs, ids).float().mean())
    head = Eagle3Head(Eagle3Config.for_target(
        target.cfg, size, intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads))
    init_head(head, target, ids, cfg.seed)
    head.to(cfg.device).bind(target.embed.weight)
    tr = HeadTrainer(head, target, train_seqs, ids, cfg, choice.bf16)
    state = load_state(work)
    steps = (int(state["steps"]) if state is not None else cfg.steps if cfg.minutes is None
             else steps_for_minutes(tr, cfg.minutes, rep))
    if state is None:  # a --minutes budget keeps the step count it measured first
        save_state(work, {"steps": steps})
    t0 = time.monotonic()
    losses = train_eagle3_head(tr, steps, rep, resume=state,
                               checkpoint=lambda st: save_state(work, st))
    train: dict[str, Any] = {"config": cfg.to_dict(), "dtype": choice.to_dict(),
                             "steps": steps, "draft_vocab": size,
                             "draft_vocab_coverage": round(coverage, 4),
                             "train_sequences": list(train_seqs.shape),
                             "first_loss": losses[0], "final_loss": tail_mean(losses),
                             "train_seconds_last_session": round(time.monotonic() - t0, 2),
                             "heldout": heldout_metrics(tr, held)}
    with staged_output(out, force, WRITER) as stage:
        save_eagle3(head.float().cpu(), stage)
        write_json_atomic(stage / "train_info.json", train)
        ev = heldout_eval(cfg, stage, held, rep, "head", eagle3_dir=stage)
    shutil.rmtree(work, ignore_errors=True)
    return Eagle3Result(out, steps, losses[0], train["final_loss"], train, ev)
