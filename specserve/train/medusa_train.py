"""``specserve train-medusa``: Medusa-1 heads for any local Hugging Face causal LM (Cai et al.
2024, §2.2.1 Medusa-1 with the §2.3.2 self-distillation recipe).

Data: without ``--data`` the model writes its own training set (prompts sampled after BOS, then
greedy continuations, so labels are exactly what the model emits at T=0); with ``--data`` a text
file, or JSONL with a ``text`` (or ``prompt`` + ``completion``/``response``) field per line, is
cut into windows. The base model's final hidden states are computed once (frozen base), then
only the heads train; the last ``heldout_fraction`` of the sequences is kept out of training
for the reported per-head top-1 accuracy (independent samples under self-distillation; with a
data file, random windows of the same text, so it may overlap). Work happens in
``.OUT.partial/`` next to ``OUT``: the sequences, a resumable training state every
``save_every`` steps, and the finished heads, renamed into place.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.config import JsonConfig, write_json_atomic
from specserve.cpu_dtype import REQUESTS, DtypeChoice, choose_dtype
from specserve.errors import SpecserveError
from specserve.outputs import check_replaceable, mark, swap_into_place
from specserve.train.lm import Schedule, lr_at
from specserve.train.medusa import (
    IGNORE,
    MedusaHeads,
    final_hidden,
    head_top1_accuracy,
    medusa_labels,
    medusa_loss,
    save_medusa,
)
from specserve.train.progress import NullReporter, Reporter
from specserve.train.resume import (
    cached_tensors,
    load_state,
    prepare_work,
    save_state,
    work_dir,
)

WRITER = "specserve train-medusa"

CheckpointFn = Callable[[int, torch.optim.Optimizer], None]


@dataclass(frozen=True)
class MedusaTrainConfig(JsonConfig):
    """Everything that determines a train-medusa run (saved as ``train_config.json``)."""

    model: str
    out: str
    heads: int = 4
    layers: int = 1
    data: str | None = None
    samples: int = 256
    prompt_len: int = 16
    gen_len: int = 112
    steps: int = 300
    batch_tokens: int = 1024
    lr: float = 3e-3
    seed: int = 0
    device: str = "cpu"
    save_every: int = 100
    dtype: str = "auto"  # autocast dtype: auto (specserve.cpu_dtype) | float32 | bfloat16
    heldout_fraction: float = 0.1

    def validate(self) -> None:
        for name in ("heads", "layers", "samples", "prompt_len", "gen_len", "steps",
                     "batch_tokens", "save_every"):
            if getattr(self, name) < 1:
                raise SpecserveError(f"train-medusa: --{name.replace('_', '-')} must be >= 1")
        if self.lr <= 0 or not 0 <= self.heldout_fraction < 1:
            raise SpecserveError("train-medusa: lr must be > 0 and heldout_fraction in [0, 1)")
        if self.dtype not in REQUESTS:
            raise SpecserveError(f"train-medusa: --dtype {self.dtype!r}: choose one of "
                                 f"{', '.join(REQUESTS)}")


@dataclass(frozen=True)
class HeadsResult:
    """Outcome of head training."""

    out: Path
    steps: int
    final_loss: float
    top1_accuracy: tuple[float, ...]
    dtype: DtypeChoice | None = None


def _schedule(cfg: MedusaTrainConfig, bf16: bool) -> Schedule:
    return Schedule(steps=cfg.steps, batch_size=cfg.batch_tokens, seq_len=1, lr=cfg.lr,
                    warmup_steps=min(20, cfg.steps // 10), weight_decay=0.0, bf16=bf16)


def train_heads(heads: MedusaHeads, hidden: torch.Tensor, labels: torch.Tensor, s: Schedule,
                g: torch.Generator, start_step: int = 0, opt_state: dict[str, Any] | None = None,
                reporter: Reporter | None = None,
                checkpoint: CheckpointFn | None = None) -> list[float]:
    """Train ``heads`` on positions sampled from hidden [N, T, H] / labels [N, T, heads].

    ``checkpoint(step, opt)`` is called after every step (it decides whether to save);
    resuming passes ``start_step``, ``opt_state`` and a generator restored to the saved state.
    """
    rep = reporter or NullReporter()
    device = next(heads.parameters()).device
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # [N*T, H]
    flat_y = labels.reshape(-1, labels.shape[-1])  # [N*T, heads]
    keep = (flat_y != IGNORE).any(-1).nonzero().squeeze(-1)  # positions with any label
    if keep.numel() == 0:
        raise SpecserveError("train-medusa: no training positions (sequences too short?)")
    opt = torch.optim.AdamW(heads.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    heads.train()
    losses: list[float] = []
    rep.start("medusa heads", s.steps)
    for step in range(start_step, s.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        idx = keep[torch.randint(0, keep.numel(), (s.batch_size,), generator=g)]
        x, y = flat_h[idx].to(device).float(), flat_y[idx].to(device)  # [b, H], [b, heads]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            logits = heads(x)  # [b, heads, V]
        loss, per_head = medusa_loss(logits, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        rep.update(step + 1, f"loss {losses[-1]:.3f} head0 {per_head[0]:.2f}")
        if checkpoint is not None:
            checkpoint(step + 1, opt)
    heads.eval()
    return losses


def load_causal_lm(path: str | Path, device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) from a local HF directory, offline; fp32 on CPU, bf16 on CUDA."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if not (p / "config.json").is_file():
        raise SpecserveError(f"{p}: no config.json (not a Hugging Face model directory)")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(p), local_files_only=True, dtype=dtype)
    except (OSError, ValueError, KeyError) as e:
        raise SpecserveError(f"{p}: cannot load model or tokenizer ({str(e)[:200]})") from e
    return model.to(device).eval(), tok  # type: ignore[arg-type]


def read_data_file(path: Path) -> list[str]:
    """Texts of a ``.txt`` file (one text) or ``.jsonl`` file (one object per line)."""
    if not path.is_file():
        raise SpecserveError(f"{path}: data file not found")
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".jsonl":
        return [raw]
    texts = []
    for i, line in enumerate(raw.split("\n"), 1):  # JSON Lines: not at U+2028 (splitlines)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecserveError(f"{path}:{i}: invalid JSON ({e.msg})") from e
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            texts.append(obj["text"])
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            texts.append(obj["prompt"] + str(obj.get("completion", obj.get("response", ""))))
        else:
            raise SpecserveError(f"{path}:{i}: expected an object with 'text' or 'prompt'")
    return texts


def make_sequences(cfg: MedusaTrainConfig, model: Any, tok: Any, g: torch.Generator,
                   rep: Reporter) -> tuple[torch.Tensor, int]:
    """Training sequences [N, prompt_len + gen_len] and the first position whose token is a
    trustworthy label (the start of the model's own continuation; 0 for a data file)."""
    from specserve.train.distill import (
        chat_prompts,
        greedy_continue,
        is_chat_dataset,
        sample_prompts,
        sampled_prompts,
    )
    from specserve.train.tokenizer import concat_with_eos, encode_documents

    length = cfg.prompt_len + cfg.gen_len
    if cfg.data is not None and is_chat_dataset(Path(cfg.data)):
        prompts = chat_prompts(tok, Path(cfg.data), cfg.samples, cfg.prompt_len, g)
    elif cfg.data is not None:
        stream = concat_with_eos(encode_documents(tok, read_data_file(Path(cfg.data))),
                                 tok.eos_token_id if tok.eos_token_id is not None else 0)
        if stream.numel() <= length:
            raise SpecserveError(f"{cfg.data}: {stream.numel()} tokens, need more than {length}")
        return sample_prompts(stream, cfg.samples, length, g), 0
    else:
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if bos is None:
            raise SpecserveError(f"{cfg.model}: tokenizer has neither a BOS nor an EOS token")
        prompts = sampled_prompts(model, bos, cfg.samples, cfg.prompt_len, g)  # [N, P]
    rep.start("self-distill", cfg.samples)
    seqs = greedy_continue(model, prompts, cfg.gen_len,
                           on_batch=lambda d, _t: rep.update(d))
    return seqs, cfg.prompt_len


def _load_or_make_sequences(cfg: MedusaTrainConfig, work: Path, model: Any, tok: Any,
                            g: torch.Generator, rep: Reporter,
                            sequences: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    def make() -> dict[str, torch.Tensor]:
        if sequences is not None:
            seqs, first = sequences, cfg.prompt_len
        else:
            seqs, first = make_sequences(cfg, model, tok, g, rep)
        return {"seqs": seqs, "first_label": torch.tensor(first)}

    d = cached_tensors(work, make, rep)
    return d["seqs"], int(d["first_label"])


def _checkpointer(cfg: MedusaTrainConfig, work: Path, heads: MedusaHeads,
                  g: torch.Generator) -> CheckpointFn:
    def save(step: int, opt: torch.optim.Optimizer) -> None:
        if step % cfg.save_every and step != cfg.steps:
            return
        save_state(work, {"step": step, "heads": heads.state_dict(), "opt": opt.state_dict(),
                          "rng": g.get_state()})
    return save


def run_train_medusa(cfg: MedusaTrainConfig, reporter: Reporter | None = None, *,
                     sequences: torch.Tensor | None = None, base_model_name: str | None = None,
                     force: bool = False) -> HeadsResult:
    """Train Medusa-1 heads for ``cfg.model`` and write them to ``cfg.out`` (atomic rename).

    ``sequences`` [N, prompt_len + gen_len] (the model's own greedy continuations) skips data
    generation; an interrupted run with the same config resumes from its last checkpoint.
    """
    cfg.validate()
    rep = reporter or NullReporter()
    out = Path(cfg.out)
    check_replaceable(out, force, WRITER)
    torch.manual_seed(cfg.seed)
    model, tok = load_causal_lm(cfg.model, cfg.device)
    choice = choose_dtype(cfg.dtype, cfg.device)
    rep.log(f"training dtype {choice.dtype} ({choice.reason})")
    work = work_dir(out)
    prepare_work(cfg.to_json(), work, rep)
    g_data = torch.Generator().manual_seed(cfg.seed)
    seqs, first = _load_or_make_sequences(cfg, work, model, tok, g_data, rep, sequences)
    n_held = int(seqs.shape[0] * cfg.heldout_fraction)
    train_seqs, held_seqs = seqs[: seqs.shape[0] - n_held], seqs[seqs.shape[0] - n_held:]
    rep.log(f"hidden states of {train_seqs.shape[0]} x {train_seqs.shape[1]} tokens")
    hidden = final_hidden(model, train_seqs).to(torch.bfloat16)  # [N, T, H]
    labels = medusa_labels(train_seqs, cfg.heads, first)  # [N, T, heads]
    lm_head = model.get_output_embeddings().weight  # [V, H]
    heads = MedusaHeads(hidden.shape[-1], lm_head.shape[0], cfg.heads, cfg.layers)
    heads.init_lm_heads(lm_head)
    heads.to(cfg.device)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    start, opt_state = 0, None
    state = load_state(work)
    if state is not None:
        heads.load_state_dict(state["heads"])
        g.set_state(state["rng"])
        start, opt_state = int(state["step"]), state["opt"]
        rep.log(f"resuming at step {start}")
    losses = train_heads(heads, hidden, labels, _schedule(cfg, choice.bf16), g, start, opt_state,
                         rep, _checkpointer(cfg, work, heads, g))
    acc: list[float] = []
    if n_held:
        acc = head_top1_accuracy(heads.cpu(), final_hidden(model, held_seqs),
                                 medusa_labels(held_seqs, cfg.heads, first))
    result = work / "result"
    shutil.rmtree(result, ignore_errors=True)
    save_medusa(heads, result, base_model_name or cfg.model)
    info = {"config": cfg.to_dict(), "final_loss": losses[-1] if losses else None,
            "heldout_top1_accuracy": acc, "dtype": choice.to_dict()}
    write_json_atomic(result / "train_info.json", info)
    mark(result, WRITER)
    swap_into_place(result, out)
    shutil.rmtree(work)
    return HeadsResult(out, cfg.steps, losses[-1] if losses else float("nan"), tuple(acc),
                       choice)
