"""Client faults (``docs/reliability.md``): ``specserve bench`` against an
unreachable URL, with malformed dataset lines, and against a server that dies mid-stream (the
records so far are kept, a partial report is written, the exit code is non-zero). Plus a small
version of the soak's SIGINT-during-build check."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bench(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, ["bench", *args])
    return result.exit_code, [ln for ln in result.stderr.splitlines() if ln.strip()]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unreachable_url(tmp_path: Path, protocol: str) -> None:
    url = f"127.0.0.1:{_free_port()}"
    code, lines = _bench("--url", url, "--protocol", protocol, "--requests", "2",
                         "--out", str(tmp_path / "r"), "--timeout", "10")
    assert code == 3, lines
    assert len(lines) == 1 and lines[0].startswith("error: ") and url in lines[0], lines


BAD_LINES = [
    ("invalid JSON", '{"prompt": "a"', ":2: invalid JSON"),
    ("not an object", '["a", "b"]', ":2: expected a JSON object, got list"),
    ("no prompt", '{"text_inputs": "a"}', ":2: missing 'prompt'"),
    ("empty prompt", '{"prompt": ""}', ":2: 'prompt' must be a non-empty string"),
    ("prompt not a string", '{"prompt": 5}', ":2: 'prompt' must be a non-empty string"),
    ("max_tokens 0", '{"prompt": "a", "max_tokens": 0}', ":2: 'max_tokens' must be a positive"),
    ("max_tokens string", '{"prompt": "a", "max_tokens": "5"}', ":2: 'max_tokens' must be"),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe"}', "bad.jsonl"),
]


@pytest.mark.parametrize(("case", "line", "message"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_malformed_dataset_line(tmp_path: Path, case: str, line: str | bytes,
                                message: str) -> None:
    data = tmp_path / "bad.jsonl"
    raw = line if isinstance(line, bytes) else line.encode()
    data.write_bytes(b'{"prompt": "def f():"}\n' + raw + b"\n")
    code, lines = _bench("--url", f"127.0.0.1:{_free_port()}", "--dataset", str(data),
                         "--out", str(tmp_path / "r"))
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_empty_dataset(tmp_path: Path) -> None:
    data = tmp_path / "empty.jsonl"
    data.write_text("\n\n")
    code, lines = _bench("--url", "127.0.0.1:1", "--dataset", str(data), "--out",
                         str(tmp_path / "r"))
    assert code == 2 and "no prompts" in lines[0], lines


@pytest.mark.server
def test_server_dies_mid_stream(tiny_ckpt: Any, tmp_path: Path) -> None:
    from tests.helpers.server import serve_tiny
    from tests.helpers.soak import kill_during_bench

    dep = serve_tiny(tmp_path / "served", ckpt=tiny_ckpt, baseline=False)
    try:
        res = kill_during_bench(dep.server, tmp_path / "bench", requests=100, kill_after=3,
                                restart=False)
    finally:
        dep.server.stop()
    assert res["bench_exit_code"] != 0, res
    assert res["records"] >= res["recorded_at_kill"] >= 3 and res["statuses"]["error"] >= 1, res
    assert res["summary_written"], res
    records = [json.loads(x) for x in
               (tmp_path / "bench" / "killed" / "requests.jsonl").read_text().splitlines()]
    assert all(r["status"] in ("completed", "error") for r in records)
    assert all(r["error"] for r in records if r["status"] == "error")


def test_sigint_build_leaves_nothing(tiny_ckpt: Any, tmp_path: Path) -> None:
    """SIGINT while the build stages: it exits non-zero and leaves neither directory. The
    build is paused inside its staging step (the engine written into the staging dir, not yet
    renamed; :func:`tests.helpers.soak.sigint_build`), so the signal always lands there."""
    from tests.helpers.soak import sigint_build

    res = sigint_build(tiny_ckpt.target, tmp_path / "engines" / "x")
    assert res["interrupted_while_staging"] and res["exit_code"] != 0, res
    assert res["stderr_tail"] == ["Aborted!"], res  # click's answer to KeyboardInterrupt
    assert not res["engine_dir_left"] and not res["staging_dir_left"], res
