from __future__ import annotations

import json

from click.testing import CliRunner

from specserve.cli.main import cli


def test_help_lists_commands_with_one_line_help() -> None:
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0
    assert "version" in r.output and "Print package versions" in r.output


def test_version_json() -> None:
    r = CliRunner().invoke(cli, ["version", "--format", "json"])
    assert r.exit_code == 0
    data = json.loads(r.output)
    assert data["specserve"] and data["torch"].startswith("2.")
    assert "tensorrt_llm" in data


def test_unknown_command_fails() -> None:
    r = CliRunner().invoke(cli, ["no-such-command"])
    assert r.exit_code != 0
