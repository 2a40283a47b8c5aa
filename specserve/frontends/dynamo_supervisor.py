"""The supervisor of ``specserve serve --frontend dynamo``: it keeps a started
:class:`~specserve.frontends.dynamo_serve.DynamoDeployment` serving, acting on the decisions of
the pure policy in :mod:`specserve.frontends.supervision` (restart with backoff, crash loop,
a worker hung by Dynamo's health probe), until SIGINT / SIGTERM, the frontend's exit or a crash
loop."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specserve.errors import ServerError
from specserve.frontends import supervision as sv
from specserve.frontends.dynamo_child import Child
from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, signal_group

Event = dict[str, Any]


@dataclass
class Supervisor:
    """Keeps a started deployment serving (module docstring): :meth:`step` looks at every
    worker once (exit, probe due, restart due) and acts on the policy's decisions; events go
    to ``on_event`` (one dict each: ``worker-exited``, ``worker-hung``, ``worker-restarted``,
    ``worker-ready``). Raises ServerError when the frontend exits or on a crash loop."""

    dep: DynamoDeployment
    policy: sv.RestartPolicy = field(default_factory=sv.RestartPolicy)
    on_event: Callable[[Event], None] = lambda e: None
    clock: Callable[[], float] = time.monotonic
    states: dict[int, sv.WorkerState] = field(default_factory=dict)
    restart_at: dict[int, float] = field(default_factory=dict)
    down_since: dict[int, float] = field(default_factory=dict)
    next_probe: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.policy.validate()
        now = self.clock()
        for i, _ in enumerate(self.dep.workers):
            self.states[i] = sv.WorkerState(started_at=now, ready=True)

    def run(self, poll_s: float = 0.2) -> None:
        while True:
            self.step()
            time.sleep(poll_s)

    def step(self) -> None:
        front = self.dep.children[0]
        if front.exited() is not None:
            raise ServerError(f"frontend exited with code {front.exited()}: "
                              f"{front.last_error()} (log {front.log})")
        for i, w in enumerate(self.dep.workers):
            now = self.clock()
            if i in self.restart_at:
                if now >= self.restart_at[i]:
                    self._restart(i, w, now)
                continue
            rc = w.exited()
            if rc is not None:
                self._exited(i, w, rc, now)
            elif w.system_port and now >= self.next_probe.get(i, 0.0):
                self._probe(i, w, now)

    def _emit(self, event: str, w: Child, **fields: Any) -> None:
        self.on_event({"event": event, "worker": w.role,
                       "pid": w.proc.pid if w.proc else None, **fields})

    def _exited(self, i: int, w: Child, rc: int, now: float) -> None:
        self.states[i], decision = sv.on_exit(self.states[i], now, self.policy)
        why = w.last_error()
        if isinstance(decision, sv.GiveUp):
            raise ServerError(f"{w.role} failed {decision.failures} times in "
                              f"{decision.window_s:.0f} s (crash loop), last with code {rc}: "
                              f"{why} (log {w.log})")
        self.down_since.setdefault(i, now)
        self.restart_at[i] = decision.at
        if rc < 0:
            why = f"killed by {signal.Signals(-rc).name}; last log line: {why}"
        self._emit("worker-exited", w, code=rc, error=why, failures=decision.failures,
                   restart_in_s=round(decision.backoff_s, 2), log=str(w.log))

    def _restart(self, i: int, w: Child, now: float) -> None:
        del self.restart_at[i]
        w.start(self.dep.env)
        self.states[i] = sv.on_start(self.states[i], now)
        self.next_probe[i] = now + self.policy.probe_interval_s
        self._emit("worker-restarted", w, restarts=w.starts - 1)

    def _probe(self, i: int, w: Child, now: float) -> None:
        ok = w.healthy(self.policy.probe_timeout_s)
        after = self.clock()
        self.next_probe[i] = after + self.policy.probe_interval_s
        self.states[i], verdict = sv.on_probe(self.states[i], ok, after, self.policy)
        if verdict == "became-ready":
            down = self.down_since.pop(i, None)
            self._emit("worker-ready", w, down_s=None if down is None else round(after - down, 2))
        elif verdict in ("hung", "not-ready-in-time"):
            self.down_since.setdefault(i, now)
            self._emit("worker-hung", w, verdict=verdict, misses=self.states[i].misses,
                       probe_timeout_s=self.policy.probe_timeout_s)
            if w.proc is not None:
                signal_group(w.proc, signal.SIGKILL)  # a stopped process takes no SIGTERM
                w.proc.wait()


def serve_until_stopped(cfg: DynamoServeConfig, timeout_s: float,
                        on_ready: Callable[[DynamoDeployment], None],
                        on_event: Callable[[Event], None] = lambda e: None,
                        policy: sv.RestartPolicy | None = None) -> None:
    """``specserve serve --frontend dynamo``: start, report through ``on_ready``, then
    supervise (:class:`Supervisor`, events to ``on_event``) until SIGINT / SIGTERM (stop every
    child and return), the frontend's exit or a crash loop (stop the rest, ServerError naming
    it and its last error)."""
    from specserve.interrupts import sigterm_as_interrupt

    dep = DynamoDeployment(cfg)
    with sigterm_as_interrupt():
        try:
            dep.start(timeout_s)
            on_ready(dep)
            Supervisor(dep, policy or sv.RestartPolicy(), on_event).run()
        except KeyboardInterrupt:
            dep.stop()
            return
        except Exception:  # the frontend's exit, a crash loop, or our own failure
            dep.stop(keep_logs=True)
            raise
