"""What ``specserve doctor`` reports: :class:`Finding` (severity, stable code, one-line message)
and the exit code a list of them gives.

Exit codes (``docs/architecture.md``, CLI): 0 when every finding is ``info`` or ``warning``, 1
when any is an ``error``, 2 for bad input (a :class:`specserve.errors.SpecserveError`, raised,
never a finding). ``--strict`` makes warnings exit 1 too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's report. ``code`` is stable (tests and scripts match on it)."""

    severity: Severity
    code: str
    message: str

    def line(self) -> str:
        return f"{self.severity}: {self.code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def error(code: str, message: str) -> Finding:
    return Finding("error", code, message)


def warning(code: str, message: str) -> Finding:
    return Finding("warning", code, message)


def info(code: str, message: str) -> Finding:
    return Finding("info", code, message)


def exit_code(findings: Iterable[Finding], strict: bool = False) -> int:
    """1 when an error (or, ``strict``, a warning) was found, else 0."""
    bad = {"error", "warning"} if strict else {"error"}
    return 1 if any(f.severity in bad for f in findings) else 0


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
