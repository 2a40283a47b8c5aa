"""``benchmarks/conform_ours.py``: which rows a run serves (``--only``, ``--no-bls``), with the
engine builds, tritonserver and the harness faked (nothing is served)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import conform_ours  # noqa: E402
import conform_sets  # noqa: E402


class _Server:
    grpc_url, http_url = "grpc:1", "http:1"

    def __init__(self, repo: Path, log_path: Path) -> None:
        self.repo = repo

    def start(self, timeout_s: float) -> _Server:
        return self

    def stop(self) -> None:
        pass


class _Record:
    max_input_len = 1024


def _served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str,
            draft: bool = False) -> list[tuple[str, str, str]]:
    """(method, protocol, model) of every harness run ``conform_ours.py ARGV`` makes on a set
    with no trained draft (n-gram serves "none"), or with a draft model (``draft``)."""
    import specserve.engine_record
    import specserve.triton.server

    drafts = tmp_path / "drafts"
    if draft:
        (drafts / "draft").mkdir(parents=True)
        (drafts / "draft" / "config.json").write_text("{}")
    runs: list[tuple[str, str, str]] = []

    def fake_conform(args: Any, method: str, protocol: str, url: str, model: str, limit: int,
                     *_: Any, **__: Any) -> dict[str, Any]:
        runs.append((method, protocol, model))
        return {"rows": []}

    monkeypatch.setattr(conform_ours, "conform", fake_conform)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(conform_sets, "build_engine", lambda *a: None)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: None)   # specserve repo
    monkeypatch.setattr(specserve.triton.server, "TritonServer", _Server)
    monkeypatch.setattr(specserve.engine_record, "read_engine_record", lambda p: _Record())
    monkeypatch.setattr(sys, "argv", ["conform_ours.py", "--work", str(tmp_path / "w"),
                                      "--drafts", str(drafts), "--protocols", "grpc", *argv])
    conform_ours.main()
    return runs


def test_only_the_bls_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--only ngram-bls`` serves the BLS rows alone (it served nothing: only "ngram" or
    "none" opened the n-gram repository), also with the Makefile's ``--no-bls``."""
    bls = [("ngram-bls", "grpc", "tensorrt_llm_bls")]
    assert _served(monkeypatch, tmp_path, "--only", "ngram-bls") == bls
    assert _served(monkeypatch, tmp_path, "--only", "ngram-bls", "--no-bls") == bls


def test_only_bls_on_a_set_with_a_draft_model(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """The draft engine serves "none" there; ``--only ngram-bls`` still builds and opens the
    n-gram repository, for its BLS alone."""
    got = _served(monkeypatch, tmp_path, "--only", "ngram-bls,none", draft=True)
    assert got == [("none", "grpc", "ensemble_baseline"),
                   ("ngram-bls", "grpc", "tensorrt_llm_bls")]


def test_only_none_and_the_methods(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--only none``: "none" alone; ``--only ngram`` brings its BLS along unless
    ``--no-bls``; no ``--only``: every row."""
    assert _served(monkeypatch, tmp_path, "--only", "none") == [
        ("none", "grpc", "ensemble_baseline")]
    assert _served(monkeypatch, tmp_path, "--only", "ngram") == [
        ("ngram", "grpc", "ensemble"), ("ngram-bls", "grpc", "tensorrt_llm_bls")]
    assert _served(monkeypatch, tmp_path, "--only", "ngram", "--no-bls") == [
        ("ngram", "grpc", "ensemble")]
    assert _served(monkeypatch, tmp_path) == [
        ("none", "grpc", "ensemble_baseline"), ("ngram", "grpc", "ensemble"),
        ("ngram-bls", "grpc", "tensorrt_llm_bls")]
