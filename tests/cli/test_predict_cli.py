"""``specserve predict`` and ``specserve tune-tree`` through the CLI group (CliRunner)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

LLAMA31_8B = {
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "tie_word_embeddings": False,
}


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def _json(*args: str) -> dict[str, Any]:
    code, out, err = _run(*args, "--format", "json")
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def test_predict_70b_h100_textbook_figure() -> None:
    r = _json("predict", "--params", "70e9", "--dtype", "fp16", "--gpu", "h100-sxm")
    assert r["decode"]["t1_ms"] == pytest.approx(41.8, abs=0.05)
    assert r["decode"]["bound"] == "memory"
    assert r["speculation"] is None
    code, text, _ = _run("predict", "--params", "70e9")
    assert code == 0 and "41.79 ms" in text


def test_predict_from_config_with_kv_and_batch(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B))
    r = _json("predict", "--config", str(tmp_path), "--dtype", "bf16", "--gpu", "h200",
              "--batch", "4", "--kv-len", "1000")
    assert r["model"]["params"] == 8_030_261_248
    assert r["model"]["kv_bytes_per_token"] == 131072
    expect_s = (8_030_261_248 * 2 + 4 * 1000 * 131072) / 4.8e12
    assert r["decode"]["t1_ms"] == pytest.approx(expect_s * 1e3)
    assert r["decode"]["tokens_per_s_ceiling"] == pytest.approx(4 / expect_s)


def test_predict_best_k_matches_worked_table() -> None:
    r = _json("predict", "--params", "70e9", "--proposer", "draft", "--draft-cost", "0.05",
              "--alpha", "0.8", "--draft-len", "5", "--max-draft-len", "20")
    spec = r["speculation"]
    assert round(spec["chosen"]["tau"], 2) == 3.69
    assert round(spec["chosen"]["speedup"], 2) == 2.95
    assert (spec["best"]["k"], round(spec["best"]["speedup"], 2)) == (8, 3.09)


def test_predict_from_bench_summary(tmp_path: Path) -> None:
    summary: dict[str, Any] = {"variants": {"spec": {"acceptance": {
        "per_position_acceptance": [0.6, 0.4, 0.2, 0.1], "tau_server": 2.3}}},
        "speedup": {"tpot_s": {"speedup": 1.7}}}
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(summary))
    r = _json("predict", "--params", "7e9", "--proposer", "ngram", "--summary", str(p))
    points = {pt["k"]: pt for pt in r["speculation"]["points"]}
    assert sorted(points) == [1, 2, 3, 4]
    assert points[4]["tau"] == pytest.approx(2.3)
    assert points[4]["speedup"] == pytest.approx(2.3)  # n-gram, memory-bound verify
    assert r["measured_speedup"] == {"tpot_s": 1.7}
    code, _, err = _run("predict", "--params", "7e9", "--summary", str(p),
                        "--step-overhead-ms", "auto")
    assert code == 2 and "baseline" in err
    summary["variants"]["baseline"] = {"tpot_ms": {"mean": 30.0}}  # T(1) = 14e9 B / 3.35 TB/s
    p.write_text(json.dumps(summary))
    r = _json("predict", "--params", "7e9", "--proposer", "ngram", "--summary", str(p),
              "--step-overhead-ms", "auto")
    t1 = 14e9 / 3.35e12 * 1e3
    assert r["speculation"]["points"][0]["overhead_ms"] == pytest.approx(30.0 - t1)
    assert r["speculation"]["points"][3]["speedup"] == pytest.approx(2.3)  # ngram: o cancels
    r = _json("predict", "--params", "7e9", "--summary", str(p), "--tree-nodes", "63")
    assert r["speculation"]["chosen"]["n_verify"] == 64
    assert r["speculation"]["chosen"]["k"] == 4


@pytest.mark.parametrize(
    ("args", "msg"),
    [(["--params", "7e9", "--config", "x"], "exactly one"),
     (["--config", "/nonexistent/config.json"], "not found"),
     (["--params", "7e9", "--dtype", "fp8", "--gpu", "a100-80g"], "FP8"),
     (["--params", "7e9", "--rates", "0.3,0.5"], "exceeds"),
     (["--params", "7e9", "--alpha", "0.5", "--rates", "0.3"], "one of"),
     (["--params", "7e9", "--proposer", "draft", "--alpha", "0.7"], "--draft-params")],
)
def test_predict_bad_input_is_one_line(args: list[str], msg: str) -> None:
    code, _, err = _run("predict", *args)
    assert code == 2
    assert msg in err and len(err.strip().splitlines()) == 1


def test_predict_measure_on_tiny_checkpoint(tiny_ckpt: Any) -> None:
    r = _json("predict", "--config", str(tiny_ckpt.target), "--measure", "--reps", "2",
              "--proposer", "draft", "--draft-config", str(tiny_ckpt.draft),
              "--alpha", "0.5", "--max-draft-len", "3", "--kv-len", "8")
    assert r["hardware"]["step_times"] == "measured" and r["hardware"]["stat"] == "min"
    assert sorted(r["step_ms"]) == ["1", "2", "3", "4"]
    assert all(v > 0 for v in r["step_ms"].values())
    spec = r["speculation"]
    assert spec["propose_cost"] == "measured"
    assert spec["points"][0]["propose_ms"] > 0
    r = _json("predict", "--config", str(tiny_ckpt.target), "--measure", "--reps", "1",
              "--medusa-dir", str(tiny_ckpt.medusa), "--tau", "2.0", "--draft-len", "3",
              "--tree-nodes", "20")
    assert r["speculation"]["chosen"]["n_verify"] == 21
    assert r["speculation"]["chosen"]["propose_ms"] > 0


# ---------------------------------------------------------------------------- tune-tree


def _simulated_summary(acc: list[list[float]], steps: int, seed: int) -> dict[str, Any]:
    """accepted_nodes of ``steps`` T=0 tree-verify steps through mc_sim_7b_63 (independent
    heads, each head's right token at one rank drawn from its accuracies)."""
    from tests.spec.test_tree_tuning import _simulate

    counts = _simulate(acc, MC_SIM_7B_63, steps, random.Random(seed))
    emitted = steps + sum(counts.values())  # one bonus token per step + every accepted node
    return {"variants": {"spec": {"acceptance": {
        "accepted_nodes": {f"{h},{r}": n for (h, r), n in counts.items()}, "steps": steps,
        "tau_server": emitted / steps}}}}


def test_tune_tree_from_summary_writes_valid_files(tmp_path: Path) -> None:
    acc = [[0.55, 0.1, 0.05], [0.5, 0.1], [0.45, 0.05], [0.4]]
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(_simulated_summary(acc, 4000, seed=1)))
    out = tmp_path / "trees" / "tuned.json"
    r = _json("tune-tree", "--from", str(src), "--nodes", "20", "--out", str(out))
    listed = MedusaTree.from_choices(json.loads(out.read_text()), num_heads=4)
    braced = MedusaTree.from_brace(out.with_suffix(".txt").read_text(), num_heads=4)
    assert listed == braced and listed.num_nodes == r["nodes"] <= 20
    assert r["tau_expected"] >= r["default_tree"]["tau_expected"]  # 20 nodes vs 63
    # the model's tau for the measured tree matches the measured tau (seed 1, 4000 steps:
    # sd of tau is about 0.02; bound 0.08)
    assert r["default_tree"]["tau_expected"] == pytest.approx(r["measured_tau"], abs=0.08)


