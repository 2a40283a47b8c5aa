"""Lookahead decoding on the engine flow: ``specserve build --lookahead
W,N,G`` plans ``trtllm-build --speculative_decoding_mode lookahead_decoding --max_draft_len D``
with upstream's D(W, N, G), records (W, N, G), and ``specserve repo`` writes ``decoding_mode
lookahead`` with the three ``lookahead_*`` parameters; every upstream fact is pinned in
``data/trtllm_lookahead.json`` (files and commits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.spec.lookahead import Lookahead
from specserve.triton.repository import RepoOptions, write_repository
from tests.helpers.server import make_fake_trtllm_engine
from tests.helpers.tiny import TinyCheckpoint

UPSTREAM: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "trtllm_lookahead.json")
                                      .read_text())


def d_of(w: int, n: int, g: int) -> int:
    """The README's formula, written out again here from the data file's statement."""
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


def test_max_draft_len_is_upstream_s_formula() -> None:
    ex = UPSTREAM["readme_example"]
    assert Lookahead(*ex["wng"]).max_draft_len == ex["max_draft_len"] == d_of(*ex["wng"])
    for wng in [(2, 2, 1), (4, 4, 4), (5, 3, 2), (8, 2, 0), (3, 5, 7)]:
        assert Lookahead(*wng).max_draft_len == d_of(*wng), wng
    assert Lookahead.parse(" 7, 7 ,7").text() == "7,7,7"


@pytest.mark.parametrize(("text", "message"), [
    ("7,7", "expected three integers W,N,G"),
    ("a,b,c", "expected three integers W,N,G"),
    (",".join(map(str, UPSTREAM["autoregressive"])), r"drafts nothing \(max_draft_len 0"),
    ("0,3,1", "W and N must be >= 1 and G >= 0"),
    ("3,3,-1", "W and N must be >= 1 and G >= 0"),
])
def test_bad_configurations_are_one_line(text: str, message: str) -> None:
    with pytest.raises(SpecserveError, match=message):
        Lookahead.parse(text)
    Lookahead.parse(",".join(map(str, UPSTREAM["meaningful_minimum"])))


def build(ckpt: TinyCheckpoint, out: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["build", "--model", str(ckpt.target), *args,
                                    "--out", str(out), "--format", "json"])


def test_the_cli_plans_the_lookahead_engine(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    ex = UPSTREAM["readme_example"]
    wng = ",".join(map(str, ex["wng"]))
    result = build(tiny_ckpt, tmp_path / "e", "--lookahead", wng, "--backend", "trtllm",
                   "--dry-run")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["config"]["spec_mode"] == "lookahead"
    assert summary["config"]["max_draft_len"] == ex["max_draft_len"]
    (build_step,) = [s["argv"] for s in summary["plan"]["steps"] if s["kind"] == "build"]
    at = build_step.index("--speculative_decoding_mode")
    assert build_step[at + 1] == UPSTREAM["build_mode"]
    assert build_step[build_step.index("--max_draft_len") + 1] == str(ex["max_draft_len"])
    converts = [s for s in summary["plan"]["steps"] if s["kind"] == "convert"]
    assert [s["name"] for s in converts] == ["convert target"]  # the target alone, no draft


@pytest.mark.parametrize(("args", "message"), [
    (["--lookahead", "7,7,7", "--backend", "trtllm", "--max-draft-len", "5"],
     "--max-draft-len 5: --lookahead 7,7,7 needs max_draft_len 83"),
    (["--lookahead", "7,7,7", "--backend", "torch"], "--lookahead: needs --backend trtllm"),
    (["--lookahead", "7,7,7", "--backend", "trtllm", "--flow", "pytorch"],
     "--lookahead with --flow pytorch: not planned"),
    (["--lookahead", "7,7,7", "--ngram", "--backend", "trtllm"], "give exactly one of"),
    (["--lookahead", "1,1,0", "--backend", "trtllm"], "drafts nothing"),
])
def test_the_cli_refuses_what_upstream_does_not_build(
        tiny_ckpt: TinyCheckpoint, tmp_path: Path, args: list[str], message: str) -> None:
    result = build(tiny_ckpt, tmp_path / "bad", *args, "--dry-run")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def lookahead_engine(root: Path, **record: Any) -> Path:
    engine = make_fake_trtllm_engine(root, "medusa")
    path = engine / "build_config.json"
    cfg = json.loads(path.read_text())
    cfg.update({"spec_mode": "lookahead", "max_draft_len": 83, "medusa_choices": None,
                "lookahead": Lookahead(7, 7, 7).to_dict(), **record})
    path.write_text(json.dumps(cfg))
    return engine


def test_the_repository_writes_the_lookahead_parameters(tmp_path: Path) -> None:
    repo = write_repository(lookahead_engine(tmp_path), tmp_path / "repo", RepoOptions())
    mc = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(),
                           model_config_pb2.ModelConfig())
    params = {k: v.string_value for k, v in mc.parameters.items()}
    assert params["decoding_mode"] == UPSTREAM["triton_decoding_mode"]
    assert [params[k] for k in UPSTREAM["triton_parameters"]] == ["7", "7", "7"]
    assert params["medusa_choices"] == params["eagle_choices"] == ""
    bls = text_format.Parse((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text(),
                            model_config_pb2.ModelConfig())
    assert bls.parameters["speculative_mode"].string_value == ""  # no BLS loop: one engine


@pytest.mark.parametrize(("record", "message"), [
    ({"lookahead": None}, "'lookahead' must hold integer"),
    ({"max_draft_len": 23}, "lookahead 7,7,7 gives max_draft_len 83, the engine was built "
                            "with 23"),
])
def test_a_record_that_cannot_load_is_refused(tmp_path: Path, record: dict[str, Any],
                                              message: str) -> None:
    """The C++ backend fails to load decoding_mode lookahead without all three parameters,
    and the server's (W, N, G) must give the engine's max_draft_len."""
    with pytest.raises(SpecserveError, match=message):
        write_repository(lookahead_engine(tmp_path, **record), tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_the_record_keeps_w_n_g_and_repeats_the_build(tiny_ckpt: TinyCheckpoint,
                                                      tmp_path: Path) -> None:
    from specserve.build.config import BuildConfig, resolve
    from specserve.build.record import cli_argv, make_record

    cfg = resolve(BuildConfig(model=str(tiny_ckpt.target), out=str(tmp_path / "e"),
                              spec_mode="lookahead", lookahead="4,4,4", backend="trtllm"),
                  json.loads((tiny_ckpt.target / "config.json").read_text()))
    rec = make_record(cfg, [])
    assert rec["lookahead"] == {"window_size": 4, "ngram_size": 4, "verification_set_size": 4}
    assert rec["max_draft_len"] == d_of(4, 4, 4)
    argv = cli_argv(cfg)
    assert argv[argv.index("--lookahead") + 1] == "4,4,4"
