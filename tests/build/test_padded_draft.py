"""A draft with the target's tokenizer whose embeddings are padded to another ``vocab_size``
(Qwen2.5-0.5B's 151936 rows for Qwen2.5-7B's 152064): TensorRT-LLM's engine flow plans it as
draft-target accepted by token ids (``use_draft_logits`` false, as upstream's
``tensorrt_llm_bls``), with draft logits only where the widths match; the torch engine, which
compares the draft's distribution with the target's row for row, refuses it in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from tests.helpers.tiny import TinyCheckpoint, make_llama, make_tokenizer

PAD = 64  # rows the padded draft has beyond the target's


@pytest.fixture(scope="module")
def padded_draft(tiny_ckpt: TinyCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target_vocab = json.loads((tiny_ckpt.target / "config.json").read_text())["vocab_size"]
    out = tmp_path_factory.mktemp("padded") / "draft"
    make_llama(out, tiny_ckpt.tokenizer, hidden_size=32, layers=1, heads=2, kv_heads=1, seed=5,
               vocab_size=target_vocab + PAD)
    return out


def _build(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["build", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _plan(tiny_ckpt: TinyCheckpoint, draft: Path, out: Path) -> dict[str, Any]:
    code, stdout, stderr = _build("--model", str(tiny_ckpt.target), "--draft", str(draft),
                                  "--backend", "trtllm", "--out", str(out), "--dry-run",
                                  "--format", "json")
    assert code == 0, stderr
    data: dict[str, Any] = json.loads(stdout)
    return data


def _draft_build_argv(plan: dict[str, Any]) -> list[str]:
    (step,) = [s for s in plan["steps"] if s["name"] == "build draft engine"]
    argv: list[str] = step["argv"]
    return argv


def test_trtllm_plans_token_id_acceptance(tiny_ckpt: TinyCheckpoint, padded_draft: Path,
                                          tmp_path: Path) -> None:
    data = _plan(tiny_ckpt, padded_draft, tmp_path / "e")
    target_vocab = json.loads((tiny_ckpt.target / "config.json").read_text())["vocab_size"]
    assert data["config"]["spec_mode"] == "draft"
    assert data["draft_target"] == {"acceptance": "token_ids", "draft_logits": False,
                                    "target_vocab_size": target_vocab,
                                    "draft_vocab_size": target_vocab + PAD}
    assert "--gather_generation_logits" not in _draft_build_argv(data["plan"])
    assert any("accepted by token ids" in n for n in data["plan"]["notes"])
    assert not (tmp_path / "e").exists()


def test_equal_widths_keep_draft_logits(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    data = _plan(tiny_ckpt, tiny_ckpt.draft, tmp_path / "e")
    assert data["draft_target"]["draft_logits"] is True
    assert data["draft_target"]["acceptance"] == "token_ids or draft_logits"
    assert "--gather_generation_logits" in _draft_build_argv(data["plan"])
    assert not any("accepted by token ids" in n for n in data["plan"]["notes"])


def test_trtllm_still_refuses_another_tokenizer(tiny_ckpt: TinyCheckpoint,
                                                tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tok", vocab_size=300, text="x = 1\n" * 50 + "print(x)\n")
    other = make_llama(tmp_path / "other", tok, hidden_size=32, layers=1, heads=2, kv_heads=1)
    code, _, stderr = _build("--model", str(tiny_ckpt.target), "--draft", str(other),
                             "--backend", "trtllm", "--out", str(tmp_path / "e"), "--dry-run")
    assert code == 2 and "tokenizer" in stderr, stderr


def test_torch_refuses_the_padded_pair_in_one_line(tiny_ckpt: TinyCheckpoint,
                                                   padded_draft: Path, tmp_path: Path) -> None:
    code, _, stderr = _build("--model", str(tiny_ckpt.target), "--draft", str(padded_draft),
                             "--backend", "torch", "--out", str(tmp_path / "e"))
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, stderr
    assert "vocab_size" in lines[0] and "--backend trtllm" in lines[0], lines[0]
    assert not (tmp_path / "e").exists()


def _record(tmp_path: Path, **extra: Any) -> Any:
    from specserve.engine_record import EngineRecord

    return EngineRecord(path=tmp_path / "build_config.json", backend="trtllm", spec_mode="draft",
                        max_batch_size=8, max_input_len=256, max_seq_len=512, max_draft_len=4,
                        medusa_choices=None, dtype="float16", quantize=None,
                        kv_cache_dtype=None, tp_size=1, pp_size=1, world_size=1, raw=extra)


def test_the_repository_tells_the_bls(tmp_path: Path) -> None:
    from specserve.triton.params import bls_spec_mapping

    def value(**extra: Any) -> str:
        return bls_spec_mapping(_record(tmp_path, **extra), tmp_path,
                                target_decoupled=False)["specserve_draft_logits"]

    assert value(draft_logits=False) == "false"
    assert value(draft_logits=True) == "true" and value() == "true"


def test_the_bls_refuses_use_draft_logits_for_a_padded_draft() -> None:
    import numpy as np

    from specserve.triton.models.bls_lib.spec_io import BlsParams, check_spec_request

    base = {"tensorrt_llm_draft_model_name": "tensorrt_llm_draft", "max_draft_len": "4"}
    padded = BlsParams.from_params({**base, "specserve_draft_logits": "false"})
    with pytest.raises(ValueError, match="accepted by token ids only: send use_draft_logits"):
        check_spec_request(padded, {"use_draft_logits": np.array([True])}, 4)
    check_spec_request(padded, {"use_draft_logits": np.array([False])}, 4)
    check_spec_request(padded, {}, 4)
    check_spec_request(BlsParams.from_params(base), {"use_draft_logits": np.array([True])}, 4)


def test_a_wider_padded_draft_is_cut_at_an_id_the_target_lacks() -> None:
    from specserve.triton.models.bls_lib.spec_io import BlsParams, within_target_vocab

    base = {"tensorrt_llm_draft_model_name": "tensorrt_llm_draft", "tensorrt_llm_vocab_size": "8"}
    padded = BlsParams.from_params({**base, "specserve_draft_logits": "false"})
    assert within_target_vocab(padded, [1, 7, 9, 2]) == [1, 7]  # 9: a padding row of the draft
    assert within_target_vocab(padded, [1, 2]) == [1, 2]
    # a draft of the target's width keeps every id (check_draft refuses a bad one)
    assert within_target_vocab(BlsParams.from_params(base), [1, 9]) == [1, 9]
