"""``specserve tune-schedule`` on (input length x concurrency) sweeps: a schedule per length,
the deployed one chosen by the expected context with the batch-only caveat, and every engine's
option names as upstream spells them (tests/data/schedule_engine_keys.json); vLLM's table
checked by vLLM 0.32's own validator where the peer is installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.spec.schedule import DraftSchedule
from specserve.tune_schedule import (
    TuneScheduleConfig,
    context_bucket,
    parse_source,
    tune_schedule,
    vllm_config,
)

KEYS = json.loads((Path(__file__).parent / "data" / "schedule_engine_keys.json").read_text())
VLLM_UTILS = Path(".peers/vllm/lib/python3.11/site-packages/vllm/v1/spec_decode/dynamic/utils.py")


def _sweep(path: Path, cells: dict[tuple[int, int], tuple[float, float]]) -> Path:
    """cells: (input length, concurrency) -> (spec, baseline) output tok/s."""
    levels = [{"input_length": n, "concurrency": c,
               "spec": {"output_token_throughput_tok_s": s, "per_user_tok_s_mean": 1.0},
               "baseline": {"output_token_throughput_tok_s": b, "per_user_tok_s_mean": 1.0}}
              for (n, c), (s, b) in sorted(cells.items())]
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"levels": levels, "input_lengths": [128, 448]}))
    return path


# short context: speculation stops paying at c=8; long context: it pays at every load (the
# baseline's decode step got expensive too, and K=4 still wins at c=8)
K4 = {(128, 1): (300.0, 100.0), (128, 4): (320.0, 300.0), (128, 8): (350.0, 500.0),
      (448, 1): (200.0, 80.0), (448, 4): (260.0, 200.0), (448, 8): (330.0, 300.0)}


def test_a_schedule_per_length_and_the_deployed_one(tmp_path: Path) -> None:
    src = (parse_source(f"4={_sweep(tmp_path / 'k4', K4)}"),)
    r = tune_schedule(TuneScheduleConfig(src, tmp_path / "s.json", context=200))
    assert [(lv["input_length"], lv["concurrency"], lv["best"]) for lv in r["levels"]] == [
        (128, 1, 4), (128, 4, 4), (128, 8, 0), (448, 1, 4), (448, 4, 4), (448, 8, 4)]
    assert {n: f["schedule"] for n, f in r["by_context"].items()} == {"128": "1:4,8:0",
                                                                      "448": "1:4"}
    assert r["context"]["input_length"] == 448 and r["schedule"] == "1:4"   # 200 -> bucket 448
    assert "measured at 448 input tokens" in r["context"]["caveat"]
    assert "K=4 at concurrency 8 and 128 input tokens" in r["flags"][0]
    short = tune_schedule(TuneScheduleConfig(src, None, context=100))
    assert short["schedule"] == "1:4,8:0" and short["vllm_config"] == {
        "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 7, 4],
                                                                               [8, 8, 0]]}
    assert short["sglang"] == {"1": "--speculative-num-steps 4 --speculative-eagle-topk 1 "
                               "--speculative-num-draft-tokens 5", "4": short["sglang"]["1"],
                               "8": "off"}
    res = CliRunner().invoke(cli, ["tune-schedule", "--from", f"4={tmp_path / 'k4'}",
                                   "--context", "100"])
    assert res.exit_code == 0 and "schedule per input length: 128: 1:4,8:0; 448: 1:4" in \
        res.output and "batch-only" in res.output


def test_context_bucket() -> None:
    assert context_bucket([128, 512, 2048], 100) == 128
    assert context_bucket([128, 512, 2048], 513) == 2048
    assert context_bucket([128, 512, 2048], 4096) == 2048   # beyond: the longest measured
    assert context_bucket([128, 512, 2048], None) == 2048


def test_context_without_a_context_sweep_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "b"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"levels": [
        {"concurrency": 1, "spec": {"output_token_throughput_tok_s": 2.0},
         "baseline": {"output_token_throughput_tok_s": 1.0}}]}))
    with pytest.raises(SpecserveError, match="--context needs sweeps with --input-lengths"):
        tune_schedule(TuneScheduleConfig((parse_source(f"4={d}"),), None, context=512))


def test_emitted_names_are_upstreams(tmp_path: Path) -> None:
    r = tune_schedule(TuneScheduleConfig((parse_source(f"4={_sweep(tmp_path / 'k', K4)}"),),
                                         None, context=100))
    for form in [r, *r["by_context"].values()]:
        assert form["build_option"].split()[0] == KEYS["specserve"]["option"]
        assert set(form["trtllm_pytorch"]["1.2"]) - {"note"} <= set(KEYS["trtllm"]["keys"])
        assert set(form["trtllm_pytorch"]["later"]) - {"note"} <= set(KEYS["trtllm"]["keys"])
        assert set(form["vllm_config"]) <= set(KEYS["vllm"]["speculative_config_keys"])
        flags = {w for v in form["sglang"].values() for w in v.split() if w.startswith("--")}
        assert flags <= set(KEYS["sglang"]["flags"])
    assert all(KEYS[e]["context_key"] is None for e in ("specserve", "trtllm", "vllm", "sglang"))


@pytest.mark.parametrize("text, largest", [("1:4,8:2,16:0", 32), ("1:3", 8), ("1:2,4:4", 4)])
def test_vllm_table_means_our_schedule_to_vllm_itself(text: str, largest: int) -> None:
    s = DraftSchedule.parse(text)
    cfg = vllm_config(s, largest)
    if not VLLM_UTILS.is_file():
        pytest.skip("vLLM 0.32 peer not installed (make peer-vllm)")
    spec = importlib.util.spec_from_file_location("vllm_dynamic_sd_utils", VLLM_UTILS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    dense = mod.build_dynamic_sd_schedule_lookup(cfg["num_speculative_tokens_per_batch_size"],
                                                 64, cfg["num_speculative_tokens"])
    assert dense[1:] == [s.at(b) for b in range(1, 65)]


def test_no_speculation_anywhere_gives_no_vllm_table() -> None:
    assert vllm_config(DraftSchedule.parse("1:0"), 8) == {}
