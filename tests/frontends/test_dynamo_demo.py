"""``specserve demo --frontend dynamo``: the demo's benchmark and report
through NVIDIA Dynamo's OpenAI frontend, the engine served with speculation (``demo``) and
without (``demo-baseline``); tau read from the workers' counters and checked against eval.json;
the Triton-only flags refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from tests.helpers.dynamo import descendants
from tests.helpers.server import make_tiny_engine


@pytest.mark.dynamo
def test_demo_through_dynamo_reports_and_checks_tau(tiny_ckpt: Any, tmp_path: Path) -> None:
    import os

    engine = make_tiny_engine(tiny_ckpt, tmp_path / "engine-draft", "draft", True)
    # draft == target at T=0: every draft accepted, K=4 -> 5 tokens per step
    (tmp_path / "eval.json").write_text(json.dumps({"draft": {"tau": 5.0}}))
    out = tmp_path / "report"
    before = descendants(os.getpid())
    r = CliRunner().invoke(cli, [
        "demo", "--frontend", "dynamo", "--engine", str(engine), "--eval",
        str(tmp_path / "eval.json"), "--out", str(out), "--requests", "3", "--warmup", "1",
        "--max-tokens", "21"])
    assert r.exit_code == 0, r.output
    assert "tau (tokens/step)" in r.output and "speedup TPOT" in r.output, r.output
    for name in ("summary.json", "requests.jsonl", "README.md", "demo_check.json"):
        assert (out / name).is_file(), name
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["protocol"] == "openai"
    assert (s["config"]["model"], s["config"]["baseline_model"]) == ("demo", "demo-baseline")
    assert s["variants"]["spec"]["engine_counters"]["tau"] == pytest.approx(5.0, rel=0.10)
    assert s["variants"]["baseline"]["engine_counters"]["draft_tokens"] == 0
    assert s["flags"] == [], s["flags"]
    check = json.loads((out / "demo_check.json").read_text())
    assert check["frontend"] == "dynamo" and check["mode"] == "draft" and check["ok"] is True
    assert descendants(os.getpid()) <= before  # frontend and workers stopped


@pytest.mark.parametrize("flag", [("--repo", "r"), ("--grpc-port", "9001"),
                                  ("--metrics-port", "9002")])
def test_triton_options_are_refused_behind_dynamo(tmp_path: Path, flag: tuple[str, str]
                                                  ) -> None:
    r = CliRunner().invoke(cli, ["demo", "--frontend", "dynamo", "--engine", str(tmp_path),
                                 *flag, "--out", str(tmp_path / "o")])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert f"{flag[0]} is a --frontend triton option" in lines[0]


def test_a_missing_engine_is_refused_before_any_server(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["demo", "--frontend", "dynamo", "--engine",
                                 str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--frontend dynamo serves the engine directory" in r.output
    assert not (tmp_path / "o").exists()
