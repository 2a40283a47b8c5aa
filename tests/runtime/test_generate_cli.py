"""``specserve generate`` end to end on the tiny checkpoint (json output contract)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from tests.helpers.tiny import TinyCheckpoint

STATS_KEYS = {"draft_tokens", "accepted_tokens", "acceptance_rate", "tau", "steps",
              "per_position_acceptance"}


def _run(args: list[str]) -> dict:  # type: ignore[type-arg]
    r = CliRunner().invoke(cli, ["generate", *args, "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", [
    [], ["--ngram"], ["--draft", "DRAFT"], ["--medusa", "MEDUSA"],
    ["--draft", "DRAFT", "--num-draft-tokens", "16", "--draft-min-confidence", "0.5"],
])
def test_generate_json_matches_no_spec(tiny_ckpt: TinyCheckpoint, mode: list[str]) -> None:
    mode = [{"DRAFT": str(tiny_ckpt.draft), "MEDUSA": str(tiny_ckpt.medusa)}.get(a, a)
            for a in mode]
    base = ["--model", str(tiny_ckpt.target), "--prompt", "def add(a, b):", "--max-tokens", "12",
            "--ignore-eos"]
    out = _run(base + mode)
    plain = _run(base + mode + ["--no-spec"])
    assert out["token_ids"] == plain["token_ids"] and len(out["token_ids"]) == 12
    assert STATS_KEYS <= set(out["stats"]) and isinstance(out["text"], str)
    assert plain["spec_mode"] == "none" and plain["stats"]["draft_tokens"] == 0


def test_generate_seeded_sampling_repeats(tiny_ckpt: TinyCheckpoint) -> None:
    args = ["--model", str(tiny_ckpt.target), "--draft", str(tiny_ckpt.target), "--prompt", "x",
            "--max-tokens", "10", "--temperature", "1.0", "--seed", "7", "--ignore-eos"]
    a, b = _run(args), _run(args)
    assert a["token_ids"] == b["token_ids"]
    assert a["stats"]["acceptance_rate"] > 0.9  # draft == target: q == p, all accepted


def test_engine_option_requires_engine_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(cli, ["generate", "--engine", str(tmp_path / "none"), "--prompt", "x"])
    assert r.exit_code == 2 and r.output.startswith("error: ")


def test_generate_from_torch_engine_matches_model(tiny_ckpt: TinyCheckpoint,
                                                  tmp_path) -> None:  # type: ignore[no-untyped-def]
    eng = tmp_path / "eng"
    r = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--draft",
                                 str(tiny_ckpt.draft), "--backend", "torch", "--dtype", "float32",
                                 "--out", str(eng)])
    assert r.exit_code == 0, r.output
    common = ["--prompt", "import os", "--max-tokens", "10", "--ignore-eos"]
    from_engine = _run(["--engine", str(eng), *common])
    from_model = _run(["--model", str(tiny_ckpt.target), *common])
    assert from_engine["spec_mode"] == "draft"
    assert from_engine["token_ids"] == from_model["token_ids"]
