"""The one reader of ``build_config.json``: typed fields, and one clear line (exit 2 through
the CLI) for a missing file, bad JSON, or a missing or ill-typed key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.engine_record import EngineRecord, read_engine_record
from specserve.errors import SpecserveError
from tests.helpers.server import make_fake_trtllm_engine, trtllm_build_config


def _engine(tmp_path: Path, content: str | None) -> Path:
    d = tmp_path / "engine"
    (d / "target").mkdir(parents=True)
    (d / "tokenizer").mkdir()
    if content is not None:
        (d / "build_config.json").write_text(content)
    return d


def _with(**changes: Any) -> str:
    cfg = trtllm_build_config("medusa")
    cfg.update(changes)
    return json.dumps({k: v for k, v in cfg.items() if v != "DROP"})


BAD = [
    (None, "build_config.json: not found"),
    ("{oops", "build_config.json: invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (_with(backend="onnx"), "backend must be 'torch' or 'trtllm'"),
    (_with(spec_mode="magic"), "unknown spec_mode 'magic'"),
    (_with(max_seq_len="DROP", dtype="DROP"), r"missing keys \['max_seq_len', 'dtype'\]"),
    (_with(max_batch_size="16"), "'max_batch_size' must be a positive integer, got '16'"),
    (_with(tp_size=0), "'tp_size' must be a positive integer, got 0"),
    (_with(world_size=True), "'world_size' must be a positive integer, got True"),
    (_with(max_draft_len=-1), "'max_draft_len' must be an integer >= 0"),
    (_with(dtype=16), "'dtype' must be a string"),
    (_with(quantize=8), "'quantize' must be a string or null"),
    (_with(medusa_choices="{0}, {1}"), "'medusa_choices' must be null or a list of lists"),
    (_with(medusa_choices=[[0], [-1]]), "'medusa_choices' must be null or a list of lists"),
    (_with(spec_mode="draft"), r"engine/draft: missing \(spec_mode 'draft' needs it"),
    (_with(backend="torch"), r"engine/medusa: missing \(spec_mode 'medusa' needs it"),
]
BAD_IDS = ["no-file", "bad-json", "not-object", "backend", "spec-mode", "missing-keys",
           "str-int", "zero-tp", "bool-int", "negative-draft-len", "dtype", "quantize",
           "choices-brace", "choices-negative", "no-draft-dir", "no-medusa-dir"]


@pytest.mark.parametrize("content, message", BAD, ids=BAD_IDS)
def test_bad_record_is_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    d = _engine(tmp_path, content)
    with pytest.raises(SpecserveError, match=message) as e:
        read_engine_record(d)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(str(d)), str(e.value)


def test_not_an_engine_dir(tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match="engine directory not found"):
        read_engine_record(tmp_path / "nope")


def test_typed_fields_and_raw(tmp_path: Path) -> None:
    d = make_fake_trtllm_engine(tmp_path, "fp8")
    rec = read_engine_record(d)
    assert isinstance(rec, EngineRecord) and rec.path == d / "build_config.json"
    assert (rec.backend, rec.spec_mode, rec.dtype) == ("trtllm", "medusa", "float16")
    assert (rec.quantize, rec.kv_cache_dtype, rec.tp_size, rec.world_size) == \
        ("fp8", "fp8", 2, 2)
    assert rec.max_batch_size == 64 and rec.medusa_choices is not None
    assert rec.medusa_choices[:2] == ((0,), (0, 0))
    assert rec.medusa_choices_list == trtllm_build_config("fp8")["medusa_choices"]
    assert rec.raw == trtllm_build_config("fp8") and rec.get("absent", 7) == 7
    draft = read_engine_record(make_fake_trtllm_engine(tmp_path, "draft"))
    assert draft.spec_mode == "draft" and draft.medusa_choices is None


def _cli_one_line(args: list[str], expect: str) -> None:
    r = CliRunner().invoke(cli, args)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert expect in lines[0], lines[0]


@pytest.mark.parametrize("content, expect", [
    ("{oops", "build_config.json: invalid JSON"),
    (_with(max_seq_len="DROP"), "missing keys ['max_seq_len']"),
    (_with(max_input_len=[1024]), "'max_input_len' must be a positive integer"),
], ids=["bad-json", "missing-key", "ill-typed"])
def test_malformed_record_through_repo_and_demo(tmp_path: Path, content: str,
                                               expect: str) -> None:
    engine = _engine(tmp_path, content)
    _cli_one_line(["repo", "--engine", str(engine), "--out", str(tmp_path / "repo")], expect)
    assert not (tmp_path / "repo").exists()
    repo = tmp_path / "served"
    (repo / "ensemble_baseline").mkdir(parents=True)  # what DemoRunConfig.validate looks for
    _cli_one_line(["demo", "--repo", str(repo), "--engine", str(engine), "--eval",
                   str(tmp_path / "no-eval.json"), "--out", str(tmp_path / "report")], expect)
    assert not (tmp_path / "report").exists()  # refused before any server or benchmark
