"""The torch backend end to end: build a tiny engine, then ``generate --engine`` equals
``generate --model`` token for token at temperature 0; rebuilds are byte-identical; FP8 stores
e4m3 weights with per-channel scales; Ctrl-C leaves nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from specserve.build import torch_engine
from specserve.build.builder import build_engine
from specserve.build.config import BuildConfig
from specserve.checkpoint import FP8_MAX, dequantize, quantize_per_channel
from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.runtime.engine import load_engine
from tests.helpers.tiny import TinyCheckpoint

PROMPT = "def add(a, b):"
GEN = ["--prompt", PROMPT, "--max-tokens", "20", "--ignore-eos", "--format", "json"]


def cli_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def build(ckpt: TinyCheckpoint, out: Path, *extra: str) -> dict[str, Any]:
    return cli_json("build", "--model", str(ckpt.target), *extra, "--backend", "torch",
                    "--out", str(out), "--format", "json")


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("source", "dtype"), [("medusa", "float32"), ("draft", "float32"),
                                               ("medusa", "float16")])
def test_generate_engine_equals_model(tiny_ckpt: TinyCheckpoint, tmp_path: Path, source: str,
                                      dtype: str) -> None:
    torch.set_num_threads(1)
    src = tiny_ckpt.medusa if source == "medusa" else tiny_ckpt.draft
    out = tmp_path / "engine"
    build(tiny_ckpt, out, f"--{source}", str(src), "--dtype", dtype)
    eng = cli_json("generate", "--engine", str(out), *GEN)
    ref = cli_json("generate", "--model", str(tiny_ckpt.target), "--no-spec", "--dtype", dtype,
                   *GEN)
    assert eng["spec_mode"] == source and len(ref["token_ids"]) == 20
    assert eng["token_ids"] == ref["token_ids"]
    assert eng["stats"]["steps"] >= 2


def test_layout_and_record(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "e"
    build(tiny_ckpt, out, "--medusa", str(tiny_ckpt.medusa), "--medusa-choices", "{0}, {0, 0}",
          "--dtype", "float16")
    assert sorted(p.name for p in out.iterdir()) == [".specserve-output.json",
                                                      "build_config.json", "medusa", "target",
                                                      "tokenizer"]
    rec = json.loads((out / "build_config.json").read_text())
    for key in ("backend", "spec_mode", "max_batch_size", "max_input_len", "max_seq_len",
                "max_draft_len", "medusa_choices", "dtype", "quantize", "kv_cache_dtype",
                "tp_size", "pp_size", "world_size", "input_hashes", "versions", "commands"):
        assert key in rec, key
    assert (rec["backend"], rec["spec_mode"], rec["max_draft_len"]) == ("torch", "medusa", 2)
    assert rec["medusa_choices"] == [[0], [0, 0]]
    weights = tiny_ckpt.target / "model.safetensors"
    assert rec["input_hashes"]["model/model.safetensors"] == \
        hashlib.sha256(weights.read_bytes()).hexdigest()
    engine = load_engine(out)
    assert engine.decoder.spec_mode == "medusa" and engine.record.raw == rec
    assert engine.record.medusa_choices == ((0,), (0, 0))
    assert engine.decoder.target.dtype == torch.float16


def test_rebuild_is_byte_identical(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "e"
    args = ("--medusa", str(tiny_ckpt.medusa), "--quantize", "fp8")
    build(tiny_ckpt, out, *args)
    first = tree_hashes(out)
    build(tiny_ckpt, out, *args, "--force")
    assert tree_hashes(out) == first and len(first) >= 9


def test_fp8_engine_weights(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "e8"
    build(tiny_ckpt, out, "--ngram", "--quantize", "fp8", "--dtype", "float16")
    sd = load_file(str(out / "target" / "model.safetensors"))
    q = sd["model.layers.0.self_attn.q_proj.weight"]
    scale = sd["model.layers.0.self_attn.q_proj.weight_scale"]
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (q.shape[0],)
    assert sd["model.embed_tokens.weight"].dtype == torch.float16
    assert sd["lm_head.weight"].dtype == torch.float16
    engine = load_engine(out)
    loaded = engine.decoder.target.state_dict()["layers.0.attn.qkv.weight"][: q.shape[0]]
    assert torch.equal(loaded, dequantize(q, scale).to(torch.float16))


def test_fp8_rounding_bound() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g) * torch.logspace(-3, 1, 64)[:, None]
    q, scale = quantize_per_channel(w)
    err = (dequantize(q, scale) - w).abs()
    # e4m3: 3 mantissa bits -> half-ulp relative error 2^-4 for normals; subnormal step
    # 2^-9 * scale -> absolute error <= 2^-10 * scale.
    bound = w.abs() / 16 + scale[:, None] * 2.0**-10
    assert bool((err <= bound * (1 + 1e-6)).all())
    assert torch.allclose(w.abs().amax(dim=1) / scale, torch.full((64,), FP8_MAX))


def test_ctrl_c_during_torch_build(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(torch_engine, "write_medusa", interrupted)
    out = tmp_path / "engines" / "e"
    cfg = BuildConfig(model=str(tiny_ckpt.target), out=str(out), spec_mode="medusa",
                      medusa=str(tiny_ckpt.medusa))
    with pytest.raises(KeyboardInterrupt):
        build_engine(cfg)
    assert list(out.parent.iterdir()) == []


def test_load_engine_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match="engine directory not found"):
        load_engine(tmp_path / "nope")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "build_config.json").write_text(json.dumps(
        {"backend": "trtllm", "spec_mode": "medusa", "dtype": "float16", "max_draft_len": 63,
         "max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048,
         "medusa_choices": None, "quantize": None, "kv_cache_dtype": None, "tp_size": 1,
         "pp_size": 1, "world_size": 1}))
    with pytest.raises(SpecserveError, match="engines run in TensorRT-LLM"):
        load_engine(tmp_path / "e")


def test_draft_len_schedule_is_recorded_and_loaded(tiny_ckpt: TinyCheckpoint,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "engine"
    build(tiny_ckpt, out, "--draft", str(tiny_ckpt.draft), "--draft-len-schedule", "8:1,1:4")
    rec = json.loads((out / "build_config.json").read_text())
    assert rec["draft_len_schedule"] == "1:4,8:1"
    assert rec["command"][-4:-2] == ["--draft-len-schedule", "1:4,8:1"]
    sched = load_engine(out).decoder.schedule
    assert sched is not None and [sched.at(b) for b in (1, 7, 8)] == [4, 4, 1]
    plain = tmp_path / "plain"
    build(tiny_ckpt, plain, "--draft", str(tiny_ckpt.draft))
    assert "draft_len_schedule" not in json.loads((plain / "build_config.json").read_text())
    assert load_engine(plain).decoder.schedule is None


@pytest.mark.parametrize(("value", "why"), [
    ("1:9", "9 draft tokens is more than --max-draft-len 4"),
    ("2:1", "keys are batch sizes from 1"),
    ("1:x", "'1:x' is not BATCH:BUDGET"),
])
def test_bad_draft_len_schedule_is_one_line(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                            value: str, why: str) -> None:
    result = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--draft",
                                      str(tiny_ckpt.draft), "--backend", "torch",
                                      "--draft-len-schedule", value, "--out",
                                      str(tmp_path / "e")])
    assert result.exit_code == 2 and why in result.output, result.output
    assert not (tmp_path / "e").exists()


def test_draft_len_policy_is_adaptive_by_default_and_recorded(tiny_ckpt: TinyCheckpoint,
                                                              tmp_path: Path) -> None:
    plain = tmp_path / "default"
    build(tiny_ckpt, plain, "--draft", str(tiny_ckpt.draft))
    assert "draft_len_policy" not in json.loads((plain / "build_config.json").read_text())
    assert load_engine(plain).decoder.draft_policy is not None
    fixed = tmp_path / "fixed"
    build(tiny_ckpt, fixed, "--draft", str(tiny_ckpt.draft), "--draft-len-policy", "fixed")
    rec = json.loads((fixed / "build_config.json").read_text())
    assert rec["draft_len_policy"] == "fixed"
    assert rec["command"][-4:-2] == ["--draft-len-policy", "fixed"]
    assert load_engine(fixed).decoder.draft_policy is None
    result = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--ngram",
                                      "--backend", "trtllm", "--draft-len-policy", "fixed",
                                      "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "--draft-len-policy" in result.output, result.output


def test_forced_drafts_are_on_for_a_speculative_engine_only(tiny_ckpt: TinyCheckpoint,
                                                            tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    build(tiny_ckpt, spec, "--ngram")
    assert load_engine(spec).decoder.forced is not None
    off = tmp_path / "off"
    build(tiny_ckpt, off, "--ngram", "--no-forced-drafts")
    assert json.loads((off / "build_config.json").read_text())["forced_drafts"] is False
    assert load_engine(off).decoder.forced is None
    from specserve.serving.engine import load_decoder

    baseline, _, _ = load_decoder(str(spec), speculation=False)  # the no-speculation baseline
    assert baseline.forced is None and baseline.draft_policy is None
