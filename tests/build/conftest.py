"""Fixtures for build tests: a writable copy of the session's tiny checkpoint."""

from __future__ import annotations

import pytest

from tests.helpers.tiny import TinyCheckpoint


@pytest.fixture()
def ckpt(writable_ckpt: TinyCheckpoint) -> TinyCheckpoint:
    """A private, writable copy of ``tiny_ckpt`` (tests may corrupt it)."""
    return writable_ckpt
