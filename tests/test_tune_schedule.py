"""``specserve tune-schedule``: the fastest budget per concurrency becomes the schedule (lower
bounds from 1), in specserve's, TensorRT-LLM 1.2's and later releases' forms; fixed budgets
slower than no speculation are flagged; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.tune_schedule import TuneScheduleConfig, parse_source, tune_schedule


def _sweep(path: Path, spec: dict[int, float], base: dict[int, float]) -> Path:
    levels = [{"concurrency": c,
               "spec": {"output_token_throughput_tok_s": spec[c], "per_user_tok_s_mean": 1.0},
               "baseline": {"output_token_throughput_tok_s": base[c],
                            "per_user_tok_s_mean": 1.0}} for c in sorted(spec)]
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"levels": levels}))
    return path


BASE = {1: 100.0, 4: 300.0, 8: 500.0, 16: 700.0}


def test_best_budget_per_level_and_the_three_forms(tmp_path: Path) -> None:
    k4 = _sweep(tmp_path / "k4", {1: 250.0, 4: 450.0, 8: 480.0, 16: 600.0}, BASE)
    k2 = _sweep(tmp_path / "k2", {1: 200.0, 4: 420.0, 8: 560.0, 16: 650.0}, BASE)
    r = tune_schedule(TuneScheduleConfig((parse_source(f"4={k4}"), parse_source(f"2={k2}")),
                                         tmp_path / "s.json"))
    assert [lv["best"] for lv in r["levels"]] == [4, 4, 2, 0]
    assert r["schedule"] == "1:4,8:2,16:0"
    t = r["trtllm_pytorch"]
    assert t["1.2"]["draft_len_schedule"] == {"1": 4, "8": 2, "16": 0}
    assert t["1.2"]["max_draft_len"] == 4
    assert t["later"]["draft_len_schedule"] == {"7": 4, "15": 2}
    assert r["flags"] == [
        "K=4 at concurrency 8: 480.0 output tok/s, 0.96x no speculation (500.0)",
        "K=4 at concurrency 16: 600.0 output tok/s, 0.86x no speculation (700.0)",
        "K=2 at concurrency 16: 650.0 output tok/s, 0.93x no speculation (700.0)"]
    assert "c=16: off" in r["vllm"]
    assert json.loads((tmp_path / "s.json").read_text())["schedule"] == "1:4,8:2,16:0"


def test_speculation_everywhere_keeps_one_point(tmp_path: Path) -> None:
    k4 = _sweep(tmp_path / "k4", {c: v * 2 for c, v in BASE.items()}, BASE)
    r = tune_schedule(TuneScheduleConfig((parse_source(f"4={k4}"),)))
    assert r["schedule"] == "1:4" and r["flags"] == []
    assert r["trtllm_pytorch"]["later"]["draft_len_schedule"] == {"16": 4}


@pytest.mark.parametrize(("args", "why"), [
    (["--from", "x=reports"], "expected K=SWEEP"),
    (["--from", "4=/nonexistent/summary.json"], "not found"),
])
def test_bad_input_one_line(args: list[str], why: str) -> None:
    res = CliRunner().invoke(cli, ["tune-schedule", *args])
    assert res.exit_code == 2 and why in res.output and "Traceback" not in res.output


def test_not_a_sweep(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"variants": {}}))
    with pytest.raises(SpecserveError, match="not a `specserve bench --sweep` summary"):
        tune_schedule(TuneScheduleConfig((parse_source(f"4={tmp_path}"),)))
