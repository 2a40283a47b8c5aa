"""Spreading one benchmark over replicas: a :class:`~specserve.client.transport.Transport` that
sends each request to one of several servers of the same model, so a multi-replica deployment
is measured as one service (``specserve bench --url A --url B ...``).

- ``round-robin``: replicas in turn (nginx / Kubernetes Service style rotation).
- ``least-outstanding``: the replica with the fewest requests in flight, ties in turn
  (Envoy's ``LEAST_REQUEST``, the "join the shortest queue" policy).

A failed request (error, not a cancel) takes its replica out of the rotation for a back-off
(1 s, doubling to 30 s while it keeps failing); the next request after the back-off probes it,
and a success brings it back. With every replica backed off, the one whose back-off ends first
is tried, so a run against dead servers still fails fast (the runner's ``abort_after_errors``).
Every result names the replica that served it (``RawResult.replica``), so the report splits by
replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specserve.client.config import BALANCE
from specserve.client.transport import GenParams, RawResult, Transport

BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0


class ReplicaPool:
    """Which replica gets the next request (pure bookkeeping; ``clock`` for tests)."""

    def __init__(self, n: int, policy: str, clock: Callable[[], float] = time.monotonic) -> None:
        if policy not in BALANCE:
            raise ValueError(f"unknown balance policy {policy!r}")
        self.policy = policy
        self.clock = clock
        self.outstanding = [0] * n
        self.failures = [0] * n       # consecutive failed requests
        self.down_until = [0.0] * n
        self._next = 0

    def _order(self) -> list[int]:
        n = len(self.outstanding)
        return [(self._next + k) % n for k in range(n)]

    def pick(self) -> int:
        now = self.clock()
        order = self._order()
        live = [i for i in order if self.down_until[i] <= now]
        if not live:
            choice = min(order, key=lambda i: self.down_until[i])
        elif self.policy == "least-outstanding":
            choice = min(live, key=lambda i: self.outstanding[i])  # min is stable: in turn
        else:
            choice = live[0]
        self._next = (choice + 1) % len(self.outstanding)
        return choice

    def started(self, i: int) -> None:
        self.outstanding[i] += 1

    def finished(self, i: int, ok: bool | None) -> None:
        """``ok`` None: cancelled (says nothing about the replica)."""
        self.outstanding[i] -= 1
        if ok is None:
            return
        if ok:
            self.failures[i], self.down_until[i] = 0, 0.0
            return
        self.failures[i] += 1
        backoff = min(BACKOFF_S * 2 ** (self.failures[i] - 1), MAX_BACKOFF_S)
        self.down_until[i] = self.clock() + backoff


class PooledTransport:
    """One transport over several replicas (each its own transport of the same protocol)."""

    def __init__(self, transports: Sequence[Transport], policy: str) -> None:
        self.transports = list(transports)
        self.pool = ReplicaPool(len(self.transports), policy)
        self.url = ",".join(t.url for t in self.transports)

    async def declared_inputs(self, model: str) -> frozenset[str]:
        """Inputs every replica declares (each must answer at the start)."""
        sets = [await t.declared_inputs(model) for t in self.transports]
        return frozenset.intersection(*sets)

    async def generate(self, model: str, prompt: str, params: GenParams,
                       declared: frozenset[str] | None, timeout_s: float) -> RawResult:
        i = self.pool.pick()
        t = self.transports[i]
        self.pool.started(i)
        ok: bool | None = None
        try:
            raw = await t.generate(model, prompt, params, declared, timeout_s)
            ok = None if raw.cancelled else raw.error is None
        finally:
            self.pool.finished(i, ok)
        raw.replica = t.url
        return raw

    async def close(self) -> None:
        for t in self.transports:
            await t.close()
