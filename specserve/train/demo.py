"""The embedded demo model: a small Llama code model trained on the running interpreter's
standard library, a distilled draft on the same tokenizer, Medusa-1 heads and an EAGLE-3 head,
built offline on CPU in a few minutes (``specserve demo-model``).

Recipe: byte-level BPE; target trained on the corpus (AdamW, cosine); the target's own greedy
continuations of corpus prompts (self-distillation) train the draft (DistillSpec, Zhou et al.
2024), the Medusa heads (Cai et al. 2024, §2.3.2) and the EAGLE-3 head (Li et al. 2025, with the
training-time test: :mod:`specserve.train.eagle3`). Step counts are a pure function of
``--minutes`` (linear in it from the 5-minute schedule), the same on every CPU and in either
dtype, so a run is deterministic for a seed, a budget and a dtype; a slower or busier machine
takes longer rather than training less. The dtype is the one this CPU runs fast
(:mod:`specserve.cpu_dtype`: bfloat16 autocast where oneDNN has bf16 kernels and a timed matmul
agrees, else float32; ``--dtype`` overrides), recorded with its evidence in ``eval.json``
("dtype"). Without that choice an AVX2-only CPU ran bf16 autocast emulated, ~10x slower than
float32. The wall time is what the machine takes for those steps: ``--minutes 5`` took 5.1
minutes on 2 lightly shared AVX-512-BF16 cores in bfloat16 and 10.8 minutes on an (emulated)
AVX2-only CPU in float32 (docs/results.md, "Training time and dtype").
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from specserve.config import JsonConfig, write_json_atomic
from specserve.cpu_dtype import REQUESTS, DtypeChoice, choose_dtype
from specserve.errors import SpecserveError
from specserve.outputs import staged_output
from specserve.train import corpus
from specserve.train.lm import LlamaShape, Schedule, make_llama, rows_batch, stream_batch, train_lm
from specserve.train.progress import NullReporter, Reporter

WRITER = "specserve demo-model"


def llama_shape(hidden: int, layers: int, heads: int) -> LlamaShape:
    """Llama proportions: head dim hidden/heads, MLP width ~2.75x hidden (multiple of 32)."""
    if hidden % heads:
        raise SpecserveError(f"demo-model: hidden {hidden} not divisible by heads {heads}")
    return LlamaShape(hidden_size=hidden, layers=layers, heads=heads, kv_heads=heads,
                      intermediate_size=max(32, (hidden * 11 // 4) // 32 * 32))


@dataclass(frozen=True)
class DemoConfig(JsonConfig):
    """Resolved demo settings (saved as ``demo_config.json``). Use :meth:`for_minutes`."""

    seed: int = 0
    minutes: float = 5.0
    corpus_root: str | None = None  # None: the running interpreter's standard library
    target_hidden: int = 256
    target_layers: int = 4
    target_heads: int = 4
    draft_hidden: int = 128
    draft_layers: int = 2
    draft_heads: int = 2
    vocab_size: int = 4096
    corpus_chars: int = 4_000_000
    heldout_files: int = 40
    target_steps: int = 240
    target_batch: int = 16
    seq_len: int = 256
    target_lr: float = 2e-3
    distill_samples: int = 768
    prompt_len: int = 32
    gen_len: int = 96
    draft_steps: int = 250
    draft_batch: int = 32
    draft_lr: float = 3e-3
    medusa_heads: int = 4
    medusa_layers: int = 1
    medusa_steps: int = 150
    medusa_batch_tokens: int = 1024
    medusa_lr: float = 3e-3
    # EAGLE-3: a slim head (MLP 256, 2 attention heads, 1024 draft ids: ~2.7 MB against the
    # full-width layer's 6 MB): on this 4-layer target a head as wide as a target layer costs a
    # quarter of a verify forward per draft token; the slim one reaches the same tau
    # (docs/results.md, "Which method is fastest?")
    eagle3_steps: int = 450
    eagle3_batch_seqs: int = 8
    eagle3_lr: float = 3e-3
    eagle3_draft_vocab: int = 1024
    eagle3_ttt_steps: int = 4
    eagle3_intermediate: int = 256
    eagle3_heads: int = 2
    eval_prompts: int = 16
    eval_gen_len: int = 128
    decoder_eval: bool = True
    threads: int = 2
    dtype: str = "auto"  # training autocast: auto (specserve.cpu_dtype) | float32 | bfloat16

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and f.name != "seed" and value <= 0:
                raise SpecserveError(f"demo-model: {f.name} must be > 0, got {value}")
        if self.prompt_len < 2:
            raise SpecserveError("demo-model: prompt_len must be >= 2")
        if self.dtype not in REQUESTS:
            raise SpecserveError(f"demo-model: --dtype {self.dtype!r}: choose one of "
                                 f"{', '.join(REQUESTS)}")

    @classmethod
    def for_minutes(cls, minutes: float, seed: int = 0, **overrides: Any) -> DemoConfig:
        """Step counts scaled linearly from the 5-minute schedule (data sizes fixed)."""
        if minutes <= 0:
            raise SpecserveError(f"demo-model: --minutes must be > 0, got {minutes}")
        base = cls()
        f = minutes / base.minutes
        cfg = replace(base, seed=seed, minutes=minutes,
                      target_steps=max(10, round(base.target_steps * f)),
                      draft_steps=max(10, round(base.draft_steps * f)),
                      medusa_steps=max(10, round(base.medusa_steps * f)),
                      eagle3_steps=max(10, round(base.eagle3_steps * f)))
        return replace(cfg, **overrides)


@dataclass(frozen=True)
class DemoResult:
    """Where the checkpoint went, the evaluation, and wall time per phase (seconds)."""

    out: Path
    eval: dict[str, Any]
    timings: dict[str, float]


class _Timer:
    def __init__(self, rep: Reporter) -> None:
        self.rep, self.t0, self.c0 = rep, time.monotonic(), time.process_time()
        self.times: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.last, self.last_cpu = self.t0, self.c0

    def done(self, phase: str, note: str = "") -> None:
        """Record wall and process CPU seconds of ``phase`` (CPU time is what a busy, shared
        machine inflates least)."""
        now, cpu = time.monotonic(), time.process_time()
        self.times[phase] = round(now - self.last, 2)
        self.cpu[phase] = round(cpu - self.last_cpu, 2)
        self.last, self.last_cpu = now, cpu
        self.rep.log(f"{phase}: {self.times[phase]:.1f}s (cpu {self.cpu[phase]:.1f}s) {note}")


def _data(cfg: DemoConfig, work: Path, timer: _Timer) -> tuple[Any, torch.Tensor,
                                                                 list[torch.Tensor]]:
    """Tokenizer, training token stream [N] and held-out documents; writes corpus.json."""
    from specserve.train.tokenizer import concat_with_eos, encode_documents, train_tokenizer

    root = Path(cfg.corpus_root) if cfg.corpus_root else None
    split = corpus.stdlib_split(cfg.seed, cfg.heldout_files, root)
    names = corpus.shuffled(split.train, cfg.seed)
    texts = corpus.read_texts(split.root, names, cfg.corpus_chars)
    used = tuple(sorted(names[: len(texts)]))
    tok = train_tokenizer(texts, work / "tokenizer", cfg.vocab_size)
    stream = concat_with_eos(encode_documents(tok, texts), tok.eos_token_id)
    held = encode_documents(tok, corpus.read_texts(split.root, split.heldout))
    write_json_atomic(work / "corpus.json", {"root": str(split.root), "train_files": list(used),
                                             "heldout_files": list(split.heldout)})
    timer.done("data", f"{len(used)} files, {stream.numel()} tokens, vocab {len(tok)}")
    return tok, stream, held


def _save_hf(model: Any, tok: Any, path: Path) -> None:
    model.save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))


def _train(shape: LlamaShape, tok: Any, seed: int, s: Schedule, batches: Any, name: str,
           rep: Reporter) -> tuple[Any, float]:
    model = make_llama(shape, tok, seed)
    rep.start(name, s.steps)
    res = train_lm(model, batches, s, seed,
                   lambda i, _n, loss: rep.update(i, f"loss {loss:.3f}"))
    return model, res.final_loss


def heldout_prompts(docs: list[torch.Tensor], n: int, length: int,
                    g: torch.Generator) -> torch.Tensor:
    """``n`` prompts [n, length] at seeded random offsets of held-out documents."""
    long_docs = [d for d in docs if d.numel() > 2 * length]
    if not long_docs:
        raise SpecserveError("demo-model: held-out files too short for evaluation prompts")
    rows = []
    for _ in range(n):
        d = long_docs[int(torch.randint(0, len(long_docs), (1,), generator=g))]
        s = int(torch.randint(0, d.numel() - length, (1,), generator=g))
        rows.append(d[s:s + length])
    return torch.stack(rows)


def _build(cfg: DemoConfig, work: Path, rep: Reporter, timer: _Timer,
           dtype: DtypeChoice) -> dict[str, Any]:
    from specserve.spec.tree import MC_SIM_7B_63
    from specserve.train.distill import greedy_continue, sample_prompts
    from specserve.train.eagle3 import run_train_eagle3
    from specserve.train.eagle3_config import Eagle3TrainConfig
    from specserve.train.evaluate import evaluate_models
    from specserve.train.medusa import load_medusa
    from specserve.train.medusa_train import MedusaTrainConfig, run_train_medusa

    tok, stream, held = _data(cfg, work, timer)
    g = torch.Generator().manual_seed(cfg.seed)
    ts = Schedule(cfg.target_steps, cfg.target_batch, cfg.seq_len, cfg.target_lr,
                  bf16=dtype.bf16)
    target_shape = llama_shape(cfg.target_hidden, cfg.target_layers, cfg.target_heads)
    target, t_loss = _train(target_shape, tok, cfg.seed, ts,
                            lambda gen: stream_batch(stream, ts.batch_size, ts.seq_len, gen),
                            "target", rep)
    _save_hf(target, tok, work / "target")
    timer.done("target", f"loss {t_loss:.3f}")
    rep.start("self-distill", cfg.distill_samples)
    prompts = sample_prompts(stream, cfg.distill_samples, cfg.prompt_len, g)  # [N, P]
    seqs = greedy_continue(target, prompts, cfg.gen_len, on_batch=lambda d, _t: rep.update(d))
    timer.done("distill", f"{seqs.shape[0]} x {seqs.shape[1]} tokens")
    ds = Schedule(cfg.draft_steps, cfg.draft_batch, seqs.shape[1], cfg.draft_lr,
                  bf16=dtype.bf16)
    draft_shape = llama_shape(cfg.draft_hidden, cfg.draft_layers, cfg.draft_heads)
    draft, d_loss = _train(draft_shape, tok, cfg.seed + 1, ds,
                           lambda gen: rows_batch(seqs, ds.batch_size, gen), "draft", rep)
    _save_hf(draft, tok, work / "draft")
    timer.done("draft", f"loss {d_loss:.3f}")
    mcfg = MedusaTrainConfig(
        model=str(work / "target"), out=str(work / "medusa"), heads=cfg.medusa_heads,
        layers=cfg.medusa_layers, samples=cfg.distill_samples, prompt_len=cfg.prompt_len,
        gen_len=cfg.gen_len, steps=cfg.medusa_steps, batch_tokens=cfg.medusa_batch_tokens,
        lr=cfg.medusa_lr, seed=cfg.seed, heldout_fraction=0.0, dtype=dtype.dtype)
    run_train_medusa(mcfg, rep, sequences=seqs, base_model_name="target")
    timer.done("medusa")
    ecfg = Eagle3TrainConfig(
        model=str(work / "target"), out=str(work / "eagle3"),
        draft_vocab=min(cfg.eagle3_draft_vocab, len(tok)), ttt_steps=cfg.eagle3_ttt_steps,
        intermediate_size=cfg.eagle3_intermediate, num_heads=cfg.eagle3_heads,
        samples=cfg.distill_samples, prompt_len=cfg.prompt_len, gen_len=cfg.gen_len,
        steps=cfg.eagle3_steps, batch_seqs=cfg.eagle3_batch_seqs, lr=cfg.eagle3_lr,
        seed=cfg.seed, heldout_fraction=0.0, eval_prompts=0, dtype=dtype.dtype)
    e3 = run_train_eagle3(ecfg, rep, sequences=seqs)
    timer.done("eagle3", f"loss {e3.first_loss:.3f} -> {e3.final_loss:.3f}")
    eval_prompts = heldout_prompts(held, cfg.eval_prompts, cfg.prompt_len, g)
    result = evaluate_models(target, draft, load_medusa(work / "medusa"), eval_prompts,
                             cfg.eval_gen_len, MC_SIM_7B_63, k=4)
    result["train"] = {"target_loss": t_loss, "draft_loss": d_loss,
                       "eagle3_loss": e3.final_loss}
    result["eagle3"] = {"k": 4, "ttt_steps": cfg.eagle3_ttt_steps,
                        "draft_vocab": e3.train["draft_vocab"],
                        "draft_vocab_coverage": e3.train["draft_vocab_coverage"]}
    result["ngram"] = {"k": 4}
    timer.done("eval")
    if cfg.decoder_eval:
        _add_decoder_eval(result, work, eval_prompts.tolist(), cfg.eval_gen_len)
        timer.done("decoder-eval")
    return result


def _add_decoder_eval(result: dict[str, Any], work: Path, prompts: list[list[int]],
                      max_tokens: int) -> None:
    """tau and tokens/s measured by specserve.runtime, merged into the eval sections."""
    try:
        from specserve.train.decoder_eval import decoder_eval

        dec = decoder_eval(work, prompts, max_tokens, k=4)
    except (ImportError, SpecserveError) as e:
        result["decoder_error"] = f"reference decoder unavailable: {e}"
        return
    result["baseline_tokens_per_s"] = dec["baseline_tokens_per_s"]
    result["medusa"].update(dec["medusa"])
    result["draft"].update(dec["draft"])
    result["medusa_tuned"] = dec["medusa_tuned"]
    for mode in ("eagle3", "ngram"):
        if mode in dec:
            result[mode].update(dec[mode])
    result["fastest_method"] = dec["fastest_method"]
    result["served_prompts"] = dec["served_prompts"]


def build_demo(cfg: DemoConfig, out: Path, reporter: Reporter | None = None,
               force: bool = False) -> DemoResult:
    """Build tokenizer, target, draft, Medusa heads, EAGLE-3 head and eval.json into ``out``
    (atomically)."""
    cfg.validate()
    rep = reporter or NullReporter()
    torch.set_num_threads(cfg.threads)
    timer = _Timer(rep)
    dtype = choose_dtype(cfg.dtype)
    with staged_output(out, force, WRITER) as work:  # refuses a directory we did not write
        rep.log(f"training dtype {dtype.dtype} ({dtype.reason})")
        (work / "demo_config.json").write_text(cfg.to_json())
        ev = _build(cfg, work, rep, timer, dtype)
        ev["dtype"] = dtype.to_dict()  # the training dtype and why (specserve.cpu_dtype)
        ev["timings_s"] = dict(timer.times)
        ev["timings_s"]["total"] = round(time.monotonic() - timer.t0, 2)
        ev["cpu_s"] = dict(timer.cpu)
        ev["cpu_s"]["total"] = round(time.process_time() - timer.c0, 2)
        write_json_atomic(work / "eval.json", ev)
    return DemoResult(out, ev, dict(ev["timings_s"]))
