"""``specserve train-eagle3``: an EAGLE-3 draft head for a local HF causal LM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from specserve.cli._options import SELF_DISTILL_OPTIONS, TRAIN_DTYPE_OPTION
from specserve.cli._output import FORMAT_OPTION, decode_eval_line, emit


def _summary(data: dict[str, Any]) -> str:
    lines = [f"wrote {data['out']} ({data['steps']} steps, loss {data['first_loss']:.3f} -> "
             f"{data['final_loss']:.3f}, draft vocab {data['draft_vocab']})"]
    ev = data.get("eval") or {}
    if ev:
        lines.append(decode_eval_line(ev))
    return "\n".join(lines)


@click.command("train-eagle3", short_help="Train an EAGLE-3 draft head for a local HF causal LM.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Local Hugging Face model directory (config.json, weights, tokenizer).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Output: the portable EAGLE-3 directory (config.json, model.safetensors) "
                   "plus train_info.json and eval.json.")
@click.option("--draft-vocab", type=int, default=None,
              help="Draft vocabulary: the N most frequent target ids in the training data "
                   "[default: min(vocab, 32000)].")
@click.option("--intermediate-size", type=click.IntRange(1), default=None,
              help="The head's MLP width [default: the target's]; smaller is a cheaper step.")
@click.option("--num-heads", type=click.IntRange(1), default=None,
              help="The head's attention heads (as many KV heads) [default: the target's].")
@click.option("--ttt-steps", type=click.IntRange(1, 16), default=3, show_default=True,
              help="Training-time-test steps (EAGLE-3 uses 7 at scale).")
@SELF_DISTILL_OPTIONS
@TRAIN_DTYPE_OPTION
@click.option("--force", is_flag=True, help="Replace OUT if a previous train-eagle3 wrote it.")
@FORMAT_OPTION
def command(model_dir: Path, out: Path, draft_vocab: int | None,
            intermediate_size: int | None, num_heads: int | None, ttt_steps: int,
            data: Path | None, samples: int, prompt_len: int, gen_len: int, steps: int,
            minutes: float | None, batch_seqs: int, lr: float, eval_prompts: int,
            eval_gen_len: int, max_draft_len: int, seed: int, device: str,
            threads: int | None, dtype: str, force: bool, fmt: str) -> None:
    """Train an EAGLE-3 head (one decoder layer over three fused target layers, a reduced
    draft vocabulary with d2t/t2d) on the target's own greedy generations with the
    training-time test, then decode held-out prompts with it (tau, per-position acceptance,
    tokens/s vs plain). OUT loads in `specserve build/generate --eagle3 OUT` and in vLLM /
    SGLang / TensorRT-LLM's PyTorch backend as an EAGLE-3 draft.

    \b
    Examples:
      specserve train-eagle3 --model checkpoints/demo/target --out heads/eagle3
      specserve train-eagle3 --model ./my-llama --out e3/ --minutes 30 --draft-vocab 32000
      specserve train-eagle3 --model ./my-llama --out e3/ --data prompts.jsonl --ttt-steps 7
      specserve train-eagle3 --model checkpoints/demo/target --out e3-slim/ \\
          --intermediate-size 256 --num-heads 2 --draft-vocab 1024
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from specserve.cli.demo_model import _quiet_transformers
    from specserve.train.eagle3 import run_train_eagle3
    from specserve.train.eagle3_config import Eagle3TrainConfig
    from specserve.train.progress import RichReporter

    _quiet_transformers()
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = Eagle3TrainConfig(
        model=str(model_dir), out=str(out), draft_vocab=draft_vocab,
        intermediate_size=intermediate_size, num_heads=num_heads, ttt_steps=ttt_steps,
        data=str(data) if data else None, samples=samples, prompt_len=prompt_len,
        gen_len=gen_len, steps=steps, minutes=minutes, batch_seqs=batch_seqs, lr=lr,
        eval_prompts=eval_prompts, eval_gen_len=eval_gen_len, max_draft_len=max_draft_len,
        seed=seed, device=device, dtype=dtype)
    with RichReporter() as rep:
        res = run_train_eagle3(cfg, rep, force=force)
    emit({"out": str(res.out), "steps": res.steps, "first_loss": res.first_loss,
          "final_loss": res.final_loss, "draft_vocab": res.train["draft_vocab"],
          "draft_vocab_coverage": res.train["draft_vocab_coverage"],
          "heldout": res.train["heldout"], "eval": res.eval,
          "dtype": res.train["dtype"]}, fmt, _summary)
