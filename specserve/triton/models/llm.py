"""Reference ``tensorrt_llm`` Triton model: specserve's speculative decoder behind TensorRT-LLM's
``inflight_batcher_llm/tensorrt_llm`` I/O (decoupled).

Imported by the generated shim ``tensorrt_llm/1/model.py`` (backend ``python``). This module is
the ``pb_utils`` half only, as tensorrtllm_backend's ``lib/triton_decoder.py`` is for its
``lib/decode.py`` (triton-inference-server/tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/`` @
04d96ce8e635739babc0aedaac8a2ee10fa8f909): it reads the config and the inputs into numpy
copies, wraps the response sender, and starts the worker. The rest is pure and unit tested:
the inputs read into the serving core's request in :mod:`specserve.triton.llm_io`, its checks in
:mod:`specserve.serving.admission`, the response arrays in :mod:`specserve.serving.responses`,
the loop (intake, backpressure, ``draft_input_ids`` routing, failure drain, cancellation) in
:mod:`specserve.serving.loop`.

Concurrency, as Triton's Python backend wants it on a CPU: ``execute()`` checks each
request, hands it with its sender to a bounded queue (parameter ``specserve_max_pending``; past
it "server busy") and returns ``None``; one worker thread runs the in-flight batcher
(:class:`~specserve.runtime.scheduler.Scheduler`, up to ``max_batch_size`` sequences, parameter
``specserve_prefill_chunk``; a prefix cache of ``specserve_prefix_cache_mb`` MiB, default 256
(0: off; runtime/kv_pool.py). Parameter ``specserve_checkpoint`` ("target", default, or "draft"):
the engine checkpoint served ("draft": the draft model alone, e.g. ``tensorrt_llm_draft``;
speculation is then off). Parameter ``specserve_malloc_trim_s`` (default 10; 0: off): how often
under load the worker hands glibc's free heap pages back (runtime/native_memory.py; it also does
so as it goes idle); oneDNN's and ideep's primitive caches hold 128 entries unless the
environment sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` / ``LRU_CACHE_CAPACITY``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import triton_python_backend_utils as pb_utils

from specserve.runtime.grammar import GuideCompiler
from specserve.runtime.native_memory import cap_primitive_cache, trimmer
from specserve.serving.engine import engine_limits, external_verify, load_decoder, make_scheduler
from specserve.serving.engine_params import env_threads
from specserve.serving.loop import Arrays, Pending, ServingLoop
from specserve.triton.llm_io import admit
from specserve.triton.model_params import ModelParams
from specserve.triton.spec_counters import HELP, DeferredCounters, SpecCounters

#: How long a request's "cancelled?" answer is reused. ``is_cancelled()`` is a round trip to
#: tritonserver; asked for every live request at every step and before every streamed
#: response, it was ~10% of the serving loop at c = 16 (py-spy on the toy model). A final
#: response always asks afresh (a cancelled request must get its final flag alone).
CANCEL_POLL_S = 0.01


class Outbox:
    """Responses sent from a thread of their own, in the order they were handed over. A send is
    a round trip to tritonserver; from the serving loop's thread it stalled the batch (the
    model's stub sat at ~60% of a core at c = 16, the rest waiting on sends), so the loop hands
    each response over and goes on with the next step. Every call on a Triton response
    sender is made on this thread."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="specserve-send", daemon=True)
        self.thread.start()

    def put(self, job: Callable[[], object]) -> None:
        self.jobs.put(job)

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued, then stop."""
        self.jobs.put(None)
        self.thread.join(timeout_s)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()


class TritonSender:
    """Triton's decoupled response sender as a :class:`~specserve.serving.loop.Sender`.
    With an :class:`Outbox`, :meth:`send` queues the response and returns at once (False once
    the request is known to be cancelled, or a send failed), and :meth:`cancelled` answers from
    what the outbox last learnt, asking again through it every ``CANCEL_POLL_S``."""

    def __init__(self, sender: Any, clock: Any = time.monotonic,
                 outbox: Outbox | None = None) -> None:
        self.sender, self.clock, self.outbox = sender, clock, outbox
        self._asked, self._cancelled = float("-inf"), False
        self._gone = False  # cancelled, or a send failed (outbox mode)
        self._polling = False

    def _is_cancelled(self, fresh: bool) -> bool:
        now = self.clock()
        if fresh or now - self._asked >= CANCEL_POLL_S:
            self._cancelled, self._asked = bool(self.sender.is_cancelled()), now
        return self._cancelled

    def send(self, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        if self.outbox is None:
            return self._deliver(arrays, error, final)
        if self._gone and not final:
            return False
        self.outbox.put(lambda: self._deliver(arrays, error, final))
        return not self._gone

    def _deliver(self, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            if self._is_cancelled(fresh=final):
                self._gone = True
                if final:
                    self.sender.send(flags=flags)
                return False
            if error is not None:
                self.sender.send(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(error)), flags=flags)
            elif arrays is None:
                self.sender.send(flags=flags)
            else:
                self.sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(k, v) for k, v in arrays.items()]), flags=flags)
            return True
        except Exception:
            self._gone = True
            return False

    def cancelled(self) -> bool:
        if self.outbox is None:
            try:
                return self._is_cancelled(fresh=False)
            except Exception:  # a sender that cannot tell counts as still there
                return False
        if not self._polling and self.clock() - self._asked >= CANCEL_POLL_S:
            self._polling = True
            self.outbox.put(self._poll)
        return self._gone

    def _poll(self) -> None:
        try:
            self._gone = self._gone or self._is_cancelled(fresh=True)
        except Exception:  # a sender that cannot tell counts as still there
            pass
        finally:
            self._polling = False


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import torch

        torch.set_num_threads(max(1, env_threads("SPECSERVE_TORCH_THREADS", 1)))
        cap_primitive_cache()  # before the first oneDNN primitive (runtime/native_memory.py)
        cfg = json.loads(args["model_config"])
        self.params = ModelParams.from_config(cfg)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.decoder, self.tokenizer, build = load_decoder(
            self.params.engine_dir, self.params.speculation, self.params.checkpoint)
        self.limits = engine_limits(build, self.decoder.target.cfg.vocab_size,
                                    getattr(self.tokenizer, "eos_token_id", None))
        self.guides = GuideCompiler(self.tokenizer, self.decoder.target.cfg.vocab_size,
                                    [] if self.limits.eos is None else [self.limits.eos])
        self.queue: queue.Queue[Pending | None] = queue.Queue(maxsize=self.params.max_pending)
        inflight_cache, verify_cache = self.params.prefix_cache_bytes
        scheduler = make_scheduler(self.decoder, self.params.max_batch, self.limits.max_seq_len,
                                   self.params.prefill_chunk, inflight_cache,
                                   prefill_threads=env_threads("SPECSERVE_PREFILL_THREADS", 0))
        self.outbox = Outbox()
        self.counters = DeferredCounters(spec_counters(args), self.outbox.put)
        self.loop = ServingLoop(scheduler, self.queue, self.params.max_pending,
                                external_verify(self.decoder, self.limits.max_draft_len,
                                                verify_cache),
                                self._text, on_stats=self.counters,
                                trimmer=trimmer(self.params.malloc_trim_s))
        self.worker = threading.Thread(target=self.loop.run, name="specserve-llm", daemon=True)
        self.worker.start()

    def execute(self, requests: list[Any]) -> None:
        now = time.monotonic_ns()
        for request in requests:
            sender = TritonSender(request.get_response_sender(), outbox=self.outbox)
            arrays = {t.name(): t.as_numpy().copy() for t in request.inputs()}  # outlive execute
            try:
                req, params = admit(arrays, self.params, self.decoupled, self.limits,
                                    self._encode, self.guides.compile_text)
                self.queue.put_nowait(Pending(req=req, params=params, sender=sender,
                                              arrival=now))
            except queue.Full:
                sender.send(None, f"tensorrt_llm: server busy: {self.params.max_pending} "
                            "requests queued (specserve_max_pending); retry later", final=True)
            except Exception as e:  # this request only; the batch goes on
                sender.send(None, f"tensorrt_llm: {e}", final=True)
        return None

    def finalize(self) -> None:
        try:
            self.queue.put(None, timeout=10)  # the worker drains the queue, making room
        except queue.Full:
            return
        self.worker.join(timeout=10)
        self.outbox.close()  # what the worker answered last is sent before the stub goes

    def _encode(self, text: str) -> list[int]:
        """Ids of ``text`` without special tokens (a ``prediction``)."""
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def _text(self, ids: list[int]) -> str:
        """Text of ``ids`` as postprocessing decodes them (special tokens skipped)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def spec_counters(args: dict[str, Any]) -> SpecCounters:
    """The model's speculation counters (:mod:`specserve.triton.spec_counters`) as Python
    backend custom metrics, labelled with the model's name and version."""
    families: dict[str, Any] = {}

    def make(name: str, labels: dict[str, str]) -> Any:
        if name not in families:
            families[name] = pb_utils.MetricFamily(name=name, description=HELP[name],
                                                   kind=pb_utils.MetricFamily.COUNTER)
        return families[name].Metric(labels=labels)

    return SpecCounters(make, {"model": str(args.get("model_name", "")),
                               "version": str(args.get("model_version", ""))})

