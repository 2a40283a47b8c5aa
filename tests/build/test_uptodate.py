"""``make engine`` reuse: an engine is up to date only for the same options, input bytes and
package versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from specserve.build.uptodate import is_up_to_date
from specserve.cli.main import cli
from tests.helpers.tiny import TinyCheckpoint


def _build(ckpt: TinyCheckpoint, out: Path, *extra: str) -> dict[str, Any]:
    args = ["build", "--model", str(ckpt.target), "--medusa", str(ckpt.medusa), "--backend",
            "torch", "--out", str(out), "--force", "--format", "json", *extra]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_up_to_date_only_when_nothing_changed(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "engines" / "demo"
    assert not is_up_to_date(_build(ckpt, out, "--dry-run"))
    _build(ckpt, out)
    assert is_up_to_date(_build(ckpt, out, "--dry-run"))
    assert not is_up_to_date(_build(ckpt, out, "--dry-run", "--max-batch-size", "4"))
    cfg = ckpt.medusa / "config.json"
    cfg.write_text(cfg.read_text() + " ")  # same meaning, different bytes
    assert not is_up_to_date(_build(ckpt, out, "--dry-run"))
