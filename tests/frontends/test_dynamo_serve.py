"""``specserve serve --frontend dynamo`` as a user runs it (marker ``dynamo``): the JSON it
prints (frontend URL, each worker's metrics URL), /v1/models listing the model, SIGTERM and
SIGINT stopping every child (the descendants before the signal, none left after), a worker
that dies at start-up reported in one line with a non-zero exit, bad flags refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.dynamo import alive, descendants, json_from
from tests.helpers.server import make_tiny_engine

ROOT = Path(__file__).resolve().parents[2]


def _serve(args: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "specserve.cli.main", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _close(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


@pytest.fixture(scope="module")
def engine(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_engine(tiny_ckpt, Path(tmp_path_factory.mktemp("eng")) / "engine-draft",
                            "draft", draft_is_target=True)


@pytest.mark.dynamo
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_urls_and_a_signal_stops_every_child(engine: Path, sig: int) -> None:
    proc = _serve(["--frontend", "dynamo", "--engine", str(engine), "--workers", "2",
                   "--name", "tiny", "--format", "json"])
    try:
        d = json_from(proc)
        assert d["models"] == ["tiny"] and d["frontend"].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(d["frontend"] + "/v1/models", timeout=10) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny"]
        urls = [w["metrics_url"] for w in d["workers"]]
        assert len(urls) == 2 and len(set(urls)) == 2
        for url in urls:
            assert url.startswith("http://127.0.0.1:")
            with urllib.request.urlopen(url, timeout=10) as r:
                assert b"vllm:spec_decode_num_drafts_total" in r.read()
        children = descendants(proc.pid)
        assert {d["frontend_pid"], *(w["pid"] for w in d["workers"])} <= children
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 5
        while alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(children), f"orphans: {alive(children)}"
    finally:
        _close(proc)


@pytest.mark.dynamo
def test_a_worker_that_dies_at_start_up_is_one_line(engine: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(engine, broken)
    (broken / "target" / "model.safetensors").write_bytes(b"not a safetensors file")
    proc = _serve(["--frontend", "dynamo", "--engine", str(broken), "--format", "json",
                   "--timeout", "60"])
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        _close(proc)
    assert proc.returncode == 3, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: worker broken #0 exited with code")
    assert "Traceback" not in err and out == ""


def test_bad_flags_are_refused_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from specserve.cli.main import cli

    cases = [
        (["--repo", str(tmp_path), "--workers", "2"], "--workers is a --frontend dynamo option"),
        (["--frontend", "dynamo", "--repo", str(tmp_path)], "serves --engine DIR"),
        (["--frontend", "dynamo", "--engine", str(tmp_path / "none")],
         "engine directory not found"),
        (["--frontend", "dynamo", "--engine", str(tmp_path), "--host", "0.0.0.0"],
         "binds 127.0.0.1 only"),
    ]
    for args, want in cases:
        res = CliRunner().invoke(cli, ["serve", *args])
        assert res.exit_code == 2 and want in res.output, (args, res.output)
