"""A progress reporter that interrupts a training phase after a number of steps, like a killed
process, for the resume tests of the trainers."""

from __future__ import annotations


class Crash(Exception):
    pass


class CrashAt:
    """Raises :class:`Crash` once phase ``phase`` reports more than ``step`` steps done; lines
    logged are kept in ``logs``."""

    def __init__(self, phase: str, step: int) -> None:
        self.target, self.step, self.phase = phase, step, ""
        self.logs: list[str] = []

    def start(self, name: str, total: int) -> None:
        self.phase = name

    def update(self, done: int, info: str = "") -> None:
        if self.phase == self.target and done > self.step:
            raise Crash

    def log(self, line: str) -> None:
        self.logs.append(line)
