"""The ``specserve tune-tree`` flow as a library call (:mod:`specserve.tune_tree`), without the
CLI: inputs (summary forms, measured tree choices), the written files, and bad input as
SpecserveError with the file named and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from specserve.errors import SpecserveError
from specserve.spec.tree import MC_SIM_7B_63, MedusaTree
from specserve.tune_tree import (
    TuneTreeConfig,
    load_accuracies,
    measured_tree_of,
    read_tree_file,
    tune_tree,
    write_tree_files,
)

BLOCK = {"accepted_nodes": {"0,0": 600, "0,1": 100, "1,0": 400, "2,0": 200}, "steps": 1000,
         "tau_server": 2.3}


def _write(tmp_path: Path, data: Any, name: str = "in.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_tune_from_summary_writes_both_forms(tmp_path: Path) -> None:
    src = _write(tmp_path, {"variants": {"spec": {"acceptance": BLOCK}}})
    out = tmp_path / "trees" / "t.json"
    r = tune_tree(TuneTreeConfig(src, nodes=3, out=out))
    # estimates through mc_sim_7b_63: a0 = (.6, .1); (x, 0) is under (0) and (1), so
    # a1[0] = 400 / (600 + 100) = 4/7; a2[0] = 200 / (1000 * (.6 + .1) * 4/7) = .5.
    # node values: (0) .6, (0,0) .343, (0,0,0) .171, (1) .1
    assert r["medusa_choices"] == [[0], [0, 0], [0, 0, 0]]
    assert r["accuracies"][1][0] == pytest.approx(4 / 7)
    assert r["tau_expected"] == pytest.approx(1 + 0.6 + 0.6 * 4 / 7 + 0.6 * 4 / 7 * 0.5)
    assert r["files"] == [str(out), str(out.with_suffix(".txt"))]
    assert json.loads(out.read_text()) == r["medusa_choices"]
    assert out.with_suffix(".txt").read_text() == "{0}, {0, 0}, {0, 0, 0}\n" == r["brace"] + "\n"
    assert (r["steps"], r["measured_tau"], r["input"]) == (1000, 2.3, "accepted tree nodes")
    assert r["measured_tree"] == "mc_sim_7b_63 (assumed; pass --measured-tree)"
    assert len(r["accuracies"]) == 4  # the measured tree's depth, though head 3 never hit
    assert r["default_tree"]["nodes"] == len(MC_SIM_7B_63) == 63
    assert tune_tree(TuneTreeConfig(src, nodes=3))["files"] == []


def test_measured_tree_choices(tmp_path: Path) -> None:
    block: dict[str, Any] = {"medusa_choices": [[0], [0, 0], [1]]}
    assert measured_tree_of(None, block, "s.json") == (((0,), (1,), (0, 0)),
                                                       "s.json medusa_choices")
    assert measured_tree_of(None, {}, "s.json")[0] == MC_SIM_7B_63
    assert measured_tree_of("mc_sim_7b_63", block, "s.json") == (MC_SIM_7B_63, "mc_sim_7b_63")
    assert measured_tree_of("none", block, "s.json")[0] is None
    tree = tmp_path / "tree.txt"
    tree.write_text("{0}, {0, 0}")
    assert measured_tree_of(str(tree), block, "s.json") == (((0,), (0, 0)), str(tree))
    # a narrower measured tree raises the estimate of (0,0): reached under (0) only
    src = _write(tmp_path, {"accepted_nodes": {"0,0": 600, "0,1": 100, "1,0": 400},
                            "steps": 1000, "medusa_choices": [[0], [0, 0], [1]]})
    loaded = load_accuracies(src, None)
    assert loaded.measured_tree_choices == ((0,), (1,), (0, 0))
    assert loaded.acc.acc[1][0] == pytest.approx(0.4 / 0.6)


def test_accuracy_file_and_derived_steps(tmp_path: Path) -> None:
    loaded = load_accuracies(_write(tmp_path, {"rank_accuracy": [[0.6, 0.1], [0.5]]}), None)
    assert (loaded.source, loaded.steps, loaded.measured_tree) == ("per-head accuracies",
                                                                   None, None)
    assert loaded.acc.acc == ((0.6, 0.1), (0.5,))
    block = {"accepted_nodes": {"0,0": 300, "1,0": 90}, "per_position_acceptance": [0.3, 0.09]}
    assert load_accuracies(_write(tmp_path, {"acceptance": block}), "none").steps == 1000


def test_read_tree_file(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("[[0], [1], [0, 0]]")
    (tmp_path / "b.txt").write_text("{0}, {1}, {0, 0}\n")
    assert read_tree_file(tmp_path / "a.json") == read_tree_file(tmp_path / "b.txt")
    (tmp_path / "bad.txt").write_text("{0, 0}")
    with pytest.raises(SpecserveError, match=r"bad\.txt: medusa_choices: .*lacks its prefix"):
        read_tree_file(tmp_path / "bad.txt")
    with pytest.raises(SpecserveError, match="missing.txt: not found"):
        read_tree_file(tmp_path / "missing.txt")


def test_write_tree_files_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = MedusaTree.from_choices([[0], [0, 0]])
    with pytest.raises(SpecserveError, match="use a .json name"):
        write_tree_files(tmp_path / "t.txt", tree)
    real_replace = os.replace

    def failing_replace(src: str, dst: Path) -> None:
        if Path(dst).suffix == ".txt":
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_tree_files(tmp_path / "t.json", tree)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temp file left
    monkeypatch.setattr(os, "replace", real_replace)
    assert write_tree_files(tmp_path / "t.json", tree) == (tmp_path / "t.json",
                                                            tmp_path / "t.txt")
    assert (tmp_path / "t.txt").read_text() == "{0}, {0, 0}\n"


@pytest.mark.parametrize(
    ("data", "msg"),
    [({**BLOCK, "tau_server": "fast"}, "tau_server 'fast': expected a number"),
     ({**BLOCK, "medusa_choices": [["a"]]}, "medusa_choices: expected a list of lists"),
     ({**BLOCK, "medusa_choices": [[0, 0]]}, "medusa_choices: .*lacks its prefix"),
     ({"accepted_nodes": [1, 2], "steps": 5}, "accepted_nodes must be an object"),
     ({"accepted_nodes": {"0,0": True}, "steps": 5}, r"accepted_nodes\['0,0'\] = True is"),
     ({"accepted_nodes": {"0,0": 3}, "per_position_acceptance": "abc"},
      "per_position_acceptance: expected a list"),
     ({"topk_accuracy": [["x"]]}, r"topk_accuracy\[0\]: expected a list of numbers"),
     ([0.5, 0.2], "accuracies: expected one list of numbers per head"),
     ({"medusa": {"top1_accuracy": [[0.5]]}}, "medusa.top1_accuracy: expected a list"),
     ([[0.0], [0.0]], "every estimated accuracy is 0")],
)
def test_bad_input_names_the_file_and_writes_nothing(tmp_path: Path, data: Any,
                                                     msg: str) -> None:
    src = _write(tmp_path, data)
    out = tmp_path / "t.json"
    with pytest.raises(SpecserveError, match=f"{src}: {msg}"):
        tune_tree(TuneTreeConfig(src, out=out))
    assert not out.exists() and not out.with_suffix(".txt").exists()
