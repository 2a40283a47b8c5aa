"""The EAGLE-3 head's training loop: batches of the training sequences through the frozen target
(:func:`specserve.train.eagle3_data.target_batch`) and the head
(:func:`specserve.runtime.eagle3.ttt_forward`), the loss of :mod:`specserve.train.eagle3_loss`,
AdamW steps; the step budget; held-out teacher-forced metrics.

Budget: ``steps`` is fixed up front (AdamW, linear warmup, cosine decay, grad clip:
:func:`specserve.train.lm.lr_at`); ``minutes`` instead sets ``steps`` from a measured training
step (timed on a throwaway copy), so the schedule still anneals, and the resulting count is
recorded: ``--steps`` with it reproduces the run. The demo passes step counts derived from its
own budget (:mod:`specserve.train.demo`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specserve.runtime.eagle3 import Eagle3Head, ttt_forward
from specserve.runtime.model import Transformer
from specserve.train.eagle3_config import Eagle3TrainConfig
from specserve.train.eagle3_data import draft_index, target_batch
from specserve.train.eagle3_loss import step_weights, ttt_loss
from specserve.train.lm import Schedule, lr_at
from specserve.train.progress import Reporter


@dataclass
class HeadTrainer:
    head: Eagle3Head
    target: Transformer
    seqs: torch.Tensor          # [N, T]
    ids: torch.Tensor           # [Vd]
    cfg: Eagle3TrainConfig
    bf16: bool = False  # bfloat16 autocast of the head (the target runs float32, no grad)

    def __post_init__(self) -> None:
        self.ids = self.ids.to(self.target.device)
        self.index = draft_index(self.head.cfg.vocab_size, self.ids.cpu()).to(self.target.device)
        self.weights = step_weights(self.cfg.ttt_steps, self.cfg.step_decay)

    def batch(self, g: torch.Generator) -> torch.Tensor:
        pick = torch.randint(0, self.seqs.shape[0], (self.cfg.batch_seqs,), generator=g)
        return self.seqs[pick].to(self.target.device)  # [b, T]

    def loss(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[float], list[float]]:
        aux, logp, top = target_batch(self.target, rows, self.ids, self.index,
                                      self.head.cfg.aux_layer_ids)
        dev = self.head.device
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = ttt_forward(self.head, aux.to(dev), rows.to(dev), self.cfg.ttt_steps)
        return ttt_loss(logits, logp.to(dev), top.to(dev), self.weights)

    def step(self, opt: torch.optim.Optimizer, rows: torch.Tensor, lr: float
             ) -> tuple[float, list[float], list[float]]:
        for group in opt.param_groups:
            group["lr"] = lr
        loss, kls, accs = self.loss(rows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach()), kls, accs


def _optimizer(head: Eagle3Head, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)


def steps_for_minutes(tr: HeadTrainer, minutes: float, rep: Reporter) -> int:
    """Training steps that fit ``minutes``, from the time of a step on a throwaway copy (one
    warm-up step, then the mean of two)."""
    probe = HeadTrainer(copy.deepcopy(tr.head), tr.target, tr.seqs, tr.ids, tr.cfg, tr.bf16)
    probe.head.bind(tr.target.embed.weight)
    opt = _optimizer(probe.head, tr.cfg.lr)
    g = torch.Generator().manual_seed(tr.cfg.seed + 99)
    probe.step(opt, probe.batch(g), tr.cfg.lr)
    t0 = time.perf_counter()
    for _ in range(2):
        probe.step(opt, probe.batch(g), tr.cfg.lr)
    per_step = (time.perf_counter() - t0) / 2
    steps = max(10, int(minutes * 60 / per_step))
    rep.log(f"{per_step:.3f}s a step: {steps} steps fit {minutes:g} min")
    return steps


SAVE_EVERY = 20  # steps between checkpoints of a resumable run


def train_eagle3_head(tr: HeadTrainer, steps: int, rep: Reporter,
                      resume: dict[str, Any] | None = None,
                      checkpoint: Callable[[dict[str, Any]], None] | None = None
                      ) -> list[float]:
    """``steps`` AdamW steps of the training-time-test loss; the loss of every step. ``resume``
    (a state ``checkpoint`` was given) continues that run: head, optimizer, data order, losses;
    ``checkpoint`` receives the state every :data:`SAVE_EVERY` steps and at the end."""
    s = Schedule(steps=steps, batch_size=tr.cfg.batch_seqs, seq_len=tr.seqs.shape[1],
                 lr=tr.cfg.lr, warmup_steps=min(20, steps // 10), weight_decay=0.0)
    g = torch.Generator().manual_seed(tr.cfg.seed + 1)
    opt = _optimizer(tr.head, s.lr)
    start, losses = 0, []
    if resume is not None and "head" in resume:
        tr.head.load_state_dict(resume["head"])
        opt.load_state_dict(resume["opt"])
        g.set_state(resume["rng"])
        start, losses = int(resume["step"]), [float(x) for x in resume["losses"]]
        rep.log(f"resuming at step {start} of {steps}")
    tr.head.train()
    rep.start("eagle3 head", steps)
    for step in range(start, steps):
        loss, _kls, accs = tr.step(opt, tr.batch(g), lr_at(step, s))
        losses.append(loss)
        rep.update(step + 1, f"loss {loss:.3f} acc0 {accs[0]:.2f}" if accs else "")
        if checkpoint is not None and ((step + 1) % SAVE_EVERY == 0 or step + 1 == steps):
            checkpoint({"steps": steps, "step": step + 1, "head": tr.head.state_dict(),
                        "opt": opt.state_dict(), "rng": g.get_state(), "losses": losses})
    tr.head.eval()
    return losses


def heldout_metrics(tr: HeadTrainer, seqs: torch.Tensor) -> dict[str, Any]:
    """Teacher-forced KL and top-1 accuracy per training-time-test step on ``seqs``."""
    if seqs.shape[0] == 0:
        return {}
    kls, accs = [], []
    with torch.no_grad():
        for start in range(0, seqs.shape[0], tr.cfg.batch_seqs):
            _loss, k, a = tr.loss(seqs[start:start + tr.cfg.batch_seqs].to(tr.target.device))
            kls.append(k)
            accs.append(a)
    return {"kl_per_step": [round(sum(c) / len(c), 4) for c in zip(*kls, strict=True)],
            "top1_per_step": [round(sum(c) / len(c), 4) for c in zip(*accs, strict=True)]}
