"""What ``specserve train-eagle3`` and ``specserve train-draft`` share: the self-distilled data
(the target's own answers to prompts), the schedule and the held-out decode eval, as a frozen
config both commands' configs extend (saved in ``train_info.json``), its common checks, the
result both return and :func:`tail_mean` of a loss curve."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.config import JsonConfig
from specserve.cpu_dtype import REQUESTS
from specserve.errors import SpecserveError


@dataclass(frozen=True)
class SelfDistillConfig(JsonConfig):
    """The fields every self-distillation run has (DistillSource's among them)."""

    model: str
    out: str
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

    def check_shared(self, command: str) -> None:
        """The shared fields' checks, errors naming ``command``'s options."""
        for name in ("samples", "prompt_len", "gen_len", "steps", "batch_seqs", "eval_gen_len",
                     "max_draft_len"):
            if getattr(self, name) < 1:
                raise SpecserveError(f"{command}: --{name.replace('_', '-')} must be >= 1")
        if self.eval_prompts < 0:
            raise SpecserveError(f"{command}: --eval-prompts must be >= 0")
        if self.dtype not in REQUESTS:
            raise SpecserveError(f"{command}: --dtype {self.dtype!r}: choose one of "
                                 f"{', '.join(REQUESTS)}")
        if self.minutes is not None and self.minutes <= 0:
            raise SpecserveError(f"{command}: --minutes must be > 0, got {self.minutes}")
        if self.lr <= 0 or not 0 <= self.heldout_fraction < 1:
            raise SpecserveError(f"{command}: lr must be > 0 and heldout_fraction in [0, 1)")


@dataclass(frozen=True)
class SelfDistillResult:
    """Outcome of a train-eagle3 or train-draft run: where it wrote, its steps and losses, its
    ``train_info.json`` and held-out decode eval."""

    out: Path
    steps: int
    first_loss: float
    final_loss: float
    train: dict[str, Any]
    eval: dict[str, Any]


def tail_mean(losses: list[float]) -> float:
    """The mean of a loss curve's last tenth (at least its last value)."""
    tail = losses[-max(1, len(losses) // 10):]
    return sum(tail) / len(tail)