def test_tune_tree_steps_derived_and_accuracy_inputs(tmp_path: Path) -> None:
    s = _simulated_summary([[0.5, 0.2], [0.4]], 1000, seed=2)
    block = s["variants"]["spec"]["acceptance"]
    head0 = sum(v for k, v in block["accepted_nodes"].items() if k.startswith("0,"))
    block["per_position_acceptance"] = [head0 / 1000]
    del block["steps"]
    src = tmp_path / "s.json"
    src.write_text(json.dumps(s))
    assert _json("tune-tree", "--from", str(src), "--nodes", "5")["steps"] == 1000
    cum = tmp_path / "cum.json"
    cum.write_text(json.dumps({"topk_accuracy": [[0.6, 0.7], [0.5, 0.55]]}))
    r = _json("tune-tree", "--from", str(cum), "--nodes", "3")
    assert r["medusa_choices"] == [[0], [1], [0, 0]]  # values .6, .3, .1 -> (0) (0,0) (1)
    demo = tmp_path / "eval.json"
    demo.write_text(json.dumps({"medusa": {"top1_accuracy": [0.6, 0.4, 0.3]}}))
    assert _json("tune-tree", "--from", str(demo))["medusa_choices"] == [[0], [0, 0],
                                                                          [0, 0, 0]]


