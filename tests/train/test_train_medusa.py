"""``specserve train-medusa`` and ``demo-model`` through the CLI, plus resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.train.medusa_train import MedusaTrainConfig, run_train_medusa
from tests.helpers.crash import Crash, CrashAt
from tests.helpers.tiny import TinyCheckpoint

TINY_FLAGS = ["--heads", "2", "--samples", "6", "--prompt-len", "4", "--gen-len", "8",
              "--steps", "4", "--batch-tokens", "16", "--threads", "1", "--format", "json"]


def _invoke(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args)
    return res.exit_code, res.output


def _stdout(args: list[str]) -> str:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_self_distilled_heads_load_in_the_runtime(tiny_ckpt: TinyCheckpoint,
                                                  tmp_path: Path) -> None:
    from specserve.runtime.checkpoint import load_medusa_heads

    out = tmp_path / "heads"
    text = _stdout(["train-medusa", "--model", str(tiny_ckpt.target), "--out", str(out),
                    *TINY_FLAGS])
    assert json.loads(text)["steps"] == 4
    heads = load_medusa_heads(out, 64, json.loads(
        (tiny_ckpt.target / "config.json").read_text())["vocab_size"])
    assert heads.num_heads == 2
    assert not (tmp_path / ".heads.partial").exists()


def test_jsonl_data_and_bad_data(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "def add(a, b):\n    return a + b\n" * 8})
                              for _ in range(3)))
    code, text = _invoke(["train-medusa", "--model", str(tiny_ckpt.target), "--out",
                          str(tmp_path / "h"), "--data", str(data), *TINY_FLAGS])
    assert code == 0, text
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\nnot json\n')
    code, text = _invoke(["train-medusa", "--model", str(tiny_ckpt.target), "--out",
                          str(tmp_path / "h2"), "--data", str(bad), *TINY_FLAGS])
    assert code == 2 and f"{bad}:2: invalid JSON" in text
    assert not (tmp_path / "h2").exists()


def test_bad_model_and_existing_output_are_one_line_errors(tiny_ckpt: TinyCheckpoint,
                                                           tmp_path: Path) -> None:
    code, text = _invoke(["train-medusa", "--model", str(tmp_path), "--out",
                          str(tmp_path / "h"), *TINY_FLAGS])
    assert code == 2 and "no config.json" in text and "Traceback" not in text
    (tmp_path / "taken").mkdir()
    code, text = _invoke(["train-medusa", "--model", str(tiny_ckpt.target), "--out",
                          str(tmp_path / "taken"), *TINY_FLAGS])
    assert code == 2 and "already exists" in text


def test_interrupted_run_resumes_to_the_same_heads(tiny_ckpt: TinyCheckpoint,
                                                   tmp_path: Path) -> None:
    from safetensors.torch import load_file

    torch.set_num_threads(1)

    def cfg(out: Path) -> MedusaTrainConfig:
        return MedusaTrainConfig(model=str(tiny_ckpt.target), out=str(out), heads=2,
                                 samples=6, prompt_len=4, gen_len=8, steps=6,
                                 batch_tokens=16, save_every=2)

    run_train_medusa(cfg(tmp_path / "a" / "h"))
    with pytest.raises(Crash):
        run_train_medusa(cfg(tmp_path / "b" / "h"), CrashAt("medusa heads", 3))  # dies in step 4
    assert (tmp_path / "b" / ".h.partial" / "state.pt").is_file()
    state = torch.load(tmp_path / "b" / ".h.partial" / "state.pt", weights_only=True)
    assert state["step"] == 2
    run_train_medusa(cfg(tmp_path / "b" / "h"))
    a = load_file(str(tmp_path / "a" / "h" / "medusa_lm_head.safetensors"))
    b = load_file(str(tmp_path / "b" / "h" / "medusa_lm_head.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    fresh = load_file(str(tiny_ckpt.medusa / "medusa_lm_head.safetensors"))
    assert not torch.equal(a["0.0.linear.weight"], torch.zeros_like(fresh["0.0.linear.weight"]))


def test_demo_model_reuses_an_existing_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    ev = {"medusa": {"top1_accuracy": [0.5], "tau": 2.5, "tree": "mc_sim_7b_63"},
          "draft": {"tau": 3.5, "k": 4, "greedy_agreement": 0.9}}
    (out / "eval.json").write_text(json.dumps(ev))
    code, text = _invoke(["demo-model", "--out", str(out)])
    assert code == 0 and "reused" in text and "2.50 (decoder)" in text


def test_demo_model_rejects_a_bad_budget(tmp_path: Path) -> None:
    code, text = _invoke(["demo-model", "--out", str(tmp_path / "d"), "--minutes", "0"])
    assert code == 2 and "--minutes must be > 0" in text
    assert not (tmp_path / "d").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_data_file_lines_end_at_newline_only(tmp_path: Path) -> None:
    """A JSONL text holding U+2028 raw is one record (str.splitlines() would cut it in two)."""
    from specserve.train.medusa_train import read_data_file

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\n"
                 + json.dumps({"text": "c"}) + "\n", encoding="utf-8")
    assert read_data_file(f) == ["a\u2028b", "c"]
