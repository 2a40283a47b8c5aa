"""The compatibility matrix: one row per (engine, version, method, protocol, check) with its
verdict, detail, evidence file and date; written as JSON and Markdown, pivoted across runs
(check x configuration) for ``docs/conformance/matrices.md``, and a one-screen summary. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from specserve.conform.checks.base import NOT_RUN, VERDICTS

SYMBOL = {"pass": "pass", "fail": "**FAIL**", "refused": "refused", "broken": "**BROKEN**",
          NOT_RUN: "not run"}


@dataclass(frozen=True)
class Row:
    engine: str
    version: str
    method: str
    protocol: str
    check: str
    group: int
    verdict: str
    detail: str
    evidence: str | None
    date: str
    seconds: float

    @property
    def config(self) -> str:
        return f"{self.engine} {self.version} {self.method} ({self.protocol})"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def row_from_dict(d: dict[str, object]) -> Row:
    return Row(**{k: d[k] for k in Row.__dataclass_fields__})  # type: ignore[arg-type]


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def markdown(rows: Sequence[Row]) -> str:
    """One run's table: check, verdict, detail, evidence."""
    head = ("| # | check | verdict | detail | evidence |\n|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r.group} | {r.check} | {SYMBOL[r.verdict]} | {_cell(r.detail)} | "
        f"{r.evidence or ''} |\n" for r in rows)


def pivot(rows: Sequence[Row]) -> str:
    """Many runs: one line per check, one column per configuration (verdicts only)."""
    configs = list(dict.fromkeys(r.config for r in rows))
    checks = list(dict.fromkeys((r.group, r.check) for r in rows))
    cell = {(r.check, r.config): SYMBOL[r.verdict] for r in rows}
    out = "| # | check | " + " | ".join(configs) + " |\n"
    out += "|---|---|" + "---|" * len(configs) + "\n"
    for group, name in checks:
        out += f"| {group} | {name} | " + " | ".join(cell.get((name, c), "") for c in configs)
        out += " |\n"
    return out


def counts(rows: Sequence[Row]) -> dict[str, int]:
    c = Counter(r.verdict for r in rows)
    return {v: c.get(v, 0) for v in (*VERDICTS, NOT_RUN)}


def summary(rows: Sequence[Row]) -> str:
    """One screen: the configuration, the verdict counts, and every non-pass line."""
    if not rows:
        return "no checks run"
    c = counts(rows)
    lines = [f"{rows[0].config}, {rows[0].date}: "
             + ", ".join(f"{n} {v}" for v, n in c.items() if n)]
    for r in rows:
        mark = {"pass": "  ok ", "fail": "FAIL ", "refused": "  -- ", "broken": "BROKE",
                NOT_RUN: "  .. "}[r.verdict]
        lines.append(f"{mark} {r.check:<18} {r.detail[:100]}")
    return "\n".join(lines)
