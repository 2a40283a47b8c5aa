"""The in-flight serving loop every door runs (the reference ``tensorrt_llm`` Triton model, the
Dynamo worker), without Triton or Dynamo: what is taken from the door's queue and when, where
each request goes, what is sent back, and what happens when a step fails or a client goes
away.

Upstream's split, followed here: tensorrtllm_backend's BLS keeps its decoding logic over plain
request/response objects in ``lib/decode.py`` and the ``pb_utils`` conversions in
``lib/triton_decoder.py`` (triton-inference-server/tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py`` @
38e7c9d1a63604b46a43d4952675779565a8f3a8, ``triton_decoder.py`` @
04d96ce8e635739babc0aedaac8a2ee10fa8f909). This module is the first half: it sends numpy
arrays (:mod:`specserve.serving.responses`) to a :class:`Sender`; ``triton/models/llm.py``
wraps Triton's response sender as one and is the only place that imports ``pb_utils``, and the
Dynamo worker's sender (``frontends/dynamo_worker.py``) turns them into Dynamo's chunks. The
unit tests drive it with a real :class:`~specserve.runtime.scheduler.Scheduler` and a recording
sender (``tests/serving/test_loop.py``).

Policy (in-flight batching, :class:`~specserve.runtime.scheduler.Scheduler`):

- **intake**: everything queued goes to the scheduler between steps (here, and from the
  scheduler's ``intake`` hook at the start of each ``schedule()``); the scheduler prefills it,
  shortest prompt first, before the running rows' next token where their wait allows; a
  ``None`` in the queue stops the loop once nothing is left.
- **backpressure**: while the scheduler holds ``max_pending`` requests (waiting + running),
  nothing more is taken: requests stay in the model's bounded queue, and past its bound the
  model answers "server busy".
- **draft_input_ids** requests (TensorRT-LLM's external drafts) never join the batch: each runs
  one verify call of its own between steps (:func:`specserve.serving.engine.external_verify`).
- **failure**: a step that raises fails every request in flight with that message; the loop goes
  on with an empty pool.
- **cancellation**: after every step, a request whose client went away is cancelled (its slot is
  freed at the next step) and answered with the final flag only.
- **native memory**: with a :class:`~specserve.runtime.native_memory.Trimmer`, glibc's free
  heap pages go back to the kernel as the loop goes idle and, under unbroken load, every few
  seconds (RSS flat over a long mixed soak: docs/reliability.md §3).

A proposer that cannot join a running batch (``slots()`` is None: oracle, external) is refused
when the loop is made (:func:`specserve.serving.engine.make_scheduler`), never served some
other way.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from specserve.serving.detok import TokenHoldBack
from specserve.serving.request import LlmRequest
from specserve.serving.responses import (
    PerfTimes,
    generation_logits_array,
    logprob_arrays,
    perf_arrays,
    prediction_arrays,
    sequence_index_array,
    token_arrays,
)

if TYPE_CHECKING:
    from specserve.runtime.batch import GenerationResult
    from specserve.runtime.native_memory import Trimmer
    from specserve.runtime.params import SamplingParams
    from specserve.runtime.scheduler import Scheduler

Arrays = dict[str, np.ndarray[Any, Any]]
OnStep = Callable[[int, list[int]], None]


class Sender(Protocol):
    """One request's response channel, a door's own (the Triton model wraps its decoupled
    response sender, the Dynamo worker its handler's queue)."""

    def send(self, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        """Send ``arrays``, or the error ``error``, or (both None) only the final flag; False
        when the client is gone (then only a final flag goes out)."""
        ...

    def cancelled(self) -> bool:
        """The client went away."""
        ...


@runtime_checkable
class SplitSender(Protocol):
    """A front door's sender that answers ``num_return_sequences`` > 1 itself (the Dynamo
    worker: one chunk stream with an ``index`` per choice)."""

    def split(self, n: int) -> list[Sender]:
        """One sender per sequence, in sequence order."""
        ...


class SequenceGroup:
    """``num_return_sequences`` = n > 1 over one Triton response sender, as TensorRT-LLM answers
    it (tensorrtllm_backend ``tensorrt_llm/1/model.py`` ``convert_response`` @ c2e65b8: each
    response holds one sequence's tokens and ``sequence_index`` [1, 1]; the request's final flag
    goes with the response that ends the last sequence). A sequence's error fails the whole
    request (one error, final); the others are then cancelled (their ``cancelled()`` is True)
    and send nothing more. Loop thread only."""

    def __init__(self, sender: Sender, n: int) -> None:
        self.sender, self.left = sender, n
        self.closed = False  # an error was sent or the client went away
        self.final_sent = False
        self.members = [_Member(self, i) for i in range(n)]

    def _send(self, index: int, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        if self.final_sent:
            return False
        if error is not None or self.closed:  # an error, or the client gone: end it all now
            self.closed = self.final_sent = True
            self.sender.send(None, error, final=True)
            return False
        if final:
            self.left -= 1
        last = final and self.left == 0
        if arrays is None and not last:
            return True  # a sequence ended with nothing left to send; others go on
        arrays = None if arrays is None else {**arrays, **sequence_index_array(index)}
        ok = self.sender.send(arrays, None, final=last)
        self.final_sent = last
        self.closed = self.closed or not ok
        return ok


class _Member:
    def __init__(self, group: SequenceGroup, index: int) -> None:
        self.group, self.index = group, index

    def send(self, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        return self.group._send(self.index, arrays, error, final)

    def cancelled(self) -> bool:
        return self.group.closed or self.group.sender.cancelled()


def sequence_senders(sender: Sender, n: int) -> list[Sender]:
    """The senders of ``n`` sequences of one request: the front door's own split
    (:class:`SplitSender`) or a :class:`SequenceGroup`."""
    if isinstance(sender, SplitSender):
        return sender.split(n)
    return list(SequenceGroup(sender, n).members)


@dataclass
class Pending:
    """One queued request and what the loop knows of it."""

    req: LlmRequest
    params: SamplingParams
    sender: Sender
    arrival: int  # steady-clock ns, as the perf outputs' other times
    handle: Any = None  # its scheduler Handle
    done: bool = False  # an answer ended it, or the client went away
    final_sent: bool = False  # the final flag went out
    hold: TokenHoldBack | None = None  # streaming: tokens held while they end mid-character
    lp_sent: int = 0  # streaming with return_log_probs: the tokens whose log-probs went out
    first_scheduled: int = 0
    first_token: int = 0
    last_token: int = 0


# verify(p, on_step) -> the result of ONE verify step of p's draft_input_ids
VerifyFn = Callable[[Pending, OnStep], "GenerationResult"]
TextFn = Callable[[list[int]], str]
StatsFn = Callable[[dict[str, Any]], None]  # a finished request's AcceptanceStats.to_dict()


def final_arrays(p: Pending, result: GenerationResult) -> Arrays | None:
    """The final response: streamed, the tokens still held back (usually none); else every
    token (after the prompt unless ``exclude_input_in_output``); then ``generation_logits`` and
    the perf outputs when asked. None (send the final flag alone) for a streamed request with
    nothing left to send: a final response of zero tokens and nothing else keeps tritonserver's
    ensembles "live" on SIGTERM until its exit timeout (docs/reliability.md §5)."""
    if p.req.streaming:
        held = p.hold.flush() if p.hold else []
        if not held and not p.req.perf and not p.req.return_generation_logits \
                and result.accepted_prediction_tokens is None:
            return None
        arrays = token_arrays(p.req, held)
        if p.req.return_log_probs and result.logprobs is not None:  # the held tokens' only
            arrays.update(next_logprobs(p, result.logprobs, result.top_logprobs, len(held)))
    else:
        tokens = [int(t) for t in result.token_ids]
        arrays = token_arrays(p.req, tokens if p.req.exclude_input else p.req.prompt + tokens)
        if p.req.return_log_probs and result.logprobs is not None:
            arrays.update(logprob_arrays(result.logprobs, result.top_logprobs,
                                         p.req.top_log_probs))
    if p.req.return_generation_logits and result.logits is not None:
        arrays.update(generation_logits_array(np.asarray(result.logits)))
    if result.accepted_prediction_tokens is not None:
        arrays.update(prediction_arrays(result.accepted_prediction_tokens,
                                        result.rejected_prediction_tokens or 0))
    if p.req.perf:
        stats = result.stats
        times = PerfTimes(arrival=p.arrival, first_scheduled=p.first_scheduled,
                          first_token=p.first_token or p.first_scheduled,
                          last_token=p.last_token or p.first_scheduled)
        arrays.update(perf_arrays(times, int(stats.draft_tokens), int(stats.accepted_tokens),
                                  json.dumps(stats.to_dict(), sort_keys=True)))
    return arrays


def stream_arrays(p: Pending, new_tokens: list[int], text: TextFn) -> Arrays | None:
    """The streamed response of one step's tokens, or None while they end mid-character (each
    chunk is decoded on its own by postprocessing: held tokens go with the next one). With
    ``return_log_probs`` the response carries the log-probs of exactly its tokens, taken from
    the request's row (:meth:`Batch.record` kept them as the tokens were emitted)."""
    p.hold = p.hold or TokenHoldBack(text)
    ready = p.hold.push([int(t) for t in new_tokens])
    if not ready:
        return None
    arrays = token_arrays(p.req, ready)
    if p.req.return_log_probs and p.handle is not None:
        row = p.handle.state()
        arrays.update(next_logprobs(p, row.lps[0], row.tops[0], len(ready)))
    return arrays


def next_logprobs(p: Pending, logprobs: Sequence[float],
                  top: Sequence[list[tuple[int, float]]] | None, n: int) -> Arrays:
    """The log-prob arrays of ``p``'s next ``n`` streamed tokens (from ``p.lp_sent`` on, then
    counted as sent)."""
    lo, hi = p.lp_sent, p.lp_sent + n
    p.lp_sent = hi
    return logprob_arrays(list(logprobs[lo:hi]), None if top is None else list(top[lo:hi]),
                          p.req.top_log_probs)


def fan_out(p: Pending) -> list[Pending]:
    """``num_return_sequences`` n: ``p`` as n independent sequences (:func:`~specserve.runtime.
    params.expand_n`: each its own scheduler row, proposer state, generator (seed + i) and
    finish reason; each prefills the prompt itself, no prompt KV is shared yet), each answered
    through its own sender (:func:`sequence_senders`). n = 1: ``[p]``."""
    if p.req.n == 1:
        return [p]
    from specserve.runtime.params import expand_n

    params = expand_n(p.params, p.req.n)
    return [Pending(req=p.req, params=q, sender=s, arrival=p.arrival)
            for q, s in zip(params, sequence_senders(p.sender, p.req.n), strict=True)]


class ServingLoop:
    """The worker loop: :meth:`run` until a ``None`` is queued and nothing is left."""

    def __init__(self, scheduler: Scheduler, source: queue.Queue[Pending | None],
                 max_pending: int, verify: VerifyFn, text: TextFn,
                 clock: Callable[[], int] = time.monotonic_ns,
                 on_stats: StatsFn | None = None, trimmer: Trimmer | None = None) -> None:
        self.sch, self.source, self.max_pending = scheduler, source, max_pending
        self.verify, self.text, self.clock = verify, text, clock
        self.on_stats = on_stats  # the model's Prometheus counters (triton/spec_counters.py)
        self.trimmer = trimmer  # native memory back to the kernel between steps
        self.live: dict[int, Pending] = {}  # id(handle) -> request, while in the scheduler
        self.later: list[Pending] = []  # draft_input_ids requests: their own call
        self.stop = False
        scheduler.intake = self.intake

    def run(self) -> None:
        while not (self.stop and self.sch.idle and not self.later):
            idle = self.sch.idle and not self.stop and not self.later
            if self.trimmer is not None:
                self.trimmer.tick(idle)  # idle: before waiting, so no request waits on it
            self.intake(block=idle)
            for p in self.later:
                self._verify(p)
            self.later.clear()
            self._step()
            self._poll_cancelled()

    def intake(self, block: bool = False) -> None:
        """Queued requests to the scheduler (also as a step is scheduled: Scheduler.intake)."""
        if not block and self.source.empty():
            return  # the common case inside a step: nothing arrived
        if self.sch.waiting + len(self.sch.running) >= self.max_pending:
            return  # backpressure: they wait in the bounded queue
        for p in self._take(block):
            if p is None:
                self.stop = True
            elif p.req.draft_ids is not None:
                self.later.append(p)
            else:
                self._submit(p)

    def fail(self, p: Pending, message: str) -> None:
        """Answer ``p`` with an error (or, when its client is gone, only the final flag)."""
        if not p.done:
            p.sender.send(None, message, final=True)
        elif not p.final_sent:
            p.sender.send(None, None, final=True)
        p.done = p.final_sent = True

    def _take(self, block: bool) -> list[Pending | None]:
        """Everything queued now; waits for one first when ``block`` (nothing running)."""
        out: list[Pending | None] = []
        try:
            out.append(self.source.get() if block else self.source.get_nowait())
            while True:
                out.append(self.source.get_nowait())
        except queue.Empty:
            pass
        return out

    def _submit(self, p: Pending) -> None:
        for q in fan_out(p):
            try:
                h = q.handle = self.sch.submit(q.req.prompt, q.params, self._on_tokens(q),
                                               self._on_done(q), q.req.return_generation_logits)
                self.live[id(h)] = q
            except Exception as e:  # this request only
                self.fail(q, f"tensorrt_llm: {e}")

    def _verify(self, p: Pending) -> None:
        p.first_scheduled = self.clock()
        on_tokens = self._on_tokens(p)
        try:
            result = self.verify(p, lambda _row, new: on_tokens(new))
        except Exception as e:  # this request only
            self.fail(p, f"tensorrt_llm: generation failed: {e}")
            return
        self._finish(p, result)

    def _step(self) -> None:
        try:
            self.sch.step()
        except Exception as e:  # fail what was in flight, go on with a fresh pool
            for h in self.sch.drain():
                self.fail(self.live.pop(id(h)), f"tensorrt_llm: generation failed: {e}")

    def _poll_cancelled(self) -> None:
        for key, p in list(self.live.items()):
            if p.handle.result is not None:
                del self.live[key]
            elif p.done or p.sender.cancelled():
                self.sch.cancel(p.handle)  # the client went away: its slot goes next step

    def _on_tokens(self, p: Pending) -> Callable[[list[int]], None]:
        def on_tokens(new_tokens: list[int]) -> None:
            now = self.clock()
            p.first_token = p.first_token or now
            p.last_token = now
            if not p.req.streaming or not new_tokens or p.done:
                return
            try:
                arrays = stream_arrays(p, new_tokens, self.text)
                if arrays is not None:
                    p.done = not p.sender.send(arrays, None, final=False)
            except Exception as e:  # this request only; the batch goes on (cancelled next)
                self.fail(p, f"tensorrt_llm: streaming failed: {e}")
        return on_tokens

    def _on_done(self, p: Pending) -> Callable[[GenerationResult], None]:
        def on_done(result: GenerationResult) -> None:
            p.first_scheduled = getattr(p.handle, "admitted_ns", 0) or p.first_token
            self._finish(p, result)
        return on_done

    def _finish(self, p: Pending, result: GenerationResult) -> None:
        try:
            if p.done:
                self.fail(p, "")  # client gone: only the final flag, once
            elif result.finish_reason == "cancelled":
                self.fail(p, "tensorrt_llm: cancelled")
            else:
                p.sender.send(final_arrays(p, result), None, final=True)
                p.done = p.final_sent = True
        except Exception as e:
            self.fail(p, f"tensorrt_llm: {e}")
        self._count(result)  # after the response: its counters never delay it

    def _count(self, result: GenerationResult) -> None:
        """The request's verify steps into the counters (their failure never fails it)."""
        if self.on_stats is None:
            return
        try:
            self.on_stats(result.stats.to_dict())
        except Exception:  # a metrics failure must not cost a response
            pass
