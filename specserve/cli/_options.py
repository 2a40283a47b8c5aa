"""Options shared by several commands (click decorators; no heavy imports)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from specserve.cpu_dtype import REQUESTS
from specserve.spec.predictor import GPU_ALIASES, GPUS

# every command that takes --gpu accepts the same names: the GPUs' own and their short aliases
GPU_CHOICES = click.Choice(sorted([*GPUS, *GPU_ALIASES]))

TRAIN_DTYPE_OPTION = click.option(
    "--dtype", "dtype", type=click.Choice(REQUESTS), default="auto", show_default=True,
    help="Training autocast dtype. auto: bfloat16 where this CPU has bf16 instructions (oneDNN "
         "says so and a timed matmul agrees) or on CUDA, else float32 (emulated bf16 is ~10x "
         "slower); the choice and its evidence are recorded with the output.")

# what train-eagle3 and train-draft share: the target's own answers to prompts, the schedule,
# the decode eval (in this order in --help)
_SELF_DISTILL = (
    click.option("--data", type=click.Path(path_type=Path), default=None,
                 help="Text or JSONL ('text' per line) whose windows prompt the target, or a "
                      "chat set from `specserve prompts` (its prompts under the chat "
                      "template); default: prompts sampled from the target. Answers are "
                      "always the target's own."),
    click.option("--samples", type=click.IntRange(1), default=256, show_default=True,
                 help="Training sequences (the target's generations)."),
    click.option("--prompt-len", type=click.IntRange(1), default=16, show_default=True),
    click.option("--gen-len", type=click.IntRange(1), default=112, show_default=True),
    click.option("--steps", type=click.IntRange(1), default=300, show_default=True,
                 help="Training steps (ignored with --minutes)."),
    click.option("--minutes", type=float, default=None,
                 help="Training budget: sets --steps from a measured step (recorded in "
                      "train_info.json; rerun with that --steps to reproduce)."),
    click.option("--batch-seqs", type=click.IntRange(1), default=8, show_default=True,
                 help="Sequences per step."),
    click.option("--lr", type=float, default=3e-3, show_default=True),
    click.option("--eval-prompts", type=click.IntRange(0), default=8, show_default=True,
                 help="Held-out prompts decoded at the end (0: no decode eval)."),
    click.option("--eval-gen-len", type=click.IntRange(1), default=64, show_default=True),
    click.option("--max-draft-len", type=click.IntRange(1, 16), default=4, show_default=True,
                 help="K for the decode eval."),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
    click.option("--threads", type=click.IntRange(1, 256), default=None, help="torch CPU threads."),
)


def SELF_DISTILL_OPTIONS(fn: Callable[..., Any]) -> Callable[..., Any]:  # noqa: N802
    """The self-distillation options, applied to a command as one decorator."""
    for option in reversed(_SELF_DISTILL):
        fn = option(fn)
    return fn
