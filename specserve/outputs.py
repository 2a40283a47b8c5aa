"""Output directories that specserve owns: staged, swapped into place, replaced only if ours.

Every command that writes a directory (``build``, ``repo``, ``demo-model``, ``train-medusa``)
writes it into a sibling staging directory, drops a marker file there first
(:data:`MARKER`, JSON ``{"written_by": "specserve build"}``), and renames the stage into place
when the work is complete; a failure, an exception or Ctrl-C removes the stage. An existing
``--out`` is replaced only with ``force`` **and** only when it carries the marker of the same
writer: a user's directory (or another command's output) is refused with one line and left
untouched, byte for byte.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specserve.config import write_json_atomic
from specserve.errors import SpecserveError

MARKER = ".specserve-output.json"


def written_by(directory: Path) -> str | None:
    """The writer recorded in ``directory``'s marker, or None (no marker, unreadable, a file)."""
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    writer = data.get("written_by") if isinstance(data, dict) else None
    return writer if isinstance(writer, str) else None


def check_replaceable(out: Path, force: bool, writer: str) -> None:
    """Refuse an existing ``out`` unless ``force`` and ``writer`` wrote it."""
    if not out.exists() and not out.is_symlink():
        return
    if not force:
        raise SpecserveError(f"{out}: already exists (use --force to replace it)")
    if out.is_symlink() or not out.is_dir():
        raise SpecserveError(f"{out}: exists and is not a directory; refusing to replace it")
    found = written_by(out)
    if found is None:
        raise SpecserveError(f"{out}: not written by specserve (no {MARKER}); --force replaces "
                             "only specserve's own output: remove it yourself or pick another "
                             "--out")
    if found != writer:
        raise SpecserveError(f"{out}: written by `{found}`, not `{writer}`; refusing to replace "
                             "it")


def mark(directory: Path, writer: str) -> None:
    """Write the marker that lets a later ``--force`` replace ``directory``."""
    write_json_atomic(directory / MARKER, {"written_by": writer})


def _fresh_stage_or_refuse(stage: Path, out: Path) -> None:
    if stage.exists() or stage.is_symlink():
        if written_by(stage) is None:  # not a stage of ours: never delete it
            raise SpecserveError(f"{stage}: exists and was not left by specserve; remove it to "
                                 f"write {out}")
        shutil.rmtree(stage)  # left over by a killed run of ours


def _make_stage(stage: Path, out: Path, writer: str) -> None:
    try:
        stage.mkdir(parents=True)
    except OSError as e:  # unwritable or not a directory
        raise SpecserveError(f"{out}: cannot create the output directory "
                             f"({e.strerror}: {e.filename})") from e
    mark(stage, writer)


def swap_into_place(stage: Path, out: Path) -> None:
    """Rename ``stage`` to ``out``; an existing ``out`` (already checked) is moved aside first
    and deleted only after the swap succeeded (restored when it failed)."""
    old: Path | None = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent)) / "old"
        out.rename(old)
    try:
        stage.rename(out)
    except BaseException:
        if old is not None and not out.exists():
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


@contextmanager
def staged_output(out: Path, force: bool, writer: str,
                  stage: Path | None = None) -> Iterator[Path]:
    """Yield a marked staging dir (default ``<parent>/.<name>.building``); on a clean exit swap
    it into ``out``, otherwise delete it. ``out`` is checked before any work starts."""
    check_replaceable(out, force, writer)
    stage = stage if stage is not None else out.parent / f".{out.name}.building"
    _fresh_stage_or_refuse(stage, out)
    try:  # from the mkdir on: a Ctrl-C between it and the work must not leave the stage
        _make_stage(stage, out, writer)
        yield stage
        swap_into_place(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
