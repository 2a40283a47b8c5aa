"""Progress off a terminal (make's log, CI): plain lines, since rich draws no live bar there."""

from __future__ import annotations

import pytest

import specserve.train.progress as progress


def test_progress_lines_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with progress.RichReporter() as rep:
        assert not rep.console.is_terminal
        rep.start("distill", 3)
        for i in (1, 2, 3):
            rep.update(i, f"loss {i}")
    err = capsys.readouterr().err
    assert "distill 2/3 loss 2" in err and "distill 3/3 loss 3" in err
