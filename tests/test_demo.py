"""`specserve demo` (the end of `make demo`) on a tiny reference deployment, against a real
tritonserver: the report is written, tau is checked against eval.json, and failure paths (a port
already in use, a broken repository) give a clear message and leave no server running."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.demo import expected_tau, tau_check
from tests.helpers.tiny import TinyCheckpoint

pytestmark = pytest.mark.server


def _tritonservers_for(repo: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if "tritonserver" in line and f"--model-repository={repo}" in line]


@pytest.fixture(scope="module")
def tiny_repo(tiny_ckpt: TinyCheckpoint, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from specserve.triton.repository import RepoOptions, write_repository
    from tests.helpers.server import make_tiny_engine

    root = tmp_path_factory.mktemp("demo")
    engine = make_tiny_engine(tiny_ckpt, root / "engine", "draft", draft_is_target=True)
    repo = write_repository(engine, root / "repo", RepoOptions(baseline=True), force=True)
    return engine, repo.resolve(), root


def test_demo_runs_reports_and_checks_tau(tiny_repo) -> None:  # type: ignore[no-untyped-def]
    engine, repo, root = tiny_repo
    # draft == target at T=0: every draft accepted, K=4 -> 5 tokens per step (1 for the prefill)
    (root / "eval.json").write_text(json.dumps({"draft": {"tau": 5.0}}))
    out = root / "report"
    r = CliRunner().invoke(cli, [
        "demo", "--repo", str(repo), "--engine", str(engine), "--eval", str(root / "eval.json"),
        "--out", str(out), "--requests", "3", "--warmup", "1", "--max-tokens", "21",
    ])
    assert r.exit_code == 0, r.output
    assert "tau (tokens/step)" in r.output and "speedup TPOT" in r.output
    for name in ("summary.json", "requests.jsonl", "README.md", "demo_check.json"):
        assert (out / name).is_file(), name
    assert list(out.glob("*.png"))
    check = json.loads((out / "demo_check.json").read_text())
    assert check["mode"] == "draft" and check["ok"] is True
    assert check["tau_served"] == pytest.approx(5.0, rel=0.10)
    assert not _tritonservers_for(repo)


def test_tau_outside_tolerance_is_reported(tmp_path: Path) -> None:
    summary = {"variants": {"spec": {"acceptance": {"tau_server": 2.0}}}}
    assert tau_check(summary, None, None, 0.1)["ok"] is None  # nothing to compare with
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"medusa": {"tau": 3.0}}))
    check = tau_check(summary, None, str(ev), 0.1)
    assert check["ok"] is False and check["relative_difference"] == pytest.approx(1 / 3)
    ev.write_text(json.dumps({"medusa": {"tau": 2.1}}))
    assert tau_check(summary, None, str(ev), 0.1)["ok"] is True


def test_expected_tau_picks_the_tuned_tree(tmp_path: Path) -> None:
    tree = [[0], [1], [0, 0]]
    from tests.helpers.server import trtllm_build_config

    (tmp_path / "build_config.json").write_text(json.dumps(
        trtllm_build_config("medusa") | {"medusa_choices": [[0], [0, 0], [1]]}))
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"medusa": {"tau": 3.0},
                              "medusa_tuned": {"tau": 2.5, "choices": tree}}))
    assert expected_tau(str(tmp_path), str(ev)) == (2.5, "medusa_tuned")
    ev.write_text(json.dumps({"medusa": {"tau": 3.0}, "medusa_tuned": {"tau": 2.5,
                                                                       "choices": [[0]]}}))
    assert expected_tau(str(tmp_path), str(ev)) == (3.0, "medusa")


def test_port_in_use_is_a_clear_error_and_no_server_left(tiny_repo) -> None:  # type: ignore[no-untyped-def]
    engine, repo, root = tiny_repo
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = CliRunner().invoke(cli, ["demo", "--repo", str(repo), "--engine", str(engine),
                                     "--out", str(root / "r2"), "--grpc-port", str(port)])
    assert r.exit_code == 3
    assert "already in use" in r.output
    assert not _tritonservers_for(repo)


def test_repository_without_baseline_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["demo", "--repo", str(tmp_path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "ensemble_baseline" in r.output


@pytest.mark.parametrize(("content", "expect"), [
    ("{oops", "eval.json: invalid JSON"),
    ("[1, 2]", "eval.json: expected a JSON object"),
    ('{"medusa": {"tau": "fast"}}', "eval.json: medusa.tau 'fast': expected a number"),
], ids=["bad-json", "not-object", "tau-not-a-number"])
def test_bad_eval_json_is_one_line_before_any_server(tmp_path: Path, content: str,
                                                     expect: str) -> None:
    from tests.helpers.server import make_fake_trtllm_engine

    engine = make_fake_trtllm_engine(tmp_path, "medusa")
    (tmp_path / "eval.json").write_text(content)
    repo = tmp_path / "served"
    (repo / "ensemble_baseline").mkdir(parents=True)  # what DemoRunConfig.validate looks for
    r = CliRunner().invoke(cli, ["demo", "--repo", str(repo), "--engine", str(engine), "--eval",
                                 str(tmp_path / "eval.json"), "--out", str(tmp_path / "report")])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and expect in lines[0], r.output
    assert not (tmp_path / "report").exists()  # refused before any server or benchmark


def test_demo_model_reuse_with_a_bad_eval_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "eval.json").write_text("{oops")
    r = CliRunner().invoke(cli, ["demo-model", "--out", str(tmp_path / "m")])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "eval.json: invalid JSON" in lines[0], \
        r.output


def test_expected_tau_compares_like_with_like(tmp_path: Path) -> None:
    """eval.json's tau on the served prompts is the reference when its recorded served set is
    this run's (n-gram's tau depends on the prompts); another run shape falls back to the
    held-out tau."""
    from tests.helpers.server import trtllm_build_config

    (tmp_path / "build_config.json").write_text(json.dumps(
        trtllm_build_config("medusa") | {"spec_mode": "ngram", "medusa_choices": None}))
    served = {"prompts": "builtin-code", "seed": 0, "warmup": 2, "requests": 24,
              "max_tokens": 96}
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"ngram": {"tau": 3.3, "tau_served_prompts": 3.74},
                              "served_prompts": served}))
    assert expected_tau(str(tmp_path), str(ev), served) == (3.74, "ngram (served prompts)")
    assert expected_tau(str(tmp_path), str(ev), served | {"requests": 8}) == (3.3, "ngram")
    assert expected_tau(str(tmp_path), str(ev)) == (3.3, "ngram")
    summary = {"variants": {"spec": {"acceptance": {"tau_server": 3.7}}}}
    assert tau_check(summary, str(tmp_path), str(ev), 0.1, served)["ok"] is True
    assert tau_check(summary, str(tmp_path), str(ev), 0.1)["ok"] is False  # 12% off 3.3


def test_an_engine_that_picks_k_is_not_held_to_a_fixed_k_tau(tmp_path: Path) -> None:
    """eval.json's tau is measured at a fixed K; a torch engine with the default draft-length
    policy picks k per step, so its served tau is reported, not compared."""
    from tests.helpers.server import trtllm_build_config

    rec = trtllm_build_config("medusa") | {"spec_mode": "ngram", "medusa_choices": None,
                                           "backend": "torch"}
    (tmp_path / "build_config.json").write_text(json.dumps(rec))
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"ngram": {"tau": 3.3}}))
    summary = {"variants": {"spec": {"acceptance": {"tau_server": 1.9}}}}
    check = tau_check(summary, str(tmp_path), str(ev), 0.1)
    assert check["ok"] is None and check["why"] == "the engine picks k per step"
    (tmp_path / "build_config.json").write_text(json.dumps(rec | {"draft_len_policy": "fixed"}))
    assert tau_check(summary, str(tmp_path), str(ev), 0.1)["ok"] is False
