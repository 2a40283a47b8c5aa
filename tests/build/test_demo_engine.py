"""``specserve engine`` (``make engine``): the method choice from eval.json and the flags, the
demo's defaults, and reuse of an up-to-date engine (specserve/build/demo_engine.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.build.demo_engine import EngineRequest, choose_method
from specserve.cli.main import cli
from specserve.errors import SpecserveError
from tests.helpers.tiny import TinyCheckpoint

CK = "checkpoints/demo"


def _req(**kw: Any) -> EngineRequest:
    return EngineRequest(checkpoint=CK, **kw)


def test_an_explicit_method_wins_over_eval_json() -> None:
    ev = {"fastest_method": "draft"}
    assert choose_method(_req(method="ngram"), ev) == "ngram"
    assert choose_method(_req(method="medusa"), ev) == "medusa"
    assert choose_method(_req(eagle3="e3"), ev) == "eagle3"  # a directory names its method
    assert choose_method(_req(medusa="m", method="fastest"), {"fastest_method": "medusa"}) \
        == "medusa"


@pytest.mark.parametrize("recorded", ["draft", "eagle3", "ngram"])
def test_fastest_comes_from_eval_json(recorded: str) -> None:
    ev = {"fastest_method": recorded}
    assert choose_method(_req(), ev) == recorded
    assert choose_method(_req(method="fastest"), ev) == recorded
    assert choose_method(_req(model=f"{CK}/target", method=""), ev) == recorded


def test_medusa_is_the_fallback() -> None:
    assert choose_method(_req(), {"fastest_method": "medusa_tuned"}) == "medusa"
    assert choose_method(_req(), {}) == "medusa"
    assert choose_method(_req(), None) == "medusa"  # no eval.json
    # another model: its Medusa heads, whatever the demo measured
    assert choose_method(_req(model="my-llama"), {"fastest_method": "ngram"}) == "medusa"


def test_bad_method_and_unused_directories_are_refused() -> None:
    with pytest.raises(SpecserveError, match=r"--method 'fast': choose one of fastest, medusa"):
        choose_method(_req(method="fast"), None)
    with pytest.raises(SpecserveError, match="at most one of --medusa, --draft, --eagle3"):
        choose_method(_req(draft="d", eagle3="e"), None)
    with pytest.raises(SpecserveError, match="--medusa is not used by method draft"):
        choose_method(_req(medusa="m", method="draft"), None)
    with pytest.raises(SpecserveError, match=r"--draft is not used by method ngram \(eval"):
        choose_method(_req(draft="d", method="fastest"), {"fastest_method": "ngram"})


def _engine(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["engine", *args])
    return res.exit_code, res.output


def test_cli_bad_method_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, out = _engine("--checkpoint", str(tmp_path), "--method", "fast",
                        "--out", str(tmp_path / "e"))
    assert code == 2
    assert out.strip().splitlines() == [
        "error: engine: --method 'fast': choose one of fastest, medusa, draft, eagle3, ngram"]
    assert not (tmp_path / "e").exists()


def test_builds_eval_json_fastest_then_reuses_it(writable_ckpt: TinyCheckpoint,
                                                 tmp_path: Path) -> None:
    root, out = writable_ckpt.root, tmp_path / "engine"
    (root / "eval.json").write_text(json.dumps({"fastest_method": "ngram"}))
    args = ("--checkpoint", str(root), "--out", str(out), "--format", "json")
    code, text = _engine(*args)
    assert code == 0, text
    first = json.loads(text)
    rec = json.loads((out / "build_config.json").read_text())
    assert (first["method"], first["reused"]) == ("ngram", False)
    assert (rec["spec_mode"], rec["max_draft_len"], rec["dtype"]) == ("ngram", 4, "float32")
    code, text = _engine(*args)
    assert code == 0 and json.loads(text)["reused"] is True
    # a changed choice is not up to date: Medusa with the checkpoint's tuned CPU tree
    tree = [[0], [1], [0, 0]]
    (root / "medusa_tree_cpu.json").write_text(json.dumps(tree))
    code, text = _engine(*args, "--method", "medusa", "--dtype", "auto")
    assert code == 0, text
    rec = json.loads((out / "build_config.json").read_text())
    assert json.loads(text)["reused"] is False
    assert rec["spec_mode"] == "medusa" and rec["medusa_choices"] == tree
    assert rec["dtype_choice"]["requested"] == "auto"
    assert rec["dtype"] == rec["dtype_choice"]["dtype"]
    # draft-target: the checkpoint's draft proposes from a 64-key window; a given draft does not
    code, text = _engine(*args, "--method", "draft")
    assert code == 0, text
    rec = json.loads((out / "build_config.json").read_text())
    assert rec["spec_mode"] == "draft" and rec["draft_window"] == 64
    code, text = _engine(*args, "--draft", str(root / "draft"))
    assert code == 0, text
    assert "draft_window" not in json.loads((out / "build_config.json").read_text())


def test_build_dtype_auto_records_the_choice(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    from specserve.cpu_dtype import choose_dtype

    out = tmp_path / "e"
    res = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--ngram",
                                   "--backend", "torch", "--dtype", "auto", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "build_config.json").read_text())
    assert rec["dtype_choice"] == choose_dtype("auto").to_dict()
    assert rec["dtype"] == rec["config"]["dtype"] == rec["dtype_choice"]["dtype"]
