"""``specserve conform`` end to end against the scripted pair; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from specserve.cli.main import cli
from tests.conform.scripted_server import ScriptedServer


def test_cli_writes_matrix_and_exits_1_on_failure(tmp_path: Path) -> None:
    with ScriptedServer(run=3, plants={"overshoot"}) as spec, ScriptedServer() as base:
        res = CliRunner().invoke(cli, [
            "conform", "--url", spec.url, "--baseline-url", base.url, "--protocol", "openai",
            "--model", "toy", "--method", "scripted", "--checks", "n,max-tokens",
            "--out", str(tmp_path), "--format", "json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert report["counts"]["fail"] == 1 and report["counts"]["pass"] == 1
    # the checks run in the order given (conform_vllm.py puts the one that kills vLLM last)
    assert [r["check"] for r in json.loads((tmp_path / "matrix.json").read_text())["rows"]] == [
        "n", "max-tokens"]
    assert "| 3 | max-tokens | **FAIL** |" in (tmp_path / "matrix.md").read_text()


def test_rerun_leaves_no_stale_evidence(tmp_path: Path) -> None:
    """A check that failed, then passes on a second run into the same --out, keeps no
    evidence file of the first run (nothing beside matrix.json contradicts it)."""
    args = ["conform", "--protocol", "openai", "--model", "toy", "--checks", "max-tokens",
            "--out", str(tmp_path), "--format", "json"]
    with ScriptedServer(run=3, plants={"overshoot"}) as spec, ScriptedServer() as base:
        res = CliRunner().invoke(cli, [*args, "--url", spec.url, "--baseline-url", base.url])
    assert res.exit_code == 1 and (tmp_path / "evidence" / "max-tokens.json").is_file()
    with ScriptedServer(run=3) as spec, ScriptedServer() as base:
        res = CliRunner().invoke(cli, [*args, "--url", spec.url, "--baseline-url", base.url])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["rows"][0]["evidence"] is None
    assert not (tmp_path / "evidence" / "max-tokens.json").exists()


def test_cli_budget_leaves_checks_not_run(tmp_path: Path) -> None:
    with ScriptedServer(run=3) as spec, ScriptedServer() as base:
        res = CliRunner().invoke(cli, [
            "conform", "--url", spec.url, "--baseline-url", base.url, "--protocol", "openai",
            "--model", "toy", "--budget-s", "1", "--checks", "usage",
            "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "0 pass" not in res.output and "usage" in res.output and ".." in res.output


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["conform", "--url", "127.0.0.1:1", "--protocol", "openai",
                              "--out", str(tmp_path)])
    assert res.exit_code == 2 and "give --baseline-url" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(cli, ["conform", "--url", "127.0.0.1:1", "--protocol", "openai",
                              "--baseline-model", "b", "--checks", "nope", "--out",
                              str(tmp_path)])
    assert res.exit_code == 2 and "unknown check 'nope'" in res.output
    res = runner.invoke(cli, ["conform", "--url", "127.0.0.1:1", "--protocol", "openai",
                              "--baseline-model", "b", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "does not answer GET /v1/models" in res.output
