"""Report files from synthetic records, and the CLI's handling of bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.client.metrics import make_record
from specserve.client.report import build_summary, write_report
from specserve.client.summary import parse_slo, speedups


def _records() -> list:
    rs = []
    for i in range(8):
        for variant, sizes in (("spec", (1, 3, 2)), ("baseline", (1,) * 6)):
            times = [0.01 + 0.005 * j + 0.001 * i for j in range(len(sizes))]
            rs.append(make_record(
                index=len(rs), variant=variant, phase="measure", model=variant, url="h:1",
                prompt_index=i, send_time_unix_s=0.0, streaming=True, chunk_times_s=times,
                chunk_tokens=sizes, end_s=times[-1], token_count_source="server",
                server={"total_draft_tokens": 9, "total_accepted_draft_tokens": 3}
                if variant == "spec" else {}))
    rs.append(make_record(index=len(rs), variant="spec", phase="measure", model="spec",
                          url="h:1", prompt_index=9, send_time_unix_s=0.0, streaming=True,
                          chunk_times_s=[], chunk_tokens=[], end_s=None,
                          token_count_source="chunks", error="rejected"))
    return rs


def test_write_report(tmp_path: Path) -> None:
    rs = _records()
    sp = speedups(rs, seed=0, n_boot=200)
    summary = build_summary(rs, 1.0, parse_slo("ttft=100"), sp, {"config": {"url": "h:1"}})
    files = write_report(tmp_path, summary, rs, sp)
    for name in ("summary.json", "summary.csv", "README.md", "latency_cdf.png",
                 "itl_histogram.png", "tokens_per_step.png", "speedup.png"):
        assert name in files and (tmp_path / name).stat().st_size > 0
        if name.endswith(".png"):
            assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["records"] == {"total": 17, "warmup": 0, "completed": 16, "error": 1,
                            "cancelled": 0}
    assert s["variants"]["spec"]["acceptance"]["acceptance_rate"] == pytest.approx(1 / 3)
    assert s["speedup"]["e2e_s"]["speedup"] > 1.0
    rows = list(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))
    e2e = next(r for r in rows if r["variant"] == "spec" and r["metric"] == "e2e_ms")
    assert float(e2e["p50"]) == pytest.approx(s["variants"]["spec"]["e2e_ms"]["p50"])
    readme = (tmp_path / "README.md").read_text()
    assert "![speedup.png](speedup.png)" in readme and "| ttft p50 (ms) |" in readme
    assert not list(tmp_path.glob(".*"))  # no temp files left behind


@pytest.mark.parametrize(("args", "msg"), [
    (["--url", "nohost"], "is not HOST:PORT"),
    (["--url", "h:1", "--concurrency", "2", "--request-rate", "1"], "not both"),
    (["--url", "h:1", "--concurrency", "0"], "--concurrency"),
    (["--url", "h:1", "--slo", "ttft=x"], "--slo"),
    (["--url", "h:1", "--prompts", "nope"], "unknown set"),
    (["--url", "h:1", "--top-p", "0"], "--top-p"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path: Path, args: list[str], msg: str) -> None:
    r = CliRunner().invoke(cli, ["bench", *args, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_malformed_dataset_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a"}\n{oops\n')
    r = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:1", "--dataset", str(f),
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "d.jsonl:2: invalid JSON" in r.output


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unreachable_server_exits_3_without_output(tmp_path: Path, protocol: str) -> None:
    from specserve.triton.server import find_free_port

    port = find_free_port()
    r = CliRunner().invoke(cli, ["bench", "--url", f"127.0.0.1:{port}", "--protocol", protocol,
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 3, r.output
    assert f"127.0.0.1:{port}" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_help_has_examples() -> None:
    r = CliRunner().invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0 and "--baseline-model ensemble_baseline" in r.output
