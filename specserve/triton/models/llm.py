"""Reference ``tensorrt_llm`` Triton model: specserve's speculative decoder behind TensorRT-LLM's
``inflight_batcher_llm/tensorrt_llm`` I/O (decoupled).

Imported by the generated shim ``tensorrt_llm/1/model.py`` (backend ``python``). Concurrency
follows ``../shared/reference/triton-on-cpu.md`` §2: ``execute()`` reads every input into numpy
copies, hands them with the response sender to a queue and returns ``None``; one worker thread
takes everything pending (up to ``max_batch_size``) and runs one batched
``SpecDecoder.generate(prompts, params, on_step)``, streaming each sequence's accepted tokens from
``on_step``. Requests that arrive meanwhile wait for the next batch. Response semantics:
:mod:`specserve.triton.llm_io`.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import triton_python_backend_utils as pb_utils

from specserve.triton.llm_io import LlmRequest, PerfTimes, parse_request, perf_arrays, token_arrays

if TYPE_CHECKING:
    from specserve.engine_record import EngineRecord

_OFF = ("off", "false", "0")
DEFAULT_MAX_PENDING = 1024  # queued requests (parameter specserve_max_pending)


@dataclass
class _Pending:
    req: LlmRequest
    params: Any  # SamplingParams
    sender: Any
    arrival: int
    first_scheduled: int = 0
    first_token: int = 0
    last_token: int = 0
    done: bool = False  # final sent, or the client went away


def _send(sender: Any, response: Any, final: bool) -> bool:
    """Send one response; False when the client is gone (cancelled stream, closed sender)."""
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
    try:
        if sender.is_cancelled():
            if final:
                sender.send(flags=flags)
            return False
        sender.send(response, flags=flags)
        return True
    except Exception:
        return False


def _inputs(request: Any) -> dict[str, np.ndarray[Any, Any]]:
    """Every input of a request as a numpy copy (valid after execute() returns)."""
    return {t.name(): t.as_numpy().copy() for t in request.inputs()}


def _response(arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def load_decoder(engine_dir: str, speculation: bool) -> tuple[Any, Any, EngineRecord]:
    """(decoder, tokenizer, :class:`~specserve.engine_record.EngineRecord`) of a specserve
    engine; speculation off gives the target alone."""
    from specserve.runtime.engine import load_engine

    engine = load_engine(engine_dir)
    decoder = engine.decoder
    if not speculation:
        from specserve.runtime.decoder import SpecDecoder

        decoder = SpecDecoder(decoder.target, None)
    return decoder, engine.tokenizer, engine.record


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import torch

        torch.set_num_threads(int(os.environ.get("SPECSERVE_TORCH_THREADS", "1")))
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.max_batch = max(1, int(cfg.get("max_batch_size", 1)))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.exclude_default = params.get("exclude_input_in_output", "").lower() in ("true", "1")
        speculation = params.get("specserve_speculation", "on").lower() not in _OFF
        self.decoder, tokenizer, build = load_decoder(params["gpt_model_path"], speculation)
        self.eos = getattr(tokenizer, "eos_token_id", None)
        self.max_input_len = build.max_input_len
        self.max_seq_len = build.max_seq_len
        # Bounded: past max_pending queued requests a new one fails at once ("server busy").
        self.max_pending = max(1, int(params.get("specserve_max_pending", "")
                                      or DEFAULT_MAX_PENDING))
        self.queue: queue.Queue[_Pending | None] = queue.Queue(maxsize=self.max_pending)
        self.worker = threading.Thread(target=self._loop, name="specserve-llm", daemon=True)
        self.worker.start()

    def execute(self, requests: list[Any]) -> None:
        now = time.monotonic_ns()
        for request in requests:
            sender = request.get_response_sender()
            try:
                req = parse_request(_inputs(request), self.exclude_default)
                if req.streaming and not self.decoupled:
                    raise ValueError("streaming needs a decoupled model "
                                     "(specserve repo --decoupled)")
                params = self._params(req)
            except Exception as e:  # this request only; the batch goes on
                _send(sender, _error(f"tensorrt_llm: {e}"), final=True)
                continue
            try:
                self.queue.put_nowait(_Pending(req=req, params=params, sender=sender,
                                               arrival=now))
            except queue.Full:
                _send(sender, _error(f"tensorrt_llm: server busy: {self.max_pending} requests "
                                     "queued (specserve_max_pending); retry later"), final=True)
        return None

    def finalize(self) -> None:
        try:
            self.queue.put(None, timeout=10)  # the worker drains the queue, making room
        except queue.Full:
            return
        self.worker.join(timeout=10)

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch, stop = [first], False
            while len(batch) < self.max_batch:
                try:
                    nxt = self.queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            try:
                self._run(batch)
            except Exception as e:  # never let the worker die: fail this batch only
                for p in batch:
                    if not p.done:
                        _send(p.sender, _error(f"tensorrt_llm: {e!r}"), final=True)
            if stop:
                return

    def _params(self, req: LlmRequest) -> Any:
        """Validated SamplingParams (raises with a one-line reason)."""
        from specserve.runtime.decoder import SamplingParams

        n = len(req.prompt)
        self.decoder.check_prompt(req.prompt)  # a bad request fails alone, before batching
        if self.max_input_len and n > self.max_input_len:
            raise ValueError(f"prompt has {n} tokens, the engine's max_input_len is "
                             f"{self.max_input_len}")
        if self.max_seq_len and n + req.max_tokens > self.max_seq_len:
            raise ValueError(f"prompt {n} + request_output_len {req.max_tokens} exceeds the "
                             f"engine's max_seq_len {self.max_seq_len}")
        end_id = self.eos if req.end_id is None else (req.end_id if req.end_id >= 0 else None)
        params = SamplingParams(
            max_tokens=req.max_tokens, temperature=req.temperature, top_k=req.top_k,
            top_p=req.top_p, seed=req.seed, end_id=end_id,
            stop_token_ids=req.stop_token_ids, min_tokens=req.min_tokens)
        params.validate()
        return params

    def _run(self, batch: list[_Pending]) -> None:
        start = time.monotonic_ns()
        for p in batch:
            p.first_scheduled = start

        def on_step(i: int, new_tokens: list[int]) -> None:
            p = batch[i]
            now = time.monotonic_ns()
            p.first_token = p.first_token or now
            p.last_token = now
            if p.req.streaming and new_tokens and not p.done:
                arrays = token_arrays(p.req, [int(t) for t in new_tokens])
                p.done = not _send(p.sender, _response(arrays), final=False)

        try:
            results = self.decoder.generate(
                [p.req.prompt for p in batch], [p.params for p in batch], on_step)
        except Exception as e:
            if len(batch) > 1 and not any(p.first_token for p in batch):
                for p in batch:  # nothing sent yet: a bad request fails alone, the rest run
                    self._run([p])
                return
            for p in batch:
                if not p.done:
                    _send(p.sender, _error(f"tensorrt_llm: generation failed: {e}"), final=True)
                p.done = True
            return
        for p, result in zip(batch, results, strict=True):
            if not p.done:
                _send(p.sender, _response(self._final_arrays(p, result)), final=True)
            p.done = True

    def _final_arrays(self, p: _Pending, result: Any) -> dict[str, Any]:
        if p.req.streaming:
            arrays = token_arrays(p.req, [])
        else:
            tokens = [int(t) for t in result.token_ids]
            arrays = token_arrays(p.req, tokens if p.req.exclude_input else p.req.prompt + tokens)
        if p.req.perf:
            stats = result.stats
            times = PerfTimes(arrival=p.arrival, first_scheduled=p.first_scheduled,
                              first_token=p.first_token or p.first_scheduled,
                              last_token=p.last_token or p.first_scheduled)
            arrays.update(perf_arrays(times, int(stats.draft_tokens), int(stats.accepted_tokens),
                                      json.dumps(stats.to_dict(), sort_keys=True)))
        return arrays
