"""``specserve doctor --roofline``: the roofline arithmetic (pure), the CPU name and SMT
topology parsing, the weights a step reads, and the CLI with a tiny probe (4 MB: a real probe
reads 512 MB)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.doctor.roofline import cpu_name, params_read, roofline, siblings
from specserve.errors import SpecserveError
from tests.helpers.tiny import TinyCheckpoint


def test_bandwidth_and_compute_bound_steps() -> None:
    """1e8 weights of 4 bytes at 10 GB/s: 40 ms; 5 rows at 100 GFLOP/s: 1e9 FLOPs, 10 ms;
    the balance at 20 rows; 40 rows are compute-bound (80 ms)."""
    r = roofline(100_000_000, 4, 5, 10.0, 100.0)
    assert (r.bytes_per_step, r.flops_per_step) == (400_000_000, 1e9)
    assert (r.bandwidth_ms, r.compute_ms, r.bound, r.step_ms) == (40.0, 10.0, "bandwidth", 40.0)
    assert r.rows_at_balance == 20.0
    big = roofline(100_000_000, 4, 40, 10.0, 100.0)
    assert (big.compute_ms, big.bound, big.step_ms) == (80.0, "compute", 80.0)
    half = roofline(100_000_000, 2, 5, 10.0, 100.0, dtype="bfloat16")
    assert half.bandwidth_ms == 20.0 and half.to_dict()["step_ms"] == 20.0


@pytest.mark.parametrize("args", [(0, 4, 1, 10.0, 1.0), (10, 4, 0, 10.0, 1.0),
                                  (10, 4, 1, 0.0, 1.0), (10, 4, 1, 1.0, -1.0)])
def test_bad_roofline_input_is_one_clear_error(args: tuple[int, int, int, float, float]) -> None:
    with pytest.raises(SpecserveError, match="roofline"):
        roofline(*args)


def test_smt_siblings_from_topology() -> None:
    """Two CPUs of one core (lists "0,2" or a range "0-1") are siblings; of two cores not."""
    assert not siblings({0, 1}, {0: "0,2\n", 1: "1,3\n"})
    assert siblings({0, 2}, {0: "0,2\n", 2: "0,2\n"})
    assert siblings({0, 1}, {0: "0-1\n", 1: "0-1\n"})
    assert not siblings({0}, {0: "0-1\n"})  # a sibling this process may not run on
    assert not siblings({0, 1}, {})  # no topology: each CPU its own core


def test_cpu_name_from_cpuinfo() -> None:
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: avx2\n"
    assert cpu_name(text) == "AMD EPYC 7B13"
    assert cpu_name("") != ""


def test_a_step_reads_every_weight_but_an_untied_embedding() -> None:
    t = {"model.embed_tokens.weight": SimpleNamespace(shape=(100, 8)),
         "lm_head.weight": SimpleNamespace(shape=(100, 8)),
         "model.layers.0.mlp.down_proj.weight": SimpleNamespace(shape=(8, 16)),
         "model.norm.weight": SimpleNamespace(shape=(8,))}
    assert params_read(t, tied=False) == 800 + 128 + 8
    tied = {k: v for k, v in t.items() if k != "lm_head.weight"}
    assert params_read(tied, tied=True) == 800 + 128 + 8


def test_cli_roofline_of_a_target(tiny_ckpt: TinyCheckpoint) -> None:
    """``--model`` alone with ``--roofline``: the machine and plain / verify steps (batch 2,
    K = 3: 2 and 8 rows), as JSON and as info lines; the pairing's report carries it too."""
    base = ["doctor", "--model", str(tiny_ckpt.target), "--roofline", "--roofline-mb", "4",
            "--batch", "2", "--num-draft-tokens", "3"]
    out = CliRunner().invoke(cli, [*base, "--format", "json"])
    assert out.exit_code == 0, out.output
    roof = json.loads(out.output)["roofline"]
    assert roof["machine"]["read_gbs"] > 0 and roof["machine"]["gflops"] > 0
    assert "GEMV (" in roof["machine"]["method"] and ") over 4 MB" in roof["machine"]["method"]
    assert [roof["steps"][k]["rows"] for k in ("plain", "verify")] == [2, 8]
    assert roof["steps"]["plain"]["bytes_per_step"] == 4 * roof["params"]
    text = CliRunner().invoke(cli, base)
    assert text.exit_code == 0
    codes = [line.split(": ")[1] for line in text.output.strip().splitlines()[:-1]]
    assert codes == ["machine", "roofline", "roofline"]
    paired = CliRunner().invoke(cli, [*base, "--draft", str(tiny_ckpt.target), "--no-probe",
                                      "--format", "json"])
    assert paired.exit_code == 0, paired.output
    assert json.loads(paired.output)["roofline"]["steps"]["verify"]["rows"] == 8


def test_without_the_flag_a_target_alone_is_still_an_error(tiny_ckpt: TinyCheckpoint) -> None:
    out = CliRunner().invoke(cli, ["doctor", "--model", str(Path(tiny_ckpt.target))])
    assert out.exit_code == 2
    assert "doctor checks a pairing" in out.output
