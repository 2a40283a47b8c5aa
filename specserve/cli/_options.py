"""Options shared by several commands (click decorators; no heavy imports)."""

from __future__ import annotations

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
