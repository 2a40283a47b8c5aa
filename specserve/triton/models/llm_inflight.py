"""In-flight batching in the reference ``tensorrt_llm`` Triton model: the worker loop over a
:class:`~specserve.runtime.scheduler.Scheduler` (requests go to it between steps and from inside
a step through its ``intake``; answered as they finish, cancelled when their client goes away).
A mixin of :class:`specserve.triton.models.llm.TritonPythonModel`, which provides ``queue``,
``max_batch``, ``max_pending``, ``prefill_chunk``, ``decoder``, ``_run``, ``_stream`` and
``_final_arrays``.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from specserve.triton.models.llm_common import _error, _gone, _Pending, _response, _send


class InflightBatching:
    """The in-flight worker loop and its per-request callbacks."""

    queue: queue.Queue[_Pending | None]
    max_batch: int
    max_pending: int
    prefill_chunk: int
    max_seq_len: int
    decoder: Any

    def _run(self, batch: list[_Pending]) -> None:  # the model's: one verify / generate call
        raise NotImplementedError

    def _stream(self, p: _Pending, new_tokens: list[int]) -> None:
        raise NotImplementedError

    def _final_arrays(self, p: _Pending, result: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _inflight_loop(self) -> None:
        """In-flight batching (:class:`~specserve.runtime.scheduler.Scheduler`): queued requests
        go to the scheduler between steps and from inside a step (its ``intake``), where they
        are prefilled at once and join the running batch when the step ends; draft_input_ids
        requests run their own verify call between steps."""
        from specserve.runtime.scheduler import Scheduler

        sch = Scheduler(self.decoder, self.max_batch, self.max_seq_len or
                        self.decoder.target.cfg.max_position_embeddings,
                        prefill_chunk=self.prefill_chunk)
        live: dict[int, tuple[_Pending, Any]] = {}
        later: list[_Pending] = []   # draft_input_ids requests: their own call, between steps
        stop = False

        def intake(block: bool = False) -> None:
            """Queued requests to the scheduler (also from inside a step: Scheduler.intake)."""
            nonlocal stop
            if not block and self.queue.empty():
                return  # the common case inside a step: nothing arrived
            # backpressure: past max_pending in the scheduler, leave requests in the bounded
            # queue (execute() then answers "server busy")
            room = sch.waiting + len(sch.running) < self.max_pending
            for p in self._take(block=block) if room else []:
                if p is None:
                    stop = True
                elif p.req.draft_ids is not None:
                    later.append(p)
                else:
                    try:
                        h = p.handle = sch.submit(p.req.prompt, p.params, self._on_tokens(p),
                                                  self._on_done(p),
                                                  p.req.return_generation_logits)
                        live[id(h)] = (p, h)
                    except Exception as e:  # this request only
                        self._fail(p, f"tensorrt_llm: {e}")

        sch.intake = intake
        while not (stop and sch.idle and not later):
            intake(block=sch.idle and not stop and not later)
            for p in later:
                try:
                    self._run([p])
                except Exception as e:  # this request only
                    self._fail(p, f"tensorrt_llm: {e}")
            later.clear()
            try:
                sch.step()
            except Exception as e:  # fail what was in flight, go on with a fresh pool
                for h in sch.drain():
                    p = live.pop(id(h))[0]
                    self._fail(p, f"tensorrt_llm: generation failed: {e}")
            for key, (p, h) in list(live.items()):
                if h.result is not None:
                    del live[key]
                elif p.done or _gone(p.sender):
                    sch.cancel(h)  # the client went away: its slot goes at the next step

    def _fail(self, p: _Pending, message: str) -> None:
        """Answer ``p`` with an error (or, when its client is gone, just the final flag)."""
        if not p.done:
            _send(p.sender, _error(message), final=True)
        elif not p.final_sent:
            _send(p.sender, None, final=True)
        p.done = p.final_sent = True

    def _take(self, block: bool) -> list[_Pending | None]:
        """Everything queued now; waits for one first when ``block`` (nothing running)."""
        out: list[_Pending | None] = []
        try:
            out.append(self.queue.get() if block else self.queue.get_nowait())
            while True:
                out.append(self.queue.get_nowait())
        except queue.Empty:
            pass
        return out

    def _on_tokens(self, p: _Pending) -> Any:
        def on_tokens(new_tokens: list[int]) -> None:
            now = time.monotonic_ns()
            p.first_token = p.first_token or now
            p.last_token = now
            try:
                self._stream(p, new_tokens)
            except Exception as e:  # this request only; the batch goes on (cancelled next)
                self._fail(p, f"tensorrt_llm: streaming failed: {e}")
        return on_tokens

    def _on_done(self, p: _Pending) -> Any:
        def on_done(result: Any) -> None:
            p.first_scheduled = getattr(p.handle, "admitted_ns", 0) or p.first_token
            try:
                if p.done:
                    self._fail(p, "")  # client gone: only the final flag, once
                elif result.finish_reason == "cancelled":
                    self._fail(p, "tensorrt_llm: cancelled")
                else:
                    _send(p.sender, _response(self._final_arrays(p, result)), final=True)
                    p.done = p.final_sent = True
            except Exception as e:
                self._fail(p, f"tensorrt_llm: {e}")
        return on_done