def test_tune_tree_measured_tree_and_depth_options(tmp_path: Path) -> None:
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(_simulated_summary([[0.5, 0.2], [0.4]], 500, seed=3)))
    tree = tmp_path / "measured.txt"
    tree.write_text(MedusaTree.from_choices(MC_SIM_7B_63).to_brace())
    r = _json("tune-tree", "--from", str(src), "--measured-tree", "none", "--max-depth", "1",
              "--nodes", "2")
    assert r["measured_tree"].startswith("none") and r["depth"] == 1
    assert r["medusa_choices"] == [[0], [1]]
    assert _json("tune-tree", "--from", str(src), "--measured-tree",
                 str(tree))["measured_tree"] == str(tree)


@pytest.mark.parametrize(
    ("data", "msg"),
    [({"variants": {"spec": {"acceptance": {"accepted_nodes": {"0,0": 3}}}}}, "steps"),
     ({"accepted_nodes": {"zero": 3}, "steps": 5}, "head,rank"),
     ({"something": 1}, "expected a bench summary"),
     ([[0.9, 0.5]], "sum to")],
)
def test_tune_tree_bad_input_writes_nothing(tmp_path: Path, data: Any, msg: str) -> None:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "t.json"
    code, _, err = _run("tune-tree", "--from", str(src), "--out", str(out))
    assert code == 2 and msg in err
    assert not out.exists() and not out.with_suffix(".txt").exists()


@pytest.mark.parametrize(
    ("cmd", "data", "msg"),
    [("predict", {"variants": {"spec": {"acceptance": {"per_position_acceptance": ["x"]}}}},
      "per_position_acceptance: expected a list of numbers"),
     ("predict", {"variants": {"spec": {"acceptance": {"per_position_acceptance": 5}}}},
      "per_position_acceptance: expected a list of numbers"),
     ("tune-tree", {"accepted_nodes": [1], "steps": 5}, "accepted_nodes must be an object"),
     ("tune-tree", {"accepted_nodes": {"0,0": 3}, "steps": 5, "tau_server": "x"},
      "tau_server 'x': expected a number"),
     ("tune-tree", {"accepted_nodes": {"0,0": 3}, "steps": 5, "medusa_choices": [5]},
      "medusa_choices: expected a list of lists of ints"),
     ("tune-tree", {"topk_accuracy": [0.5]}, "topk_accuracy: expected one list")],
)
def test_malformed_json_is_one_line_not_a_traceback(tmp_path: Path, cmd: str, data: Any,
                                                    msg: str) -> None:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(data))
    args = ["--params", "7e9", "--summary", str(src)] if cmd == "predict" else ["--from", str(src)]
    for fmt in ("text", "json"):
        code, out, err = _run(cmd, *args, "--format", fmt)
        assert code == 2 and out == ""
        assert err.strip() == f"error: {src}: {msg}" or (
            err.startswith(f"error: {src}: {msg}") and len(err.strip().splitlines()) == 1)


def test_config_list_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1]")
    code, _, err = _run("predict", "--config", str(tmp_path))
    assert code == 2 and err.strip() == f"error: {tmp_path / 'config.json'}: expected a JSON " \
        "object (an HF config.json)"
