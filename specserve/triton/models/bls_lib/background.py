"""One request's streamed responses, made and sent on a thread of their own (standard library only;
copied into a repository as ``tensorrt_llm_bls/1/lib/background.py``).

The BLS loop's iterations are synchronous Triton calls (draft, then verify). Turning an
iteration's tokens into a streamed response costs two more round trips (postprocessing's decode
and the response send, ~0.9 + 0.5 ms on 2 cores, docs/results.md "The BLS loop against the
engine's own speculation"), and the next iteration needs neither. :class:`Background` runs
those jobs in order on one thread per request while the loop goes on with its next draft call
(the Triton calls wait with the GIL released, so the two overlap). The Python backend allows a
response sender and BLS calls from any thread of the stub.

Rules: jobs run in the order they were put; a job that raises :class:`Cancelled` (the client
went away) or any other error stops the jobs after it, and the next :meth:`Background.put` or
:meth:`Background.close` raises that same exception in the loop's thread. :meth:`close` waits
for every job before returning, so what the caller sends after it (the final flag, an error)
comes after the streamed responses.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Cancelled(Exception):
    """The client went away: stop the loop, send nothing more but the final flag."""


class Background:
    """Jobs run in order on one thread; the first failure is raised back to the caller."""

    def __init__(self, name: str = "bls-stream") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Callable[[], object]) -> None:
        """Queue ``job``; raises the failure of an earlier job instead, if one failed."""
        self._raise()
        self._jobs.put(job)

    def close(self) -> None:
        """Wait until every queued job has run (or was skipped after a failure), then raise that
        failure, if any."""
        self._jobs.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._failure is not None:
                continue  # after a failure nothing more is sent
            try:
                job()
            except BaseException as e:  # handed to the loop's thread
                self._failure = e
