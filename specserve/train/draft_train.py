"""``specserve train-draft``: a small draft model for a local Hugging Face causal LM, distilled
from the target's own greedy answers (DistillSpec, Zhou et al. 2024, "DistillSpec: Improving
Speculative Decoding via Knowledge Distillation": a draft aligned to the target by training on
the target's generations; draft-model speculation: Leviathan et al. 2023, Chen et al. 2023).

Model: a Llama ``hidden`` wide and ``layers`` deep with the target's vocabulary (``vocab_size``,
BOS/EOS/pad ids, RoPE base, context length) and its tokenizer files copied, so the reference
decoder's draft path (``build_decoder(..., draft_dir=...)``, which checks the tokenizers match)
loads it; input embedding and LM head are tied. Its cost at decode is mostly that head, read once
per draft token: [V, hidden] (V = 49,152 and hidden 256 are 50 MB in float32, about a tenth of
SmolLM2-135M's 540 MB step).

Init (``embed_init``): ``svd`` projects the target's input embedding E [V, H] onto its top
``hidden`` right singular vectors, E V_d [V, d] (:func:`svd_embedding`: the best rank-d
approximation of E's rows, Eckart-Young), so the draft starts with the target's token geometry in
its embedding and, tied, in its head; ``random`` keeps Llama's N(0, 0.02). The layers start fresh.

Data: the target's greedy continuations of prompts
(:func:`specserve.train.eagle3_data.make_sequences`, train-eagle3's pipeline: the same ``data``,
``samples``, ``prompt_len``, ``gen_len`` and seed give the same sequences as train-eagle3 and
train-medusa). Loss (:func:`continuation_labels`): next-token cross-entropy on the target's
continuation only, the prompt's tokens unscored: sequence-level distillation, whose labels are
exactly what the target emits at T = 0.

Budget: ``steps``, or ``minutes`` setting the steps from a timed step on a throwaway copy (the
schedule still anneals; the count is recorded and reproduces the run as ``steps``). The held-out
sequences are scored at every checkpoint and the weights with the lowest cross-entropy kept (early
stopping). Resumable in ``.OUT.partial/`` (:mod:`specserve.train.resume`). Eval: held-out
teacher-forced cross-entropy and top-1 accuracy (the first draft token's acceptance), then the
saved draft decodes held-out prompts through the reference decoder against plain decoding (tau,
per-position acceptance, tokens/s, equality with plain) into ``eval.json``.
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.config import write_json_atomic
from specserve.cpu_dtype import choose_dtype
from specserve.errors import SpecserveError
from specserve.outputs import check_replaceable, staged_output
from specserve.train.decoder_eval import heldout_eval
from specserve.train.distill_config import SelfDistillConfig, SelfDistillResult, tail_mean
from specserve.train.lm import Schedule, lr_at
from specserve.train.progress import NullReporter, Reporter
from specserve.train.resume import cached_tensors, load_state, prepare_work, save_state, work_dir

WRITER = "specserve train-draft"
EMBED_INITS = ("svd", "random")
IGNORE = -100
SAVE_EVERY = 50  # steps between checkpoints of a resumable run
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "chat_template.jinja")


@dataclass(frozen=True)
class DraftTrainConfig(SelfDistillConfig):
    """Everything that determines a train-draft run (saved in ``train_info.json``): the shared
    self-distillation fields and the draft's shape."""

    hidden: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None  # None: as many as heads
    intermediate_size: int | None = None  # None: ~2.75 x hidden, a multiple of 32
    embed_init: str = "svd"
    weight_decay: float = 0.1

    def validate(self) -> None:
        self.check_shared("train-draft")
        for name in ("hidden", "layers", "heads"):
            if getattr(self, name) < 1:
                raise SpecserveError(f"train-draft: --{name.replace('_', '-')} must be >= 1")
        for name in ("kv_heads", "intermediate_size"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SpecserveError(f"train-draft: --{name.replace('_', '-')} must be >= 1, "
                                     f"got {v}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise SpecserveError(f"train-draft: --hidden {self.hidden} must be --heads "
                                 f"{self.heads} times an even head size")
        if self.heads % self.kv_heads_or_heads:
            raise SpecserveError(f"train-draft: --heads {self.heads} not a multiple of "
                                 f"--kv-heads {self.kv_heads}")
        if self.embed_init not in EMBED_INITS:
            raise SpecserveError(f"train-draft: --embed-init {self.embed_init!r}: choose one of "
                                 f"{', '.join(EMBED_INITS)}")
        if self.weight_decay < 0:
            raise SpecserveError("train-draft: weight_decay must be >= 0")

    @property
    def kv_heads_or_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def mlp_width(self) -> int:
        return (self.intermediate_size if self.intermediate_size is not None
                else max(32, (self.hidden * 11 // 4) // 32 * 32))


DraftResult = SelfDistillResult  # what run_train_draft returns


# --- the math ------------------------------------------------------------------------------

def svd_embedding(embed: torch.Tensor, d: int) -> torch.Tensor:
    """The rows of ``embed`` [V, H] in the span of its top ``d`` right singular vectors,
    as coordinates [V, d] (E V_d: the best rank-``d`` approximation of E, Eckart-Young)."""
    if not 1 <= d <= min(embed.shape):
        raise SpecserveError(f"train-draft: --hidden {d} with --embed-init svd needs at most the "
                             f"target's hidden size ({embed.shape[1]})")
    e = embed.detach().float()
    vh: torch.Tensor = torch.linalg.svd(e, full_matrices=False).Vh  # [H, H], by singular value
    return e @ vh[:d].T


def continuation_labels(seqs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Labels [N, T] for next-token cross-entropy (transformers shifts them): the sequence with
    the prompt's tokens ignored, so only the target's continuation is scored."""
    labels = seqs.clone()
    labels[:, :prompt_len] = IGNORE
    return labels


def teacher_forced(model: Any, seqs: torch.Tensor, prompt_len: int,
                   batch: int = 8) -> dict[str, float]:
    """Mean cross-entropy and top-1 accuracy of ``model``'s next-token predictions over the
    continuation of ``seqs`` [N, T] (each position given the true prefix)."""
    nll, hits, count = 0.0, 0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, seqs.shape[0], batch):
            x = seqs[start:start + batch].to(device)
            logits = model(input_ids=x).logits[:, prompt_len - 1:-1].float()  # [b, G, V]
            y = x[:, prompt_len:]
            nll += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
            hits += int((logits.argmax(-1) == y).sum())
            count += y.numel()
    return {"cross_entropy": round(nll / max(count, 1), 4),
            "top1": round(hits / max(count, 1), 4), "tokens": count}


# --- the model -----------------------------------------------------------------------------

def make_draft(cfg: DraftTrainConfig, target: dict[str, Any]) -> Any:
    """A freshly initialized tied-embedding ``LlamaForCausalLM`` (float32) with the target's
    vocabulary, special ids, RoPE and context length (``target``: its ``config.json``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = dict(target.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", target.get("rope_theta", 10000.0)))
    lc = LlamaConfig(
        vocab_size=int(target["vocab_size"]), hidden_size=cfg.hidden,
        intermediate_size=cfg.mlp_width, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads_or_heads,
        head_dim=cfg.hidden // cfg.heads, max_position_embeddings=int(
            target.get("max_position_embeddings", 4096)),
        rms_norm_eps=float(target.get("rms_norm_eps", 1e-5)),
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=target.get("bos_token_id"), eos_token_id=target.get("eos_token_id"),
        pad_token_id=target.get("pad_token_id"), tie_word_embeddings=True)
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(lc)
    model.tie_weights()
    return model


def init_embedding(model: Any, cfg: DraftTrainConfig) -> None:
    """``svd``: the target's embedding projected to ``hidden`` (:func:`svd_embedding`)."""
    if cfg.embed_init != "svd":
        return
    from specserve.checkpoint import load_state_dict

    sd = load_state_dict(cfg.model)
    key = "model.embed_tokens.weight"
    if key not in sd:
        raise SpecserveError(f"{cfg.model}: no {key} to initialize the draft's embedding from "
                             "(use --embed-init random)")
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(svd_embedding(sd[key], cfg.hidden))


# --- training ------------------------------------------------------------------------------

StepFn = Callable[[torch.Tensor, float], float]


def _optimizer(model: Any, cfg: DraftTrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                             weight_decay=cfg.weight_decay)


def _stepper(model: Any, opt: torch.optim.Optimizer, prompt_len: int, bf16: bool) -> StepFn:
    device = next(model.parameters()).device

    def step(rows: torch.Tensor, lr: float) -> float:
        for group in opt.param_groups:
            group["lr"] = lr
        x = rows.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=x, labels=continuation_labels(x, prompt_len)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step


def _batch(seqs: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    return seqs[torch.randint(0, seqs.shape[0], (n,), generator=g)]


def steps_for_minutes(model: Any, seqs: torch.Tensor, cfg: DraftTrainConfig, bf16: bool,
                      rep: Reporter) -> int:
    """Training steps that fit ``cfg.minutes``, from a step timed on a throwaway copy (one
    warm-up step, then the mean of two)."""
    assert cfg.minutes is not None
    probe = copy.deepcopy(model)
    probe.train()
    step = _stepper(probe, _optimizer(probe, cfg), cfg.prompt_len, bf16)
    g = torch.Generator().manual_seed(cfg.seed + 99)
    step(_batch(seqs, cfg.batch_seqs, g), cfg.lr)
    t0 = time.perf_counter()
    for _ in range(2):
        step(_batch(seqs, cfg.batch_seqs, g), cfg.lr)
    per_step = (time.perf_counter() - t0) / 2
    steps = max(10, int(cfg.minutes * 60 / per_step))
    rep.log(f"{per_step:.3f}s a step: {steps} steps fit {cfg.minutes:g} min")
    return steps


@dataclass
class DraftTraining:
    """What :func:`train_draft` leaves: the loss of every step, the held-out curve
    (step, cross-entropy, top-1) at every checkpoint, and the step whose weights were kept."""

    losses: list[float]
    curve: list[list[float]]
    kept_step: int


def train_draft(model: Any, seqs: torch.Tensor, cfg: DraftTrainConfig, steps: int, bf16: bool,
                rep: Reporter, held: torch.Tensor | None = None,
                resume: dict[str, Any] | None = None,
                checkpoint: Callable[[dict[str, Any]], None] | None = None) -> DraftTraining:
    """``steps`` AdamW steps (warmup, cosine decay) on random rows of ``seqs`` [N, T].

    With ``held`` sequences, every :data:`SAVE_EVERY` steps and at the end the draft is scored
    on them (:func:`teacher_forced`) and the weights with the lowest held-out cross-entropy are
    kept (early stopping: a few hundred answers overfit a draft's 49k-row head). ``resume`` (a
    state ``checkpoint`` was given) continues that run: weights, optimizer, data order, losses,
    the curve and the best weights so far."""
    s = Schedule(steps=steps, batch_size=cfg.batch_seqs, seq_len=seqs.shape[1], lr=cfg.lr,
                 warmup_steps=min(20, steps // 10), weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    opt = _optimizer(model, cfg)
    start, losses, curve = 0, [], []
    best: dict[str, torch.Tensor] | None = None
    best_step = steps
    if resume is not None and "model" in resume:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        g.set_state(resume["rng"])
        start, losses = int(resume["step"]), [float(x) for x in resume["losses"]]
        curve = [[float(v) for v in row] for row in resume["curve"]]
        best, best_step = resume.get("best"), int(resume["best_step"])
        rep.log(f"resuming at step {start} of {steps}")
    step = _stepper(model, opt, cfg.prompt_len, bf16)
    model.train()
    rep.start("draft model", steps)
    for i in range(start, steps):
        losses.append(step(_batch(seqs, cfg.batch_seqs, g), lr_at(i, s)))
        info = f"loss {losses[-1]:.3f}"
        if (i + 1) % SAVE_EVERY == 0 or i + 1 == steps:
            if held is not None and held.shape[0]:
                model.eval()
                m = teacher_forced(model, held, cfg.prompt_len)
                model.train()
                if not curve or m["cross_entropy"] < min(row[1] for row in curve):
                    best = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    best_step = i + 1
                curve.append([i + 1, m["cross_entropy"], m["top1"]])
                info += f" held-out {m['cross_entropy']:.3f} top-1 {m['top1']:.2f}"
            if checkpoint is not None:
                checkpoint({"steps": steps, "step": i + 1, "model": model.state_dict(),
                            "opt": opt.state_dict(), "rng": g.get_state(), "losses": losses,
                            "curve": curve, "best_step": best_step,
                            **({"best": best} if best is not None else {})})
        rep.update(i + 1, info)
    if best is not None and best_step != steps:
        rep.log(f"keeping the weights of step {best_step} (lowest held-out cross-entropy)")
        model.load_state_dict(best)
    model.eval()
    return DraftTraining(losses, curve, best_step)


# --- the command ---------------------------------------------------------------------------

def _target_config(cfg: DraftTrainConfig) -> dict[str, Any]:
    from specserve.runtime.checkpoint import load_target_config

    target = load_target_config(cfg.model)  # refuses what the reference decoder cannot run
    if cfg.data is not None and not Path(cfg.data).is_file():
        raise SpecserveError(f"{cfg.data}: data file not found")
    if not any((Path(cfg.model) / f).is_file() for f in TOKENIZER_FILES[:2]):
        raise SpecserveError(f"{cfg.model}: no tokenizer.json or tokenizer_config.json (the "
                             "draft must share the target's tokenizer)")
    return target


def save_draft(model: Any, model_dir: Path, out: Path) -> None:
    """The draft as a Hugging Face Llama directory with the target's tokenizer files."""
    model.float().cpu().save_pretrained(str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)


def run_train_draft(cfg: DraftTrainConfig, reporter: Reporter | None = None, *,
                    sequences: torch.Tensor | None = None, force: bool = False) -> DraftResult:
    """Train a draft model for ``cfg.model`` and write it to ``cfg.out`` (staged, swapped into
    place; an existing ``out`` only with ``force`` and only ours).

    ``sequences`` [N, prompt_len + gen_len] (the target's own greedy continuations) skips data
    generation; an interrupted run with the same config resumes from its last checkpoint."""
    from specserve.train.eagle3_data import make_sequences

    cfg.validate()
    rep = reporter or NullReporter()
    out = Path(cfg.out)
    check_replaceable(out, force, WRITER)
    target = _target_config(cfg)
    model = make_draft(cfg, target)
    init_embedding(model, cfg)
    model.to(cfg.device)
    choice = choose_dtype(cfg.dtype, cfg.device)
    rep.log(f"training dtype {choice.dtype} ({choice.reason})")
    work = work_dir(out)
    prepare_work(cfg.to_json(), work, rep)
    c0 = time.process_time()
    seqs = sequences if sequences is not None else cached_tensors(work, lambda: {
        "seqs": make_sequences(cfg, torch.Generator().manual_seed(cfg.seed), rep)}, rep)["seqs"]
    distill_cpu = time.process_time() - c0
    n_held = int(seqs.shape[0] * cfg.heldout_fraction)
    train_seqs, held = seqs[:seqs.shape[0] - n_held], seqs[seqs.shape[0] - n_held:]
    state = load_state(work)
    steps = (int(state["steps"]) if state is not None else cfg.steps if cfg.minutes is None
             else steps_for_minutes(model, train_seqs, cfg, choice.bf16, rep))
    if state is None:  # a --minutes budget keeps the step count it measured first
        save_state(work, {"steps": steps})
    t0, c1 = time.monotonic(), time.process_time()
    run = train_draft(model, train_seqs, cfg, steps, choice.bf16, rep, held, resume=state,
                      checkpoint=lambda st: save_state(work, st))
    losses = run.losses
    params = sum(p.numel() for p in model.parameters())
    train: dict[str, Any] = {
        "config": cfg.to_dict(), "dtype": choice.to_dict(), "steps": steps,
        "parameters": params, "train_sequences": list(train_seqs.shape),
        "first_loss": losses[0], "final_loss": tail_mean(losses),
        "kept_step": run.kept_step, "heldout_curve": run.curve,
        "train_seconds_last_session": round(time.monotonic() - t0, 2),
        "train_cpu_seconds_last_session": round(time.process_time() - c1, 2),
        "distill_cpu_seconds": round(distill_cpu, 2),
        "heldout": teacher_forced(model, held, cfg.prompt_len) if n_held else {}}
    with staged_output(out, force, WRITER) as stage:
        save_draft(model, Path(cfg.model), stage)
        write_json_atomic(stage / "train_info.json", train)
        ev = heldout_eval(cfg, stage, held, rep, "draft", draft_dir=stage)
    shutil.rmtree(work, ignore_errors=True)
    return DraftResult(out, steps, losses[0], train["final_loss"], train, ev)
