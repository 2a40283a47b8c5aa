"""The shipped code, tests, benchmarks, README and docs name no work items and nothing outside
the repository: no tracker numbers in comments, docstrings, test or benchmark names or pages of
the docs, no paths into a sibling checkout of reference notes, no remarks about which machines a
session was given."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the pattern of the grep that checks this by hand (case-insensitive), spelt so that this file
# does not match it
FORBIDDEN = re.compile("issue ?#?[0-9]|" + re.escape("..") + "/shared|lent" + " to",
                       re.IGNORECASE)
SUFFIXES = {".py", ".sh", ".json", ".pbtxt", ".yaml", ".yml", ".toml", ".txt", ".md", ".cfg"}


def _files() -> list[Path]:
    out = [ROOT / "Makefile", ROOT / "README.md"]
    for top in ("specserve", "tests", "benchmarks"):
        out += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES
                and "__pycache__" not in p.parts]
    out += sorted((ROOT / "docs").rglob("*.md"))  # every page of the docs, sub-folders included
    return out


def offenders() -> list[str]:
    bad = []
    for path in _files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    for path in (ROOT / "benchmarks").iterdir():
        if re.search(r"issue|\d{2,}", path.stem, re.IGNORECASE):
            bad.append(f"{path.relative_to(ROOT)}: a work item in the file name")
    return bad


def test_no_work_items_or_outside_paths() -> None:
    bad = offenders()
    assert not bad, "\n".join(bad)


def test_the_scan_covers_readme_and_docs() -> None:
    files = set(_files())
    assert ROOT / "README.md" in files
    assert {ROOT / "docs" / "architecture.md", ROOT / "docs" / "reliability.md"} <= files


def test_the_pattern_catches_them() -> None:
    issue, shared, lent = "issue", "../" + "shared", "lent" + " to"
    for text in (f"({issue} 31 item 3)", f"{issue.title()} #7 table", f"{issue}29",
                 f"see {shared}/reference/x.md", f"the device was {lent} this task"):
        assert FORBIDDEN.search(text), text
    assert not FORBIDDEN.search("NVIDIA/TensorRT-LLM#7842, tests/shared/helpers")
