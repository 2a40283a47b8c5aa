"""The code-edit dataset of Predicted Outputs (specserve/client/edit_dataset.py): records are
the original function + the edit comment + the edited def line, the prediction is the original
body; deterministic for a seed; a corpus without usable functions or a bad corpus.json is one
SpecserveError line; the demo corpus gives records (when its stdlib files exist here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.client.edit_dataset import (
    edit_records,
    load_edit_records,
    read_corpus,
    read_heldout,
    write_jsonl,
)
from specserve.errors import SpecserveError

SOURCE = '''
def scale(values, factor=2):
    """Multiply every value by factor and drop the negative ones, keeping the order."""
    out = []
    for v in values:
        if v * factor >= 0:
            out.append(v * factor)
    return out


def tiny(x):
    return x


class Box:
    def area(self, width, height):
        """The area of a width by height box, rounded down to a whole number of units."""
        total = width * height
        if total < 0:
            raise ValueError("negative area")
        return int(total)
'''


def test_records_ask_for_the_edit_and_predict_the_original_body() -> None:
    recs = edit_records({"m.py": SOURCE}, 10, seed=0)
    by_edit = {r.edit: r for r in recs}
    assert set(by_edit) == {"rename values -> values_value", "rename width -> width_value"}
    r = by_edit["rename values -> values_value"]
    assert r.prompt.startswith("def scale(values, factor=2):\n")
    assert r.prompt.endswith("renamed to 'values_value'\ndef scale(values_value, factor=2):")
    assert r.prediction.startswith('\n    """Multiply every value') and "def " not in r.prediction
    assert r.prediction.endswith("    return out\n")
    assert r.source == "m.py:2" and r.max_tokens == 96
    m = by_edit["rename width -> width_value"]  # a method: dedented, self kept
    assert m.prompt.startswith("def area(self, width, height):\n")
    assert m.prompt.endswith("def area(self, width_value, height):")


def test_the_same_seed_gives_the_same_records(tmp_path: Path) -> None:
    a, b = edit_records({"m.py": SOURCE}, 2, 3), edit_records({"m.py": SOURCE}, 2, 3)
    assert a == b
    write_jsonl(a, tmp_path / "edits.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "edits.jsonl").read_text().splitlines()]
    assert rows == [r.to_dict() for r in a]


def test_bad_corpora_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match="no function with an argument to rename"):
        edit_records({"m.py": "def f():\n    return 1\n"}, 3)
    bad = tmp_path / "corpus.json"
    bad.write_text("{}")
    with pytest.raises(SpecserveError, match="not a demo corpus.json"):
        read_corpus(bad)
    with pytest.raises(SpecserveError, match="not found"):
        read_corpus(tmp_path / "missing.json")


def test_the_demo_corpus_gives_records() -> None:
    corpus = Path("checkpoints/demo/corpus.json")
    if not corpus.is_file():
        pytest.skip("no demo checkpoints here")
    root, files = read_corpus(corpus)
    if not any((root / f).is_file() for f in files):
        pytest.skip(f"{root}: the demo corpus's stdlib is not on this machine")
    recs = load_edit_records(corpus, 16, seed=0)
    assert len(recs) == 16 and len({r.source for r in recs}) == 16


def test_read_heldout_keeps_order_and_leaves_out_what_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "b.py").write_text("x = 2\n", encoding="utf-8")
    (tmp_path / "a.py").write_text("y = 1\n", encoding="utf-8")
    (tmp_path / "bad.py").write_bytes(b"\xff\xfe not utf-8")
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps({"root": str(tmp_path),
                                  "heldout_files": ["b.py", "gone.py", "bad.py", "a.py"]}))
    assert read_heldout(corpus) == {"b.py": "x = 2\n", "a.py": "y = 1\n"}
    assert list(read_heldout(corpus)) == ["b.py", "a.py"]
