"""``--force`` replaces only what specserve wrote (specserve/outputs.py).

Each command that writes a directory is pointed with ``--force`` at a directory holding a user's
file: it must exit 2 with one line and leave the directory byte for byte as it was. Its own
output, written by the same command, is replaced.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.errors import SpecserveError
from specserve.outputs import MARKER, check_replaceable, staged_output, written_by


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 (or "dir") of everything under ``root``."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


@pytest.fixture()
def user_dir(tmp_path: Path) -> Path:
    d = tmp_path / "mine"
    (d / "notes").mkdir(parents=True)
    (d / "thesis.tex").write_text("three years of work\n")
    (d / "notes" / "a.txt").write_bytes(b"\x00\x01 bytes")
    return d


def _run(args: list[str]) -> Any:
    from specserve.cli.main import cli

    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _assert_refused(result: Any, user_dir: Path, before: dict[str, str]) -> None:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "not written by specserve" in lines[0], lines[0]
    assert snapshot(user_dir) == before
    assert not list(user_dir.parent.glob(f".{user_dir.name}.*")), "a stage was left behind"


def test_repo_force_refuses_a_users_directory(tmp_path: Path, user_dir: Path) -> None:
    from tests.helpers.server import make_fake_trtllm_engine

    engine = make_fake_trtllm_engine(tmp_path, "medusa")
    before = snapshot(user_dir)
    result = _run(["repo", "--engine", str(engine), "--out", str(user_dir), "--force"])
    _assert_refused(result, user_dir, before)
    # its own output is replaced
    out = tmp_path / "repo"
    assert _run(["repo", "--engine", str(engine), "--out", str(out)]).exit_code == 0
    (out / "stale.txt").write_text("from the first run")
    assert _run(["repo", "--engine", str(engine), "--out", str(out), "--force"]).exit_code == 0
    assert not (out / "stale.txt").exists() and (out / "ensemble" / "config.pbtxt").is_file()
    assert written_by(out) == "specserve repo"


def test_build_force_refuses_a_users_directory(tiny_ckpt: Any, user_dir: Path) -> None:
    before = snapshot(user_dir)
    result = _run(["build", "--model", str(tiny_ckpt.target), "--backend", "torch", "--ngram",
                   "--out", str(user_dir), "--force"])
    _assert_refused(result, user_dir, before)


def test_build_force_refuses_another_commands_output(tmp_path: Path, tiny_ckpt: Any) -> None:
    """`specserve build --force` over a repository (a typo in --out) must not wipe it."""
    from tests.helpers.server import make_fake_trtllm_engine

    repo = tmp_path / "repo"
    engine = make_fake_trtllm_engine(tmp_path, "medusa")
    assert _run(["repo", "--engine", str(engine), "--out", str(repo)]).exit_code == 0
    before = snapshot(repo)
    result = _run(["build", "--model", str(tiny_ckpt.target), "--backend", "torch", "--ngram",
                   "--out", str(repo), "--force"])
    assert result.exit_code == 2 and "written by `specserve repo`" in result.output
    assert snapshot(repo) == before


def test_train_medusa_force_refuses_a_users_directory(tiny_ckpt: Any, user_dir: Path) -> None:
    before = snapshot(user_dir)
    result = _run(["train-medusa", "--model", str(tiny_ckpt.target), "--out", str(user_dir),
                   "--force", "--steps", "1", "--samples", "2"])
    _assert_refused(result, user_dir, before)


def test_demo_model_force_refuses_a_users_directory(user_dir: Path) -> None:
    before = snapshot(user_dir)
    result = _run(["demo-model", "--out", str(user_dir), "--force", "--minutes", "0.01"])
    _assert_refused(result, user_dir, before)


def test_failed_write_keeps_the_old_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with staged_output(out, False, "specserve test") as stage:
        (stage / "v1").write_text("1")
    with pytest.raises(RuntimeError), staged_output(out, True, "specserve test") as stage:
        (stage / "v2").write_text("2")
        raise RuntimeError("boom")
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "v1"])
    assert not list(tmp_path.glob(".out.*")), "stage or old copy left behind"


def test_unmarked_leftover_stage_is_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stage = tmp_path / ".out.building"
    stage.mkdir()
    (stage / "keep.txt").write_text("not ours")
    with pytest.raises(SpecserveError, match="was not left by specserve"), \
            staged_output(out, False, "specserve test"):
        pass
    assert (stage / "keep.txt").read_text() == "not ours"


@pytest.mark.parametrize("make", ["file", "symlink"])
def test_force_refuses_files_and_links(tmp_path: Path, make: str) -> None:
    target = tmp_path / "real"
    target.mkdir()
    (target / MARKER).write_text('{"written_by": "specserve test"}')
    out = tmp_path / "out"
    if make == "file":
        out.write_text("x")
    else:
        out.symlink_to(target)
    with pytest.raises(SpecserveError, match="not a directory|refusing"):
        check_replaceable(out, True, "specserve test")
    assert out.exists() and (target / MARKER).exists()
