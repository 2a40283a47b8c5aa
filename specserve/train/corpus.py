"""The demo corpus: ``.py`` files of the running interpreter's standard library.

Files are listed by their path relative to the stdlib root, sorted, and split by a seeded
permutation into training files and a fixed held-out set used only for evaluation prompts.
The split is a pure function of the sorted names and the seed, so "held-out files are never
trained on" can be checked by name.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specserve.errors import SpecserveError

# Directories left out: vendored packages and the (huge, repetitive) regression tests.
EXCLUDED_TOP = ("site-packages", "dist-packages", "test", "idlelib", "lib2to3", "tkinter",
                "turtledemo", "ensurepip")
MAX_FILE_BYTES = 200_000  # a few generated data files (e.g. pydoc topics) are mostly prose


@dataclass(frozen=True)
class CorpusSplit:
    """Relative file names of the training and held-out sets (disjoint, sorted)."""

    root: Path
    train: tuple[str, ...]
    heldout: tuple[str, ...]


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_py_files(root: Path) -> tuple[str, ...]:
    """Sorted relative names of the usable ``.py`` files under ``root``."""
    if not root.is_dir():
        raise SpecserveError(f"{root}: corpus directory not found")
    names = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root)
        if rel.parts[0] in EXCLUDED_TOP or any(p.startswith("test") for p in rel.parts[:-1]):
            continue
        if not f.is_file() or f.stat().st_size > MAX_FILE_BYTES or f.stat().st_size < 200:
            continue
        names.append(rel.as_posix())
    if not names:
        raise SpecserveError(f"{root}: no .py files found")
    return tuple(sorted(names))


def split_files(names: tuple[str, ...], seed: int, heldout: int) -> tuple[
        tuple[str, ...], tuple[str, ...]]:
    """Seeded split of sorted ``names`` into (train, heldout); ``heldout`` files go to eval."""
    import torch

    if not 0 < heldout < len(names):
        raise SpecserveError(f"corpus: cannot hold out {heldout} of {len(names)} files")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(names), generator=g).tolist()
    held = sorted(names[i] for i in perm[:heldout])
    train = sorted(names[i] for i in perm[heldout:])
    return tuple(train), tuple(held)


def stdlib_split(seed: int, heldout: int = 40, root: Path | None = None) -> CorpusSplit:
    """List the corpus under ``root`` (default: stdlib) and split it for ``seed``."""
    r = root or stdlib_root()
    train, held = split_files(list_py_files(r), seed, heldout)
    return CorpusSplit(root=r, train=train, heldout=held)


def read_texts(root: Path, names: tuple[str, ...], max_chars: int | None = None) -> list[str]:
    """File contents in ``names`` order (undecodable bytes replaced), stopping once the total
    reaches ``max_chars``."""
    texts: list[str] = []
    total = 0
    for name in names:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    return texts


def shuffled(names: tuple[str, ...], seed: int) -> tuple[str, ...]:
    """``names`` in a seeded random order (so a size cap samples the whole library)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return tuple(names[i] for i in torch.randperm(len(names), generator=g).tolist())
