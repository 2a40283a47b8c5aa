"""``specserve train-medusa``: Medusa-1 heads for a local Hugging Face causal LM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from specserve.cli._options import TRAIN_DTYPE_OPTION
from specserve.cli._output import FORMAT_OPTION, emit


def _summary(data: dict[str, Any]) -> str:
    acc = ", ".join(f"{a:.2f}" for a in data["heldout_top1_accuracy"])
    return (f"wrote {data['out']} ({data['steps']} steps, final loss {data['final_loss']:.3f})"
            + (f"\nheld-out top-1 accuracy per head [{acc}]" if acc else ""))


@click.command("train-medusa", short_help="Train Medusa-1 heads for a local HF causal LM.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Local Hugging Face model directory (config.json, weights, tokenizer).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Output directory: config.json + medusa_lm_head.safetensors.")
@click.option("--heads", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--layers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="ResBlocks per head.")
@click.option("--data", type=click.Path(path_type=Path), default=None,
              help="Text or JSONL ('text' per line) to train on, or a chat set from "
                   "`specserve prompts` whose chat-templated prompts the model answers "
                   "(self-distillation); default: the model's own greedy generations.")
@click.option("--samples", type=click.IntRange(1), default=256, show_default=True,
              help="Training sequences.")
@click.option("--prompt-len", type=click.IntRange(1), default=16, show_default=True)
@click.option("--gen-len", type=click.IntRange(1), default=112, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=300, show_default=True)
@click.option("--batch-tokens", type=click.IntRange(1), default=1024, show_default=True)
@click.option("--lr", type=float, default=3e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--save-every", type=click.IntRange(1), default=100, show_default=True,
              help="Checkpoint interval (steps); a rerun with the same flags resumes.")
@click.option("--threads", type=click.IntRange(1, 256), default=None, help="torch CPU threads.")
@TRAIN_DTYPE_OPTION
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@FORMAT_OPTION
def command(model_dir: Path, out: Path, heads: int, layers: int, data: Path | None,
            samples: int, prompt_len: int, gen_len: int, steps: int, batch_tokens: int,
            lr: float, seed: int, device: str, save_every: int, threads: int | None,
            dtype: str, force: bool, fmt: str) -> None:
    """Train Medusa-1 heads (frozen base) and save them in the FasterDecoding layout that
    TensorRT-LLM's converter and `specserve build --medusa` read. An interrupted run resumes
    from OUT's sibling `.OUT.partial/` when rerun with the same flags.

    \b
    Examples:
      specserve train-medusa --model checkpoints/demo/target --out heads/ --heads 4
      specserve train-medusa --model ./my-llama --out heads/ --data prompts.jsonl --device cuda
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from specserve.cli.demo_model import _quiet_transformers
    from specserve.train.medusa_train import MedusaTrainConfig, run_train_medusa
    from specserve.train.progress import RichReporter

    _quiet_transformers()
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = MedusaTrainConfig(
        model=str(model_dir), out=str(out), heads=heads, layers=layers,
        data=str(data) if data else None, samples=samples, prompt_len=prompt_len,
        gen_len=gen_len, steps=steps, batch_tokens=batch_tokens, lr=lr, seed=seed,
        device=device, save_every=save_every, dtype=dtype)
    with RichReporter() as rep:
        res = run_train_medusa(cfg, rep, force=force)
    emit({"out": str(res.out), "steps": res.steps, "final_loss": res.final_loss,
          "heldout_top1_accuracy": list(res.top1_accuracy),
          "dtype": res.dtype.to_dict() if res.dtype else None}, fmt, _summary)
