"""Self-distillation from a chat set (``specserve prompts`` JSONL): prompts are the records'
messages under the tokenizer's chat template, cut to their last ``--prompt-len`` tokens so each
ends where the model answers; the trainers take such a file as ``--data``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.train.distill import chat_prompts, is_chat_dataset
from tests.helpers.tiny import TinyCheckpoint


def _chat_set(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}],
                                        "category": "qa"}) + "\n" for t in texts))
    return path


def test_chat_prompts_end_where_the_answer_starts(tiny_ckpt: TinyCheckpoint,
                                                  tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_ckpt.target))
    data = _chat_set(tmp_path / "c.jsonl", ["x", "def add(a, b): return a + b " * 3,
                                            "class Point: pass " * 3])
    assert is_chat_dataset(data) and not is_chat_dataset(tmp_path / "absent.jsonl")
    opener = tok.apply_chat_template([{"role": "user", "content": "q"}],
                                     add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"]
    tail = list(opener)[-3:]  # the generation prompt's last tokens
    x = chat_prompts(tok, data, 5, 12, torch.Generator().manual_seed(0))
    assert x.shape == (5, 12)
    assert all(row[-3:].tolist() == tail for row in x)
    assert len({tuple(r.tolist()) for r in x}) == 2  # "x" is too short: the two others cycle
    with pytest.raises(SpecserveError, match="no chat prompt has 400 tokens"):
        chat_prompts(tok, data, 2, 400, torch.Generator())


@pytest.mark.parametrize("trainer", ["train-medusa", "train-eagle3"])
def test_trainers_take_a_chat_set(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                  trainer: str) -> None:
    data = _chat_set(tmp_path / "c.jsonl", [f"def f{i}(a, b): return a * b + {i}" * 2
                                            for i in range(6)])
    extra = (["--heads", "2", "--batch-tokens", "16"] if trainer == "train-medusa" else
             ["--batch-seqs", "2", "--eval-prompts", "1", "--eval-gen-len", "4",
              "--draft-vocab", "64"])
    res = CliRunner().invoke(cli, [trainer, "--model", str(tiny_ckpt.target), "--out",
                                   str(tmp_path / "out"), "--data", str(data), "--samples", "6",
                                   "--prompt-len", "10", "--gen-len", "6", "--steps", "2",
                                   "--threads", "1", "--format", "json", *extra])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "config.json").is_file()
