"""All-or-nothing output directories: write into ``<parent>/.<name>.building`` and rename into
place on success. A failure, an exception or Ctrl-C removes the staging directory; an existing
``--out`` is only replaced with ``force`` (moved aside, swapped, then deleted)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specserve.build.plan import staging_dir
from specserve.errors import SpecserveError


def check_out(out: Path, force: bool) -> None:
    """Refuse an existing ``--out`` unless ``force``."""
    if out.exists() and not force:
        raise SpecserveError(f"{out}: already exists (use --force to replace it)")
    if out.exists() and not out.is_dir():
        raise SpecserveError(f"{out}: exists and is not a directory")


@contextmanager
def staged_output(out: Path, force: bool) -> Iterator[Path]:
    """Yield the staging dir; on clean exit swap it into ``out``, otherwise delete it."""
    check_out(out, force)
    stage = Path(staging_dir(str(out)))
    if stage.exists():  # left over by a killed build: ours by name
        shutil.rmtree(stage)
    try:
        stage.mkdir(parents=True)
    except OSError as e:  # unwritable or not a directory
        raise SpecserveError(f"{out}: cannot create the output directory "
                             f"({e.strerror}: {e.filename})") from e
    try:
        yield stage
        _swap(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _swap(stage: Path, out: Path) -> None:
    old = out.parent / f".{out.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        out.rename(old)
    try:
        stage.rename(out)
    except BaseException:
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
