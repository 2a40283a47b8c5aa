"""``specserve train-draft``: a small draft model distilled from a local HF causal LM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from specserve.cli._options import SELF_DISTILL_OPTIONS, TRAIN_DTYPE_OPTION
from specserve.cli._output import FORMAT_OPTION, decode_eval_line, emit


def _summary(data: dict[str, Any]) -> str:
    held = data.get("heldout") or {}
    lines = [f"wrote {data['out']} ({data['parameters'] / 1e6:.1f}M parameters, "
             f"{data['steps']} steps, loss {data['first_loss']:.3f} -> "
             f"{data['final_loss']:.3f})"]
    if held:
        lines.append(f"held-out teacher-forced top-1 {held['top1']:.2f}, cross-entropy "
                     f"{held['cross_entropy']:.3f}")
    ev = data.get("eval") or {}
    if ev:
        lines.append(decode_eval_line(ev))
    return "\n".join(lines)


@click.command("train-draft", short_help="Distill a small draft model from a local HF causal LM.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="The target: a local Hugging Face model directory (config.json, weights, "
                   "tokenizer).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Output: a Hugging Face Llama directory with the target's tokenizer, plus "
                   "train_info.json and eval.json.")
@click.option("--hidden", type=click.IntRange(1), default=256, show_default=True,
              help="The draft's hidden size (its tied [vocab, hidden] head is read per draft "
                   "token).")
@click.option("--layers", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--heads", type=click.IntRange(1), default=4, show_default=True,
              help="Attention heads.")
@click.option("--kv-heads", type=click.IntRange(1), default=None,
              help="Key/value heads [default: --heads].")
@click.option("--intermediate-size", type=click.IntRange(1), default=None,
              help="MLP width [default: ~2.75 x --hidden].")
@click.option("--embed-init", type=click.Choice(["svd", "random"]), default="svd",
              show_default=True,
              help="svd: the target's embedding on its top --hidden singular directions; "
                   "random: N(0, 0.02).")
@SELF_DISTILL_OPTIONS
@TRAIN_DTYPE_OPTION
@click.option("--force", is_flag=True, help="Replace OUT if a previous train-draft wrote it.")
@FORMAT_OPTION
def command(model_dir: Path, out: Path, hidden: int, layers: int, heads: int,
            kv_heads: int | None, intermediate_size: int | None, embed_init: str,
            data: Path | None, samples: int, prompt_len: int, gen_len: int, steps: int,
            minutes: float | None, batch_seqs: int, lr: float, eval_prompts: int,
            eval_gen_len: int, max_draft_len: int, seed: int, device: str,
            threads: int | None, dtype: str, force: bool, fmt: str) -> None:
    """Train a small Llama draft model with the target's vocabulary and tokenizer on the
    target's own greedy answers (sequence-level distillation), then decode held-out prompts
    with it (tau, per-position acceptance, tokens/s vs plain). OUT loads in `specserve
    generate/build --draft OUT`. An interrupted run resumes from OUT's sibling
    `.OUT.partial/` when rerun with the same flags.

    \b
    Examples:
      specserve train-draft --model checkpoints/demo/target --out drafts/draft --steps 200
      specserve train-draft --model ./my-llama --out draft/ --data chat.jsonl \\
          --prompt-len 64 --gen-len 96 --hidden 256 --layers 4 --minutes 15 --threads 1
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from specserve.cli.demo_model import _quiet_transformers
    from specserve.train.draft_train import DraftTrainConfig, run_train_draft
    from specserve.train.progress import RichReporter

    _quiet_transformers()
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = DraftTrainConfig(
        model=str(model_dir), out=str(out), hidden=hidden, layers=layers, heads=heads,
        kv_heads=kv_heads, intermediate_size=intermediate_size, embed_init=embed_init,
        data=str(data) if data else None, samples=samples, prompt_len=prompt_len,
        gen_len=gen_len, steps=steps, minutes=minutes, batch_seqs=batch_seqs, lr=lr,
        eval_prompts=eval_prompts, eval_gen_len=eval_gen_len, max_draft_len=max_draft_len,
        seed=seed, device=device, dtype=dtype)
    with RichReporter() as rep:
        res = run_train_draft(cfg, rep, force=force)
    emit({"out": str(res.out), "steps": res.steps, "parameters": res.train["parameters"],
          "first_loss": res.first_loss, "final_loss": res.final_loss,
          "heldout": res.train["heldout"], "eval": res.eval, "dtype": res.train["dtype"]},
         fmt, _summary)
