"""The settings of one ``specserve train-eagle3`` run (:mod:`specserve.train.eagle3`), saved in
``train_info.json``; a leaf the command, the data and the training loop all read."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.config import JsonConfig
from specserve.cpu_dtype import REQUESTS
from specserve.errors import SpecserveError


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
