"""Fixtures for runtime tests: the session's tiny models loaded once (fp32, CPU, 1 thread)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from specserve.runtime.model import Transformer, load_model
from specserve.testing.tiny import TinyCheckpoint


@dataclass(frozen=True)
class TinyModels:
    ckpt: TinyCheckpoint
    target: Transformer
    draft: Transformer  # independent random model (almost nothing accepted)
    target_copy: Transformer  # the target loaded again, as a draft (everything accepted)


@pytest.fixture(scope="session")
def tiny_models(tiny_ckpt: TinyCheckpoint) -> TinyModels:
    torch.set_num_threads(1)
    return TinyModels(tiny_ckpt, load_model(tiny_ckpt.target), load_model(tiny_ckpt.draft),
                      load_model(tiny_ckpt.target))

