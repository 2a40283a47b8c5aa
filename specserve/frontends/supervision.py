"""When to restart a worker, when it is hung, when to give up (pure: events and times in,
decisions out; no processes, no clocks).

The runner (:class:`specserve.frontends.dynamo_supervisor.Supervisor`) feeds it what it sees: a
worker's exit, each liveness probe's answer, a start; it acts on what comes back. A worker that
exits is restarted after a backoff that doubles with its recent failures (bounded by
``max_backoff_s``); ``crash_loop_failures`` failures of one worker within
``crash_loop_window_s`` end the service (a worker that cannot stay up is a configuration
problem, not a transient one). A worker is hung after ``probe_misses`` probes in a row found no
answer (or a not-ready one) once it had answered ready: a stopped or wedged process cannot
report itself, so the probe comes from outside (Dynamo's system status server,
``DYN_SYSTEM_PORT``, ``GET /health``: ``lib/runtime/src/system_status_server.rs``); the runner
then kills it, which Dynamo's frontend sees as a broken stream (migration or an error for its
requests), and the exit is handled as any other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class RestartPolicy:
    """Backoff, crash-loop and liveness-probe settings."""

    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    crash_loop_failures: int = 5
    crash_loop_window_s: float = 60.0
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 3.0
    probe_misses: int = 3
    ready_timeout_s: float = 120.0  # a restarted worker not ready by then counts as a failure

    def validate(self) -> None:
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("backoff: need 0 <= initial <= max")
        if self.crash_loop_failures < 1 or self.crash_loop_window_s <= 0:
            raise ValueError("crash loop: need failures >= 1 and a positive window")
        if self.probe_interval_s <= 0 or self.probe_timeout_s <= 0 or self.probe_misses < 1:
            raise ValueError("probe: need positive interval and timeout, misses >= 1")


@dataclass(frozen=True)
class WorkerState:
    """What the policy remembers of one worker slot."""

    failures: tuple[float, ...] = ()  # times of its failures within the crash-loop window
    started_at: float = 0.0
    ready: bool = False  # answered ready since its last start
    misses: int = 0  # probes in a row without a ready answer, since it was ready


@dataclass(frozen=True)
class Restart:
    """Start the worker again at ``at`` (after ``backoff_s``)."""

    at: float
    backoff_s: float
    failures: int


@dataclass(frozen=True)
class GiveUp:
    """A crash loop: end the service."""

    failures: int
    window_s: float


def backoff_s(failures: int, policy: RestartPolicy) -> float:
    """The wait before the restart that follows the ``failures``-th recent failure (1-based):
    ``initial * 2^(failures - 1)``, at most ``max_backoff_s``."""
    if failures <= 1:
        return policy.initial_backoff_s
    return min(policy.max_backoff_s, policy.initial_backoff_s * 2.0 ** min(failures - 1, 30))


def on_exit(state: WorkerState, now: float, policy: RestartPolicy
            ) -> tuple[WorkerState, Restart | GiveUp]:
    """The worker stopped (exited, or was killed as hung): restart it after a backoff, or give
    up when this is the ``crash_loop_failures``-th failure within the window."""
    recent = tuple(t for t in state.failures if now - t < policy.crash_loop_window_s) + (now,)
    new = replace(state, failures=recent, ready=False, misses=0)
    if len(recent) >= policy.crash_loop_failures:
        return new, GiveUp(len(recent), policy.crash_loop_window_s)
    wait = backoff_s(len(recent), policy)
    return new, Restart(now + wait, wait, len(recent))


def on_start(state: WorkerState, now: float) -> WorkerState:
    return replace(state, started_at=now, ready=False, misses=0)


Verdict = Literal["ok", "became-ready", "miss", "hung", "not-ready-in-time"]


def on_probe(state: WorkerState, ready: bool, now: float, policy: RestartPolicy
             ) -> tuple[WorkerState, Verdict]:
    """One probe's answer (``ready``: the worker answered ready within the probe's time-out).
    Before its first ready answer a worker is loading: misses then only count against
    ``ready_timeout_s``; after it, ``probe_misses`` misses in a row make it hung."""
    if ready:
        return replace(state, ready=True, misses=0), "ok" if state.ready else "became-ready"
    if not state.ready:
        late = now - state.started_at > policy.ready_timeout_s
        return state, "not-ready-in-time" if late else "ok"
    misses = state.misses + 1
    return replace(state, misses=misses), "hung" if misses >= policy.probe_misses else "miss"
