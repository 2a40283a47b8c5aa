"""``specserve train-eagle3``: an EAGLE-3 draft head for a local Hugging Face causal LM (Li et al.
2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time
Test"; the head and its portable directory: :mod:`specserve.runtime.eagle3`).

Data: the target's own generations, as SpecForge and vLLM speculators regenerate responses with
the target: prompts sampled from the model after BOS (or, with ``--data``, windows of a text /
JSONL file), then the target's greedy continuations (:mod:`specserve.train.distill`, as
:mod:`specserve.train.medusa_train` does for Medusa). The last ``heldout_fraction`` of them is
kept out of training for the evaluation.

Draft vocabulary (EAGLE-3 §3.3 uses the 32k most frequent tokens of Llama-3's 128k): the
``draft_vocab`` most frequent ids in the training sequences, ties by lower id, sorted by id so
that ``d2t`` (target id = draft id + d2t[draft id]) is non-negative as vLLM and SGLang keep it;
default ``min(vocab, 32000)``.

Loss: the training-time test (:func:`specserve.runtime.eagle3.ttt_forward`, ``ttt_steps`` steps;
EAGLE-3 uses 7 at scale). Step j at index t predicts the target's distribution at position
t + j + 1, here soft: the target's distribution restricted to the draft vocabulary and
renormalized (= the softmax of the target's logits at the draft ids), against the head's
log-softmax, as forward KL, weighted ``step_decay ** j`` (EAGLE-3's training weights decay with
the step) and averaged over positions with t + j + 2 <= N. Prompt positions are kept: the soft
target is the target's own distribution, which is exact at every position whoever wrote the
prefix, so the prompt adds signal and no wrong labels. The target runs frozen (no grad) on each
batch to give the captured states and the soft targets; nothing is stored.

Init: the layer's q/k/v read 2H inputs, so no target layer fits: small random weights (std 0.02)
with unit norms; ``lm_head`` starts from the target's ``lm_head`` rows of the draft vocabulary and
``norm`` from the target's final norm, so the head starts in the target's output space (EAGLE-1
kept the target's head frozen; EAGLE-3 trains its own over the reduced vocabulary).

Budget: ``steps`` is fixed up front (AdamW, linear warmup, cosine decay, grad clip:
:func:`specserve.train.lm.lr_at`); ``minutes`` instead sets ``steps`` from a measured training
step (timed on a throwaway copy), so the schedule still anneals, and the resulting count is
recorded: ``--steps`` with it reproduces the run. The demo passes step counts derived from its
own budget (:mod:`specserve.train.demo`).

Eval: the saved head decodes held-out prompts through the reference decoder at T = 0
(:class:`specserve.runtime.proposers.eagle3.Eagle3Proposer` at ``max_draft_len``), against plain
decoding: tau, per-position acceptance, tokens/s and the fraction of outputs equal to plain
decoding (lossless: 1.0), in ``eval.json``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specserve.config import JsonConfig, write_json_atomic
from specserve.cpu_dtype import REQUESTS, choose_dtype
from specserve.errors import SpecserveError
from specserve.outputs import check_replaceable, staged_output
from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head, ttt_forward
from specserve.runtime.eagle3_dir import save_eagle3
from specserve.runtime.model import Transformer
from specserve.train.lm import Schedule, lr_at
from specserve.train.progress import NullReporter, Reporter

WRITER = "specserve train-eagle3"
DEFAULT_MAX_DRAFT_VOCAB = 32000


@dataclass(frozen=True)
class Eagle3TrainConfig(JsonConfig):
    """Everything that determines a train-eagle3 run (saved in ``train_info.json``)."""

    model: str
    out: str
    draft_vocab: int | None = None  # None: min(vocab, 32000)
    intermediate_size: int | None = None  # None: the target's
    num_heads: int | None = None  # attention heads (as many KV heads); None: the target's
    ttt_steps: int = 3
    step_decay: float = 0.8
    data: str | None = None
    samples: int = 256
    prompt_len: int = 16
    gen_len: int = 112
    steps: int = 300
    minutes: float | None = None
    batch_seqs: int = 8
    lr: float = 3e-3
    seed: int = 0
    device: str = "cpu"
    dtype: str = "auto"  # autocast dtype: auto (specserve.cpu_dtype) | float32 | bfloat16
    heldout_fraction: float = 0.1
    eval_prompts: int = 8
    eval_gen_len: int = 64
    max_draft_len: int = 4

    def validate(self) -> None:
        for name in ("ttt_steps", "samples", "prompt_len", "gen_len", "steps", "batch_seqs",
                     "max_draft_len"):
            if getattr(self, name) < 1:
                raise SpecserveError(f"train-eagle3: --{name.replace('_', '-')} must be >= 1")
        if self.eval_prompts < 0 or self.eval_gen_len < 1:
            raise SpecserveError("train-eagle3: --eval-prompts must be >= 0, --eval-gen-len >= 1")
        for name in ("intermediate_size", "num_heads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SpecserveError(f"train-eagle3: --{name.replace('_', '-')} must be >= 1, "
                                     f"got {v}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise SpecserveError(f"train-eagle3: --draft-vocab must be >= 1, got "
                                 f"{self.draft_vocab}")
        if self.dtype not in REQUESTS:
            raise SpecserveError(f"train-eagle3: --dtype {self.dtype!r}: choose one of "
                                 f"{', '.join(REQUESTS)}")
        if self.minutes is not None and self.minutes <= 0:
            raise SpecserveError(f"train-eagle3: --minutes must be > 0, got {self.minutes}")
        if self.lr <= 0 or not 0 < self.step_decay <= 1 or not 0 <= self.heldout_fraction < 1:
            raise SpecserveError("train-eagle3: lr must be > 0, step_decay in (0, 1] and "
                                 "heldout_fraction in [0, 1)")


@dataclass(frozen=True)
class Eagle3Result:
    """Outcome of a train-eagle3 run."""

    out: Path
    steps: int
    first_loss: float
    final_loss: float
    train: dict[str, Any]
    eval: dict[str, Any]


# --- pure parts ----------------------------------------------------------------------------

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


def step_weights(steps: int, decay: float) -> list[float]:
    return [decay ** j for j in range(steps)]


def ttt_loss(step_logits: list[torch.Tensor], target_logp: torch.Tensor,
             target_top: torch.Tensor, weights: list[float]
             ) -> tuple[torch.Tensor, list[float], list[float]]:
    """The weighted training-time-test loss and, per step, its KL and top-1 accuracy.

    step_logits: steps x [B, N, Vd] (:func:`ttt_forward`); target_logp [B, N, Vd]: the target's
    log-distribution at each position restricted to the draft vocabulary (renormalized);
    target_top [B, N]: the draft id of the target's argmax over the full vocabulary, -1 when it
    lies outside (a miss for any head). Step j at index t is scored against position t + j + 1,
    for t + j + 2 <= N only."""
    n = target_logp.shape[1]
    total = target_logp.new_zeros(())
    kls, accs, wsum = [], [], 0.0
    for j, (lg, w) in enumerate(zip(step_logits, weights, strict=True)):
        m = n - j - 1  # valid indices t = 0 .. n - j - 2
        if m <= 0:
            break
        logq = F.log_softmax(lg[:, :m].float(), dim=-1)          # [B, m, Vd]
        logp = target_logp[:, j + 1:j + 1 + m]                  # [B, m, Vd]
        kl = (logp.exp() * (logp - logq)).sum(-1).mean()
        total = total + w * kl
        wsum += w
        kls.append(float(kl.detach()))
        hit = lg[:, :m].argmax(-1) == target_top[:, j + 1:j + 1 + m]
        accs.append(float(hit.float().mean()))
    return total / max(wsum, 1e-12), kls, accs


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


# --- training ------------------------------------------------------------------------------

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


@dataclass
class _Trainer:
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


def steps_for_minutes(tr: _Trainer, minutes: float, rep: Reporter) -> int:
    """Training steps that fit ``minutes``, from the time of a step on a throwaway copy (one
    warm-up step, then the mean of two)."""
    probe = _Trainer(copy.deepcopy(tr.head), tr.target, tr.seqs, tr.ids, tr.cfg, tr.bf16)
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


def train_eagle3_head(tr: _Trainer, steps: int, rep: Reporter) -> list[float]:
    """``steps`` AdamW steps of the training-time-test loss; the loss of every step."""
    s = Schedule(steps=steps, batch_size=tr.cfg.batch_seqs, seq_len=tr.seqs.shape[1],
                 lr=tr.cfg.lr, warmup_steps=min(20, steps // 10), weight_decay=0.0)
    g = torch.Generator().manual_seed(tr.cfg.seed + 1)
    opt = _optimizer(tr.head, s.lr)
    tr.head.train()
    losses: list[float] = []
    rep.start("eagle3 head", steps)
    for step in range(steps):
        loss, _kls, accs = tr.step(opt, tr.batch(g), lr_at(step, s))
        losses.append(loss)
        rep.update(step + 1, f"loss {loss:.3f} acc0 {accs[0]:.2f}" if accs else "")
    tr.head.eval()
    return losses


def heldout_metrics(tr: _Trainer, seqs: torch.Tensor) -> dict[str, Any]:
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


# --- data ----------------------------------------------------------------------------------

def make_sequences(cfg: Eagle3TrainConfig, g: torch.Generator, rep: Reporter) -> torch.Tensor:
    """The target's own generations [samples, prompt_len + gen_len]: sampled (or ``--data``)
    prompts, greedy continuations."""
    from specserve.train.distill import greedy_continue, sample_prompts, sampled_prompts
    from specserve.train.medusa_train import load_causal_lm, read_data_file
    from specserve.train.tokenizer import concat_with_eos, encode_documents

    model, tok = load_causal_lm(cfg.model, cfg.device)
    if cfg.data is not None:
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


# --- evaluation ----------------------------------------------------------------------------

def decode_eval(model_dir: Path, head_dir: Path, prompts: list[list[int]], max_tokens: int,
                k: int, device: str = "cpu") -> dict[str, Any]:
    """Plain vs EAGLE-3 decoding of ``prompts`` at T = 0 through the reference decoder."""
    from specserve.runtime.loader import build_decoder
    from specserve.train.decoder_eval import compare, run_greedy

    base = run_greedy(build_decoder(model_dir, device=device), prompts, max_tokens)
    spec = run_greedy(build_decoder(model_dir, eagle3_dir=head_dir, max_draft_len=k,
                                    device=device), prompts, max_tokens)
    return {"baseline_tokens_per_s": round(base["tokens_per_s"], 2), "k": k,
            "prompts": len(prompts), "max_tokens": max_tokens, **compare(spec, base)}


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
    with staged_output(out, force, WRITER) as work:
        seqs = sequences if sequences is not None else make_sequences(
            cfg, torch.Generator().manual_seed(cfg.seed), rep)
        n_held = int(seqs.shape[0] * cfg.heldout_fraction)
        train_seqs, held = seqs[:seqs.shape[0] - n_held], seqs[seqs.shape[0] - n_held:]
        ids = draft_vocabulary(train_seqs, target.cfg.vocab_size, size)
        coverage = float(torch.isin(train_seqs, ids).float().mean())
        head = Eagle3Head(Eagle3Config.for_target(
            target.cfg, size, intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads))
        init_head(head, target, ids, cfg.seed)
        head.to(cfg.device).bind(target.embed.weight)
        tr = _Trainer(head, target, train_seqs, ids, cfg, choice.bf16)
        steps = cfg.steps if cfg.minutes is None else steps_for_minutes(tr, cfg.minutes, rep)
        t0 = time.monotonic()
        losses = train_eagle3_head(tr, steps, rep)
        final = _tail_mean(losses)
        train: dict[str, Any] = {"config": cfg.to_dict(), "dtype": choice.to_dict(),
                                 "steps": steps, "draft_vocab": size,
                 "draft_vocab_coverage": round(coverage, 4),
                 "train_sequences": list(train_seqs.shape), "first_loss": losses[0],
                 "final_loss": final, "train_seconds": round(
                     time.monotonic() - t0, 2), "heldout": heldout_metrics(tr, held)}
        save_eagle3(head.float().cpu(), work)
        write_json_atomic(work / "train_info.json", train)
        ev: dict[str, Any] = {}
        n_eval = min(cfg.eval_prompts, held.shape[0])
        if n_eval:
            rep.log(f"decoding {n_eval} held-out prompts, plain and with the head")
            prompts = held[:n_eval, :cfg.prompt_len].tolist()
            ev = decode_eval(Path(cfg.model), work, prompts, cfg.eval_gen_len, cfg.max_draft_len,
                             cfg.device)
            write_json_atomic(work / "eval.json", ev)
    return Eagle3Result(out, steps, losses[0], final, train, ev)


def _tail_mean(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10):]
    return sum(tail) / len(tail)
