"""Fixtures for runtime tests: the session's tiny models loaded once (fp32, CPU, 1 thread)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.runtime.model import Transformer, load_model
from tests.helpers.tiny import TinyCheckpoint


@dataclass(frozen=True)
class TinyModels:
    ckpt: TinyCheckpoint
    target: Transformer
    draft: Transformer  # independent random model (almost nothing accepted)
    target_copy: Transformer  # the target loaded again, as a draft (everything accepted)


@pytest.fixture(scope="session")
def tiny_models(tiny_ckpt: TinyCheckpoint) -> TinyModels:
    torch.set_num_threads(1)
    # multi_row_min=0: the tiny weights get the prepacked multi-row copies that real models get,
    # so verify forwards (oneDNN) and one-token decoding (MKL) run different kernels, as there
    def load(d: Path) -> Transformer:
        return load_model(d).decode_layout(multi_row_min=0)
    return TinyModels(tiny_ckpt, load(tiny_ckpt.target), load(tiny_ckpt.draft),
                      load(tiny_ckpt.target))



@pytest.fixture(scope="session")
def tok(tiny_models: TinyModels) -> Any:
    """The tiny target's tokenizer."""
    from specserve.runtime.loader import load_tokenizer

    return load_tokenizer(tiny_models.ckpt.target)


def json_guide(models: TinyModels, tok: Any, schema: dict[str, Any]) -> Any:
    """``schema`` compiled for the tiny target (a structured-output guide)."""
    import json

    from specserve.runtime.grammar import Guide, GuideCompiler

    comp = GuideCompiler(tok, models.target.cfg.vocab_size, [tok.eos_token_id])
    return comp.compile(Guide("json_schema", json.dumps(schema)))
