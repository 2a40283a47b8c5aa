"""Reference ``tensorrt_llm`` Triton model: specserve's speculative decoder behind TensorRT-LLM's
``inflight_batcher_llm/tensorrt_llm`` I/O (decoupled).

Imported by the generated shim ``tensorrt_llm/1/model.py`` (backend ``python``). Concurrency
follows ``../shared/reference/triton-on-cpu.md`` §2: ``execute()`` reads every input into numpy
copies, hands them with the response sender to a queue and returns ``None``; one worker thread
runs the in-flight batcher (:class:`~specserve.runtime.scheduler.Scheduler`, up to
``max_batch_size`` sequences): queued requests join the running batch at the next verify step and
leave it when they finish or their client goes away, each sequence's accepted tokens streamed as
they come (parameter ``specserve_prefill_chunk``, default 256: longer prompts are prefilled a
chunk per step). Parameter ``specserve_batching`` "static" (or a proposer that cannot join a running
batch) gives the old loop: one ``SpecDecoder.generate`` per batch, newcomers wait for it to end.
Response semantics:
:mod:`specserve.triton.llm_io`. Requests with ``draft_input_ids`` go (apart from the others of
the batch) through one ``SpecDecoder.verify(contexts, params, ExternalDraftProposer(...))``.
Parameter ``specserve_checkpoint`` ("target", default, or "draft"): the engine checkpoint served
("draft": the draft model alone, e.g. ``tensorrt_llm_draft``; speculation is then off).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import triton_python_backend_utils as pb_utils

from specserve.triton.llm_io import (
    PLAIN_ENGINE_MAX_DRAFT_LEN,
    LlmRequest,
    PerfTimes,
    check_drafts,
    generation_logits_array,
    parse_request,
    perf_arrays,
    token_arrays,
)
from specserve.triton.models.bls_lib.detok import TokenHoldBack
from specserve.triton.models.llm_common import (
    _error,
    _inputs,
    _Pending,
    _response,
    _send,
)
from specserve.triton.models.llm_inflight import InflightBatching

if TYPE_CHECKING:
    from specserve.engine_record import EngineRecord

_OFF = ("off", "false", "0")
DEFAULT_MAX_PENDING = 4096  # queued requests (parameter specserve_max_pending)


def load_decoder(engine_dir: str, speculation: bool, checkpoint: str = "target"
                 ) -> tuple[Any, Any, EngineRecord]:
    """(decoder, tokenizer, :class:`~specserve.engine_record.EngineRecord`) of a specserve
    engine; speculation off gives the target alone; ``checkpoint`` "draft" gives the engine's
    draft model alone (a draft-target engine's ``draft/``)."""
    from specserve.runtime.engine import load_engine

    if checkpoint not in ("target", "draft"):
        raise ValueError(f"parameter specserve_checkpoint must be 'target' or 'draft', got "
                         f"{checkpoint!r}")
    if checkpoint == "draft":
        return _load_draft(engine_dir)

    engine = load_engine(engine_dir)
    decoder = engine.decoder
    if not speculation:
        from specserve.runtime.decoder import SpecDecoder

        decoder = SpecDecoder(decoder.target, None)
    return decoder, engine.tokenizer, engine.record


def _load_draft(engine_dir: str) -> tuple[Any, Any, EngineRecord]:
    """The draft checkpoint of a draft-target engine as a plain decoder."""
    from pathlib import Path

    from specserve.engine_record import read_engine_record
    from specserve.errors import SpecserveError
    from specserve.runtime import loader
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.model import load_model

    d = Path(engine_dir)
    rec = read_engine_record(d)
    if rec.spec_mode != "draft" or not (d / "draft").is_dir():
        raise SpecserveError(f"{d}: specserve_checkpoint 'draft' needs a draft-target engine "
                             f"(spec_mode {rec.spec_mode!r})")
    model = load_model(d / "draft", loader.parse_dtype(rec.dtype))
    tok_dir = d / "tokenizer" if (d / "tokenizer").is_dir() else d / "target"
    return SpecDecoder(model, None), loader.load_tokenizer(tok_dir), rec


class TritonPythonModel(InflightBatching):
    def initialize(self, args: dict[str, Any]) -> None:
        import torch

        torch.set_num_threads(int(os.environ.get("SPECSERVE_TORCH_THREADS", "1")))
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.max_batch = max(1, int(cfg.get("max_batch_size", 1)))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.exclude_default = params.get("exclude_input_in_output", "").lower() in ("true", "1")
        speculation = params.get("specserve_speculation", "on").lower() not in _OFF
        checkpoint = params.get("specserve_checkpoint", "") or "target"
        self.decoder, tokenizer, build = load_decoder(params["gpt_model_path"], speculation,
                                                      checkpoint)
        # draft_input_ids: at most the engine's max_draft_len (a plain engine: a fixed limit)
        self.max_draft_len = build.max_draft_len if build.spec_mode != "none" and \
            build.max_draft_len > 0 else PLAIN_ENGINE_MAX_DRAFT_LEN
        self.eos = getattr(tokenizer, "eos_token_id", None)
        self.tokenizer = tokenizer  # streaming hold-back (_text)
        self.max_input_len = build.max_input_len
        self.max_seq_len = build.max_seq_len
        # Bounded: past max_pending queued requests a new one fails at once ("server busy").
        self.max_pending = max(1, int(params.get("specserve_max_pending", "")
                                      or DEFAULT_MAX_PENDING))
        self.queue: queue.Queue[_Pending | None] = queue.Queue(maxsize=self.max_pending)
        batching = params.get("specserve_batching", "") or "inflight"
        if batching not in ("inflight", "static"):
            raise ValueError(f"parameter specserve_batching must be 'inflight' or 'static', got "
                             f"{batching!r}")
        self.prefill_chunk = int(params.get("specserve_prefill_chunk", "") or 256)
        prop = self.decoder.proposer
        self.inflight = batching == "inflight" and (prop is None or getattr(prop, "inflight",
                                                                           False))
        loop = self._inflight_loop if self.inflight else self._loop
        self.worker = threading.Thread(target=loop, name="specserve-llm", daemon=True)
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

    def _stream(self, p: _Pending, new_tokens: list[int]) -> None:
        """Each chunk is decoded on its own by postprocessing: send it only once it ends on a
        complete character (held tokens go with the next step or the final)."""
        if p.req.streaming and new_tokens and not p.done:
            p.hold = p.hold or TokenHoldBack(self._text)
            ready = p.hold.push([int(t) for t in new_tokens])
            if ready:
                arrays = token_arrays(p.req, ready)
                p.done = not _send(p.sender, _response(arrays), final=False)

    def _params(self, req: LlmRequest) -> Any:
        """Validated SamplingParams (raises with a one-line reason)."""
        from specserve.runtime.decoder import SamplingParams

        n = len(req.prompt)
        self.decoder.check_prompt(req.prompt)  # a bad request fails alone, before batching
        check_drafts(req, self.decoder.target.cfg.vocab_size, self.max_draft_len)
        if self.max_input_len and n > self.max_input_len:
            raise ValueError(f"prompt has {n} tokens, the engine's max_input_len is "
                             f"{self.max_input_len}")
        # draft_input_ids: one verify step answers at most K + 1 tokens
        max_tokens = req.max_tokens if req.draft_ids is None else req.verify_max_tokens
        if self.max_seq_len and n + max_tokens > self.max_seq_len:
            raise ValueError(f"prompt {n} + request_output_len {max_tokens} exceeds the "
                             f"engine's max_seq_len {self.max_seq_len}")
        end_id = self.eos if req.end_id is None else (req.end_id if req.end_id >= 0 else None)
        params = SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature, top_k=req.top_k,
            top_p=req.top_p, seed=req.seed, end_id=end_id,
            stop_token_ids=req.stop_token_ids,
            min_tokens=req.min_tokens if req.draft_ids is None else min(req.min_tokens,
                                                                        max_tokens))
        params.validate()
        return params

    def _run(self, batch: list[_Pending]) -> None:
        verify = [p for p in batch if p.req.draft_ids is not None]
        if verify and len(verify) < len(batch):  # draft_input_ids: a verify call of their own
            self._run([p for p in batch if p.req.draft_ids is None])
            self._run(verify)
            return
        start = time.monotonic_ns()
        for p in batch:
            p.first_scheduled = start

        def on_step(i: int, new_tokens: list[int]) -> None:
            p = batch[i]
            now = time.monotonic_ns()
            p.first_token = p.first_token or now
            p.last_token = now
            self._stream(p, new_tokens)

        try:
            results = self._decode(batch, on_step)
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

    def _decode(self, batch: list[_Pending], on_step: Any) -> list[Any]:
        """One decoder call for the batch: ``verify`` when it holds draft_input_ids (then all
        of it does), else ``generate``."""
        prompts, params = [p.req.prompt for p in batch], [p.params for p in batch]
        want = [p.req.return_generation_logits for p in batch]
        if batch[0].req.draft_ids is None:
            return list(self.decoder.generate(prompts, params, on_step, return_logits=want))
        import torch

        from specserve.runtime.proposers import ExternalDraftProposer

        drafts = [p.req.draft_ids or () for p in batch]
        logits = [None if p.req.draft_logits is None else torch.from_numpy(p.req.draft_logits)
                  for p in batch]
        proposer = ExternalDraftProposer(drafts, logits, max_draft_len=self.max_draft_len)
        return list(self.decoder.verify(prompts, params, proposer, on_step, return_logits=want))

    def _text(self, ids: list[int]) -> str:
        """Text of ``ids`` as postprocessing decodes them (special tokens skipped)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _final_arrays(self, p: _Pending, result: Any) -> dict[str, Any]:
        if p.req.streaming:  # the tokens still held back (usually none)
            arrays = token_arrays(p.req, p.hold.flush() if p.hold else [])
        else:
            tokens = [int(t) for t in result.token_ids]
            arrays = token_arrays(p.req, tokens if p.req.exclude_input else p.req.prompt + tokens)
        if p.req.return_generation_logits and result.logits is not None:
            arrays.update(generation_logits_array(result.logits.numpy()))
        if p.req.perf:
            stats = result.stats
            times = PerfTimes(arrival=p.arrival, first_scheduled=p.first_scheduled,
                              first_token=p.first_token or p.first_scheduled,
                              last_token=p.last_token or p.first_scheduled)
            arrays.update(perf_arrays(times, int(stats.draft_tokens), int(stats.accepted_tokens),
                                      json.dumps(stats.to_dict(), sort_keys=True)))
        return arrays
