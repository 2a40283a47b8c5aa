"""Progress reporting for long training runs: a tiny protocol, a silent implementation for
library use and tests, and a ``rich`` progress bar for the CLI."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Protocol


class Reporter(Protocol):
    """Receives phase starts, step updates and log lines."""

    def start(self, name: str, total: int) -> None: ...
    def update(self, done: int, info: str = "") -> None: ...
    def log(self, line: str) -> None: ...


class NullReporter:
    """Discards everything (library default)."""

    def start(self, name: str, total: int) -> None:
        pass

    def update(self, done: int, info: str = "") -> None:
        pass

    def log(self, line: str) -> None:
        pass


LINE_EVERY_S = 30.0  # progress lines off a terminal


class RichReporter:
    """One rich progress bar per phase, with elapsed time; use as a context manager."""

    def __init__(self, stderr: bool = True) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=stderr)
        self._progress = Progress(
            TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console,
        )
        self._task: Any = None
        self._t0 = time.monotonic()
        self._phase, self._total, self._last_line = "", 1, self._t0

    def __enter__(self) -> RichReporter:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()

    def start(self, name: str, total: int) -> None:
        self._task = self._progress.add_task(name, total=max(total, 1), info="")
        self._phase, self._total, self._last_line = name, max(total, 1), time.monotonic()

    def update(self, done: int, info: str = "") -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=done, info=info)
        # no live bar off a terminal (make's log, CI): a plain line now and then instead
        if not self.console.is_terminal and (
                time.monotonic() - self._last_line >= LINE_EVERY_S or done >= self._total):
            self._last_line = time.monotonic()
            self.log(f"{self._phase} {done}/{self._total} {info}".rstrip())

    def log(self, line: str) -> None:
        self._progress.console.log(f"[{time.monotonic() - self._t0:6.1f}s] {line}")
