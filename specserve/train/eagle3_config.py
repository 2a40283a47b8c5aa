"""The settings of one ``specserve train-eagle3`` run (:mod:`specserve.train.eagle3`), saved in
``train_info.json``; a leaf the command, the data and the training loop all read."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.errors import SpecserveError
from specserve.train.distill_config import SelfDistillConfig


@dataclass(frozen=True)
class Eagle3TrainConfig(SelfDistillConfig):
    """Everything that determines a train-eagle3 run (saved in ``train_info.json``): the shared
    self-distillation fields and the head's."""

    draft_vocab: int | None = None  # None: min(vocab, 32000)
    intermediate_size: int | None = None  # None: the target's
    num_heads: int | None = None  # attention heads (as many KV heads); None: the target's
    ttt_steps: int = 3
    step_decay: float = 0.8

    def validate(self) -> None:
        self.check_shared("train-eagle3")
        if self.ttt_steps < 1:
            raise SpecserveError("train-eagle3: --ttt-steps must be >= 1")
        for name in ("intermediate_size", "num_heads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SpecserveError(f"train-eagle3: --{name.replace('_', '-')} must be >= 1, "
                                     f"got {v}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise SpecserveError(f"train-eagle3: --draft-vocab must be >= 1, got "
                                 f"{self.draft_vocab}")
        if not 0 < self.step_decay <= 1:
            raise SpecserveError("train-eagle3: step_decay must be in (0, 1]")
