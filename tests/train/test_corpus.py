"""Corpus listing and the seeded held-out split."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.errors import SpecserveError
from specserve.train import corpus


def _tree(root: Path) -> None:
    body = "def f(x):\n    return x + 1\n" * 20
    for rel in ["a.py", "pkg/b.py", "pkg/c.py", "test/t.py", "pkg/tests/u.py",
                "site-packages/x.py", "d.py", "e.py"]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    (root / "tiny.py").write_text("x = 1\n")  # under 200 bytes: skipped


def test_listing_skips_tests_vendored_and_tiny_files(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert corpus.list_py_files(tmp_path) == ("a.py", "d.py", "e.py", "pkg/b.py", "pkg/c.py")


def test_split_is_disjoint_complete_and_seeded(tmp_path: Path) -> None:
    _tree(tmp_path)
    s0 = corpus.stdlib_split(seed=0, heldout=2, root=tmp_path)
    assert not set(s0.train) & set(s0.heldout)
    assert sorted(s0.train + s0.heldout) == sorted(corpus.list_py_files(tmp_path))
    assert corpus.stdlib_split(seed=0, heldout=2, root=tmp_path) == s0
    splits = {corpus.stdlib_split(seed=s, heldout=2, root=tmp_path).heldout for s in range(8)}
    assert len(splits) > 1  # the seed matters


def test_real_stdlib_split_keeps_heldout_out_of_training() -> None:
    s = corpus.stdlib_split(seed=0, heldout=40)
    assert len(s.heldout) == 40 and len(s.train) > 100
    assert not set(s.train) & set(s.heldout)
    assert all(not n.startswith(("test/", "site-packages/")) for n in s.train)


def test_bad_inputs_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match="not found"):
        corpus.list_py_files(tmp_path / "missing")
    _tree(tmp_path)
    with pytest.raises(SpecserveError, match="cannot hold out 5 of 5"):
        corpus.stdlib_split(seed=0, heldout=5, root=tmp_path)
