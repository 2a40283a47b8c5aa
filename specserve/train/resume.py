"""Resumable training runs: a work directory beside the output that survives an interrupt.

``<parent>/.<out>.partial/`` holds the run's config (``train_config.json``), the self-distilled
sequences (``sequences.safetensors``: the slow part, the target's own answers) and the last
training checkpoint (``state.pt``, read back with ``torch.load(weights_only=True)``). A rerun
with the same config picks up the sequences and the checkpoint; a different config starts over;
a finished run deletes the directory. Used by ``train-medusa``, ``train-eagle3`` and
``train-draft``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specserve.train.progress import Reporter

CONFIG, SEQUENCES, STATE = "train_config.json", "sequences.safetensors", "state.pt"


def work_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def prepare_work(config_json: str, work: Path, rep: Reporter) -> None:
    """Keep ``work`` when it holds a run of the same config, else start it afresh."""
    saved = work / CONFIG
    if work.exists() and (not saved.is_file() or saved.read_text() != config_json):
        rep.log(f"{work}: different or unreadable run, starting over")
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    saved.write_text(config_json)


def cached_tensors(work: Path, make: Callable[[], dict[str, torch.Tensor]],
                   rep: Reporter) -> dict[str, torch.Tensor]:
    """The tensors ``make`` returns, computed once per run and kept in ``work``."""
    from safetensors.torch import load_file, save_file

    path = work / SEQUENCES
    if path.is_file():
        rep.log(f"reusing the sequences of the interrupted run ({path})")
        return load_file(str(path))
    made = {k: v.contiguous() for k, v in make().items()}
    tmp = path.with_suffix(".tmp")
    save_file(made, str(tmp))
    tmp.replace(path)
    return made


def save_state(work: Path, state: dict[str, Any]) -> None:
    tmp = work / (STATE + ".tmp")
    torch.save(state, tmp)
    tmp.replace(work / STATE)


def load_state(work: Path) -> dict[str, Any] | None:
    path = work / STATE
    return torch.load(path, weights_only=True) if path.is_file() else None
