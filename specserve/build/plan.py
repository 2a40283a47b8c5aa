"""A typed build plan: ordered steps, each an exact argv, printed by ``--dry-run`` and run by
:mod:`specserve.build.runner`.

Paths in the argv are the ones the build really uses: everything is written under the staging
directory ``<parent>/.<name>.building`` and renamed to ``--out`` only when every step succeeded.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BuildStep:
    """One external command of a build."""

    name: str  # e.g. "convert target"
    kind: str  # convert | quantize | build
    argv: tuple[str, ...]
    output_dir: str  # what the step creates (checked after it ran)
    ranks: int = 1  # rank{r}.safetensors / rank{r}.engine files it must write

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "argv": list(self.argv),
                "output_dir": self.output_dir, "ranks": self.ranks}

    def shell(self) -> str:
        """The argv as one copy-pasteable shell line."""
        return shlex.join(self.argv)


@dataclass(frozen=True)
class BuildPlan:
    """Everything ``specserve build`` will do, before it does it."""

    backend: str
    out: str
    staging: str
    steps: tuple[BuildStep, ...]
    world_size: int
    notes: tuple[str, ...] = field(default=())
    pin: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "out": self.out, "staging": self.staging,
                "world_size": self.world_size, "pin": dict(self.pin),
                "steps": [s.to_dict() for s in self.steps], "notes": list(self.notes)}

    def commands(self) -> list[list[str]]:
        return [list(s.argv) for s in self.steps]


def staging_dir(out: str) -> str:
    """The sibling directory a build writes into before the final rename."""
    parent, name = os.path.split(os.path.normpath(out))
    return os.path.join(parent, f".{name}.building")


def render_text(plan: BuildPlan) -> str:
    """Human-readable plan: one numbered, copy-pasteable command per step."""
    lines = [f"backend: {plan.backend}   world size: {plan.world_size}   out: {plan.out}"]
    if plan.pin:
        lines.append("pinned: " + ", ".join(f"{k}={v}" for k, v in sorted(plan.pin.items())))
    lines.append(f"staging: {plan.staging} (renamed to {plan.out} when every step succeeded)")
    for i, step in enumerate(plan.steps, 1):
        lines.append(f"\n[{i}/{len(plan.steps)}] {step.name}")
        lines.append("  " + step.shell())
    for note in plan.notes:
        lines.append(f"\nnote: {note}")
    return "\n".join(lines)
