"""Triton Python model ``tensorrt_llm_bls``: preprocessing -> tensorrt_llm -> postprocessing in one
model (Business Logic Scripting), TensorRT-LLM 1.2.1 names and parameters, plus the draft-target
and n-gram loop (``num_draft_tokens`` > 0).

Self-contained (copied into the repository as ``tensorrt_llm_bls/1/model.py``, its helpers as
``tensorrt_llm_bls/1/lib/*.py``: the Python backend puts the version folder on ``sys.path``, as
NVIDIA's BLS relies on for ``lib.decode``). Decoupled: one thread per request, inputs copied in
``execute()`` first.

This file is the ``pb_utils`` half only, as upstream's ``lib/triton_decoder.py`` is for its
``lib/decode.py`` (triton-inference-server/tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/`` @
04d96ce8e635739babc0aedaac8a2ee10fa8f909): it converts Triton tensors to numpy dicts and back
and makes the calls. What goes into each call is built by ``lib/spec_io.py``, each response by
``lib/spec_text.py`` (both pure, unit tested); the loop itself is ``lib/spec_loop.py``; the
tensor conversions and the postprocessing calls are ``lib/triton_io.py``.

Without speculation the engine's responses are decoded one by one (or, with
``accumulate_tokens``, all tokens so far), and the perf and token-count outputs are forwarded;
a reference target (parameter ``specserve_reference_target``) also gets the client's
``num_draft_tokens`` 0, ``num_top_log_probs`` and ``prediction``, and its top log-prob and
prediction-count outputs are forwarded.

With ``num_draft_tokens`` K > 0 the request runs :func:`lib.spec_loop.run`, upstream's
``_spec_generate`` contract (NVIDIA/TensorRT-LLM ``triton_backend/all_models/
inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py`` @ 4db68284ec5583177f1cf72c109a479f8733b848,
``lib/triton_decoder.py`` @ 07f3e442717f402fba3ef7b6471363747e31e3e1; details and specserve's own
seed and stop rules in ``lib/spec_loop.py``): preprocessing once; per iteration the drafts come
from the model named by ``tensorrt_llm_draft_model_name`` (``request_output_len`` = k,
``min_tokens`` = k, ``end_id`` -1, ``return_generation_logits`` when ``use_draft_logits``) or,
with parameter ``speculative_mode: ngram``, from prompt lookup over the context
(``lib/ngram.py``, ``ngram_max_size``); the target (``tensorrt_llm_model_name``) gets the context,
``draft_input_ids`` (+ ``draft_logits``) and ``request_output_len`` = drafts + 1. With a draft
model (parameter ``specserve_draft_ahead``, default true; not with fast logits; only while at
most ``specserve_draft_ahead_max_inflight`` requests are in the BLS) each draft call after the
first asks one token more, a guess of the target's, and the next iteration's draft call runs on a
thread of the request's own while the target verifies (``lib/spec_loop.py``, "Drafting
ahead"). Both calls ask
for ``exclude_input_in_output`` (only new tokens come back); a target whose parameter
``tensorrt_llm_decoupled`` is true is called with ``exec(decoupled=True)`` and its responses are
concatenated (``tensorrt_llm_draft_decoupled`` likewise; both default to false, upstream's
setup). A decoupled BLS with ``stream`` sends one response per iteration holding that
iteration's new text (incremental detokenization, ``lib/detok.py``; upstream refuses streaming
with speculation), made and sent on a thread of the request's own while the loop goes on
(``lib/background.py``), then a final one with the perf outputs. ``total_draft_tokens`` /
``total_accepted_draft_tokens`` are summed over the iterations (accepted: the leading target
tokens equal to the drafts; the target is asked for no perf outputs, see ``_keep``),
``acceptance_rate`` = accepted / drafted; ``spec_stats_json`` (reference repositories) counts one
verify step per iteration.

Bad requests fail alone with one message: ``num_draft_tokens`` < 0 or above the parameter
``max_draft_len`` (the target's), no draft source, a draft model that is not in the repository,
a draft vocabulary (the width of its ``generation_logits``, asked for only with
``use_draft_logits``) that differs from parameter ``tensorrt_llm_vocab_size``, beam search,
``prediction`` or ``num_top_log_probs`` with the loop (the target serves them without it).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import triton_python_backend_utils as pb_utils

if TYPE_CHECKING:
    from specserve.triton.models.bls_lib import background, ngram, spec_io, spec_loop, spec_text
    from specserve.triton.models.bls_lib import request as rq
    from specserve.triton.models.bls_lib import triton_io as tio
else:
    try:  # in a repository: tensorrt_llm_bls/1/lib/, next to model.py
        from lib import background, ngram, spec_io, spec_loop, spec_text
        from lib import request as rq
        from lib import triton_io as tio
    except ImportError:  # imported from the specserve package
        from specserve.triton.models.bls_lib import background, ngram, spec_io, spec_loop, spec_text
        from specserve.triton.models.bls_lib import request as rq
        from specserve.triton.models.bls_lib import triton_io as tio

KEEP_ITERATORS = 4096  # decoupled BLS response iterators held after use (see _keep)
Arrays = tio.Arrays


_Cancelled = background.Cancelled  # the client went away: stop the loop, send nothing more


class _SlotSender:
    """A request's response sender that frees its slot just before the final response goes, so
    a client that sends its next request on that response finds the slot free (freed after
    the send, the next request could be refused as busy)."""

    def __init__(self, sender: Any, release: Any) -> None:
        self.sender, self.release, self.freed = sender, release, False

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.release()

    def send(self, response: Any = None, flags: int = 0) -> None:
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.free()
        if response is None:
            self.sender.send(flags=flags)
        else:
            self.sender.send(response, flags=flags)

    def is_cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


class _CallError(RuntimeError):
    """A draft or target call failed (the message names the model and its parameter)."""


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.cfg = spec_io.BlsParams.from_params(params)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.outputs = [o["name"] for o in cfg.get("output", [])]
        # One thread per in-flight decoupled request, bounded: past the bound a request fails
        # at once with "server busy" and the server stays up.
        self.slots = threading.BoundedSemaphore(self.cfg.max_inflight)
        self.inflight = 0  # requests in _serve now (drafting ahead is for a light load)
        self.inflight_lock = threading.Lock()
        self.kept: collections.deque[Any] = collections.deque(maxlen=KEEP_ITERATORS)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        arrival = time.monotonic_ns()
        responses = []
        for request in requests:
            inputs = {t.name(): t.as_numpy().copy() for t in request.inputs()}
            if self.decoupled:
                sender = request.get_response_sender()
                if not self.slots.acquire(blocking=False):
                    sender.send(tio.error(f"tensorrt_llm_bls: server busy: {self.cfg.max_inflight} "
                                       "requests in flight (specserve_max_inflight); retry later"),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                threading.Thread(target=self._serve_slot, args=(inputs, sender, arrival),
                                 daemon=True).start()
            else:
                collected: list[Any] = []
                self._serve(inputs, None, arrival, collected)
                responses.append(collected[-1] if collected else
                                 tio.error("tensorrt_llm_bls: no output"))
        return None if self.decoupled else responses

    def _keep(self, iterator: Any) -> Any:
        """Hold a decoupled exec's response iterator for a while after its request ended.

        Works around the Python backend stub of tritonserver 2.51 (r24.10): ``~PbTensor`` frees
        a tensor's numpy array without taking the GIL (fixed upstream by
        triton-inference-server/python_backend b771f4f, "Hold GIL when deleting numpy array",
        Dec 2024), and its utility thread erases finished iterators from
        ``response_iterator_map_`` (``Stub::SendCleanupId``) without the GIL: when that drops
        the last reference, the responses' arrays are freed there, racing the interpreter
        (measured here: heap corruption, "double free", a dead BLS stub within about a thousand
        concurrent loop requests). Kept here, the last reference goes when a newer iterator
        pushes it out of the bounded deque, in a Python thread holding the GIL. The same bug is
        why every call asks for exactly the outputs its model produces: a response sender
        prunes unrequested outputs with the GIL released (``ResponseSender::Send``), which
        crashed the reference ``tensorrt_llm`` stub when the loop asked it for fewer outputs
        than ``return_perf_metrics`` made it send."""
        self.kept.append(iterator)
        return iterator

    def _serve_slot(self, inputs: dict[str, np.ndarray[Any, Any]], sender: Any,
                    arrival: int) -> None:
        slot = _SlotSender(sender, self.slots.release)
        try:
            self._serve(inputs, slot, arrival)
        finally:
            slot.free()

    def _serve(self, inputs: dict[str, np.ndarray[Any, Any]], sender: Any, arrival: int,
               collected: list[Any] | None = None) -> None:
        with self.inflight_lock:
            self.inflight += 1
        try:
            self._serve_one(inputs, sender, arrival, collected)
        finally:
            with self.inflight_lock:
                self.inflight -= 1

    def _serve_one(self, inputs: dict[str, np.ndarray[Any, Any]], sender: Any, arrival: int,
                   collected: list[Any] | None) -> None:
        def emit(resp: Any, final: bool) -> None:
            if collected is not None:  # non-decoupled: one response, the last one wins
                collected[:] = [resp]
            else:
                if sender.is_cancelled():
                    raise _Cancelled()
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                sender.send(resp, flags=flags)

        try:
            k = rq.route(inputs, self.decoupled)
            if k != 0:
                self._spec_generate(inputs, emit, k, arrival)
            else:
                self._generate(inputs, emit)
            if sender is not None:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except _Cancelled:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            try:
                emit(tio.error(f"tensorrt_llm_bls: {e}"), True)
            except _Cancelled:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _preprocess(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        """preprocessing's outputs under the tensorrt_llm input names (numpy arrays)."""
        pre_in = [pb_utils.Tensor(rq.PRE[k], rq.as_batch(v))
                  for k, v in inputs.items() if k in rq.PRE]
        pre = pb_utils.InferenceRequest(model_name="preprocessing", inputs=pre_in,
                                        requested_output_names=list(rq.PRE_OUT)).exec()
        if pre.has_error():
            raise RuntimeError(pre.error().message())
        # copies: the arrays outlive the response they came in (used by every loop iteration)
        return {rq.PRE_OUT[t.name()]: t.as_numpy().copy() for t in pre.output_tensors()}

    def _generate(self, inputs: dict[str, np.ndarray[Any, Any]], emit: Any) -> None:
        pre = self._preprocess(inputs)
        llm_in = [pb_utils.Tensor(k, v)
                  for k, v in rq.target_inputs(inputs, pre, self.decoupled,
                                               self.cfg.reference_target).items()]
        wanted = ["output_ids", "sequence_length", *[o for o in rq.FORWARD if o in self.outputs]]
        llm = pb_utils.InferenceRequest(model_name=self.cfg.llm, inputs=llm_in,
                                        requested_output_names=wanted)
        seen: dict[int, list[np.ndarray[Any, Any]]] = collections.defaultdict(list)
        for resp in self._keep(llm.exec(decoupled=True)):  # also fine for a non-decoupled model
            if resp.has_error():
                raise RuntimeError(resp.error().message())
            if not resp.output_tensors():
                continue  # the empty final response of a decoupled exec
            emit(tio.text_response(resp, seen, self.cfg.accumulate, rq.FORWARD, self.outputs),
                 False)

    def _exec(self, role: str, model: str, call: tuple[Arrays, list[str]],
              decoupled: bool) -> dict[str, Any]:
        """One draft or target call, its outputs merged over its responses
        (:func:`lib.spec_io.merge_outputs`)."""
        arrays, names = call
        req = pb_utils.InferenceRequest(model_name=model, inputs=tio.tensors(arrays),
                                        requested_output_names=names)
        try:
            responses = self._keep(req.exec(decoupled=True)) if decoupled else [req.exec()]
            got = []
            for resp in responses:
                if resp.has_error():
                    raise _CallError(spec_io.call_error(role, model, resp.error().message()))
                got.append(tio.arrays(resp))
        except _CallError:
            raise
        except Exception as e:  # exec itself failed (e.g. an unknown model)
            raise _CallError(spec_io.call_error(role, model, str(e))) from e
        return spec_io.merge_outputs(got)

    def _spec_generate(self, inputs: Arrays, emit: Any, k: int, arrival: int) -> None:
        """:func:`lib.spec_loop.run` over draft and target calls built by ``lib/spec_io.py``."""
        spec_io.check_spec_request(self.cfg, inputs, k)
        pre = self._preprocess(inputs)
        req, opts = spec_io.spec_request(inputs, pre, k), spec_io.spec_options(inputs,
                                                                                self.decoupled)
        fast: list[Any] = [None]  # the last draft's fast-logits handle (spec_io.draft_logits)
        draft = self._ngram_draft if self.cfg.spec_mode == "ngram" else \
            self._model_draft(inputs, pre, opts, fast)
        text = spec_text.TextStream(opts, self.cfg.accumulate, req.prompt, tio.decode,
                                    tio.decode_many)
        # streamed: each iteration's text and send on a thread of its own (lib/background.py)
        bg = background.Background() if opts.streaming else None

        def stream(it: spec_loop.Iteration) -> None:
            values = text.iteration(it)
            if values is not None:
                emit(self._response(values), False)

        def on_iteration(it: spec_loop.Iteration) -> None:
            if bg is None:
                stream(it)
            else:
                bg.put(lambda: stream(it))

        # the next iteration's draft call beside the target's (spec_loop: "Drafting ahead")
        pool = (concurrent.futures.ThreadPoolExecutor(1, "bls-ahead")
                if self.cfg.ahead_now(self.inflight) else None)
        scheduled = time.monotonic_ns()
        try:
            result = spec_loop.run(req, draft, self._target(inputs, pre, fast), on_iteration,
                                   ahead=None if pool is None else
                                   (lambda job: pool.submit(job).result))
        except BaseException:
            if bg is not None:
                with contextlib.suppress(BaseException):
                    bg.close()  # its sends end before the caller's error or final flag
            raise
        finally:
            if pool is not None:  # a call started ahead and not used ends here, unseen
                pool.shutdown(wait=True, cancel_futures=True)
        if bg is not None:
            bg.close()
        emit(self._response(text.final(result, arrival, scheduled)), False)

    def _model_draft(self, inputs: Arrays, pre: Arrays, opts: spec_io.SpecOptions,
                     fast: list[Any]) -> spec_loop.DraftFn:
        """The draft model's calls of one request (ids and, with logits, vocabulary checked)."""
        cfg = self.cfg

        def draft(ctx: list[int], n: int, s: spec_loop.Sampling) -> tuple[list[int], Any]:
            out = self._exec("draft", cfg.draft, spec_io.draft_call(inputs, pre, ctx, n, s, opts),
                             cfg.draft_decoupled)
            logits, fast[0] = spec_io.draft_logits(cfg, out, opts)
            tokens = spec_io.within_target_vocab(cfg, out["output_ids"])
            spec_io.check_draft(cfg, tokens, logits)
            return tokens, logits
        return draft

    def _target(self, inputs: Arrays, pre: Arrays, fast: list[Any]) -> spec_loop.TargetFn:
        """The target's calls of one request."""
        def target(ctx: list[int], drafts: list[int], logits: Any,
                   s: spec_loop.Sampling) -> tuple[list[int], int, int]:
            call = spec_io.target_call(inputs, pre, ctx, drafts, logits, s, fast[0])
            out = self._exec("target", self.cfg.llm, call, self.cfg.llm_decoupled)
            return spec_io.target_counts(drafts, out["output_ids"])
        return target

    def _ngram_draft(self, ctx: list[int], n: int, s: spec_loop.Sampling
                     ) -> tuple[list[int], Any]:
        return ngram.propose(ctx, n, self.cfg.ngram_max), None

    def _response(self, values: dict[str, Any]) -> Any:
        """A response of the declared outputs among ``values``."""
        return pb_utils.InferenceResponse(
            output_tensors=tio.tensors(spec_text.response_arrays(values, self.outputs)))
