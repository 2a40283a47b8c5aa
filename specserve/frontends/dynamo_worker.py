"""A Dynamo worker serving a specserve engine: ``python -m specserve.frontends.dynamo_worker
--engine DIR --name MODEL``.

Dynamo's Python worker API (ai-dynamo-runtime 1.6.1 ``dynamo/_core.pyi``; the pattern of
ai-dynamo/dynamo ``components/src/dynamo/mocker/main.py`` and ``components/src/dynamo/vllm/
handlers.py``): ``create_runtime("file", "tcp")``, ``runtime.endpoint(NS.COMPONENT.generate)``,
``register_model(ModelInput.Tokens, Chat | Completions, ...)`` with the engine's ``target/``
(config.json, tokenizer.json, tokenizer_config.json), then ``serve_endpoint(handler)``, where the
handler is an async generator of ``{"token_ids": [...]}`` chunks, ``finish_reason`` on the last.

Nothing here decides what a request means or when it runs: a request goes through
:func:`specserve.frontends.dynamo_request.admit` (the serving core's request and checks) into
the serving core's :class:`~specserve.serving.loop.ServingLoop` (in-flight batching,
backpressure, cancellation) on one thread, as the Triton model runs it. ``DynamoSender``
(``frontends/dynamo_sender.py``) is the loop's :class:`~specserve.serving.loop.Sender`: it
hands each response to the handler's asyncio queue; when the handler ends early (the frontend
stopped the context, the client went away) it reports the client gone, and the loop frees the
slot at the next step.

Acceptance reaches the client through Prometheus (``--metrics-port``): vLLM's counter names
(``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens``,
``_num_accepted_tokens_per_pos{position}``; vllm-project/vllm ``vllm/v1/spec_decode/metrics.py``),
added from each finished request's ``spec_stats_json``, so ``specserve bench --metrics-url``
sums them over workers (:func:`specserve.client.acceptance.counter_acceptance`), and
``vllm:request_success{finished_reason}`` (``stop``, ``length``, ``error``, ``abort``: the client
went away and the loop ended the request, freeing its slot). Predicted Outputs' counts come back
in the final output's ``completion_usage`` (Dynamo's ``LLMEngineOutput`` field, which ai-dynamo
1.6.1's frontend returns as the response's ``usage``: ``completion_tokens_details``
``accepted_prediction_tokens`` / ``rejected_prediction_tokens``) and in
``specserve:prediction_tokens{outcome}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.errors import SpecserveError
from specserve.frontends.dynamo_kv_events import KvEventRelay
from specserve.frontends.dynamo_metrics import SpecCounters
from specserve.frontends.dynamo_registration import canary_request, has_chat_template
from specserve.frontends.dynamo_request import admit
from specserve.frontends.dynamo_sender import DynamoSender
from specserve.runtime.kv_pool import BLOCK_SIZE
from specserve.runtime.native_memory import cap_primitive_cache, trimmer
from specserve.serving.engine import external_verify
from specserve.serving.engine_params import (
    DEFAULT_MALLOC_TRIM_S,
    DEFAULT_MAX_PENDING,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFIX_CACHE_MB,
    env_threads,
    prefix_cache_split,
)
from specserve.serving.loop import Pending, ServingLoop
from specserve.serving.request import EngineLimits

if TYPE_CHECKING:
    pass

BUSY = "server busy: {} requests queued; retry later"


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's engine, served name and Dynamo endpoint."""

    engine_dir: Path
    name: str
    namespace: str = "specserve"
    component: str = "worker"
    speculation: bool = True
    max_batch: int = 8
    max_pending: int = DEFAULT_MAX_PENDING
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB  # 0: no prefix cache
    metrics_port: int = 0  # 0: no Prometheus endpoint
    kv_events: bool = True  # False: the prefix cache's blocks are not published to the router

    @property
    def endpoint(self) -> str:
        return f"{self.namespace}.{self.component}.generate"


def client_error(code: int, message: str) -> Exception:
    """Dynamo's ``HttpError``: the frontend answers the client with this status and message
    (an OpenAI error body); any other exception reaches the client as a bare 500."""
    from dynamo.llm.exceptions import InvalidArgument

    err: Exception = InvalidArgument(message)
    return err


class Worker:
    """The engine, its serving loop on a thread, and the Dynamo handler."""

    def __init__(self, cfg: WorkerConfig) -> None:
        from specserve.runtime.grammar import GuideCompiler
        from specserve.serving.engine import engine_limits, load_decoder, make_scheduler

        self.cfg = cfg
        self.decoder, self.tokenizer, record = load_decoder(str(cfg.engine_dir),
                                                            cfg.speculation)
        self.limits: EngineLimits = engine_limits(record, self.decoder.target.cfg.vocab_size,
                                                  getattr(self.tokenizer, "eos_token_id", None))
        self.guides = GuideCompiler(self.tokenizer, self.decoder.target.cfg.vocab_size,
                                    [] if self.limits.eos is None else [self.limits.eos])
        self.counters = SpecCounters(cfg.metrics_port) if cfg.metrics_port else None
        self.queue: queue.Queue[Pending | None] = queue.Queue(maxsize=cfg.max_pending)
        inflight_cache, verify_cache = prefix_cache_split(cfg.prefix_cache_mb)
        # the prefix cache's block events, to Dynamo's KV router once serve() has an endpoint
        self.kv_events = KvEventRelay() if inflight_cache else None
        scheduler = make_scheduler(self.decoder, cfg.max_batch, self.limits.max_seq_len,
                                   cfg.prefill_chunk, inflight_cache, self.kv_events,
                                   env_threads("SPECSERVE_PREFILL_THREADS", 0))
        pool, relay = scheduler.kv, self.kv_events
        if self.counters is not None and pool is not None and relay is not None:
            self.counters.prefix_cache(lambda: pool.stats, relay)
        self.loop = ServingLoop(scheduler, self.queue, cfg.max_pending,
                                external_verify(self.decoder, self.limits.max_draft_len,
                                                verify_cache),
                                self._text, trimmer=trimmer(DEFAULT_MALLOC_TRIM_S))
        self.thread = threading.Thread(target=self.loop.run, name="specserve-dynamo",
                                       daemon=True)
        self.thread.start()
        # SPECSERVE_DYNAMO_TRACE=FILE: one JSON line per request, wall times of its arrival at
        # the handler, the loop's first response and the handler's first yield
        # (benchmarks/dynamo_ttft_trace.py lines them up with the client's)
        trace = os.environ.get("SPECSERVE_DYNAMO_TRACE")
        self.trace = open(trace, "a", encoding="utf-8") if trace else None  # noqa: SIM115

    def _encode(self, text: str) -> list[int]:
        """The model's tokens of ``text`` without special tokens (a prediction's)."""
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def _text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    async def generate(self, request: dict[str, Any], context: Any
                       ) -> AsyncIterator[dict[str, Any]]:
        """Dynamo's handler: admit, queue for the loop, yield its responses."""
        received = time.time()
        if spent(request):
            yield {"token_ids": [], "finish_reason": "length"}
            return
        try:
            req, params = admit(request, self.limits, self.guides.compile_text, self._encode)
        except (ValueError, SpecserveError) as e:
            raise client_error(400, f"specserve: {e}") from None
        sender = DynamoSender(asyncio.get_running_loop(), params, self.counters, self._text)
        sender.prompt_tokens = len(req.prompt)
        try:
            self.queue.put_nowait(Pending(req=req, params=params, sender=sender,
                                          arrival=time.monotonic_ns()))
        except queue.Full:
            raise client_error(503, f"specserve: {BUSY.format(self.cfg.max_pending)}") from None
        first_yield = 0.0
        try:
            async for item in _responses(sender, context):
                first_yield = first_yield or time.time()
                yield item
        finally:
            sender.gone.set()  # ended early: the loop cancels it at the next step
            if self.trace is not None:
                self.trace.write(json.dumps({
                    "id": _context_id(context), "received": received,
                    "first_send": sender.first_send, "first_yield": first_yield,
                    "prompt_tokens": len(request.get("token_ids") or ()),
                    "request": {k: v for k, v in request.items() if k != "token_ids"}},
                    default=str) + "\n")
                self.trace.flush()


def spent(request: dict[str, Any]) -> bool:
    """A request migrated after its last token reached the client: Dynamo's migration re-sends
    it with the streamed tokens appended to the prompt and ``max_tokens`` less by as many
    (ai-dynamo/dynamo ``docs/architecture/request_migration.md``), so a worker that died
    between the last token and the final response leaves a budget of 0. The frontend refuses
    ``max_tokens`` 0 from a client ("Max tokens must be greater than 0"), so only a migration
    sends it; the answer is the final response alone."""
    stop = request.get("stop_conditions") or {}
    return isinstance(stop, dict) and stop.get("max_tokens") == 0


async def _responses(sender: DynamoSender, context: Any) -> AsyncIterator[dict[str, Any]]:
    """The loop's responses until the final one, or until the frontend stops the context (the
    client went away): checked before every item, and every 0.1 s while none comes. ``n`` > 1:
    until every choice's final response."""
    finals = 0
    while not _stopped(context):
        try:
            item, final = await asyncio.wait_for(sender.out.get(), timeout=0.1)
        except TimeoutError:
            continue
        if "error" in item:
            raise client_error(500, f"specserve: {item['error']}")
        yield item
        finals += final
        if finals >= sender.finals:
            return


def _context_id(context: Any) -> str:
    try:
        return str(context.id())
    except Exception:  # no context (tests), or a runtime without ids
        return ""


def _stopped(context: Any) -> bool:
    return context is not None and bool(context.is_stopped() or context.is_killed())


async def serve(cfg: WorkerConfig) -> None:
    """Register the model with Dynamo's file discovery and serve until stopped."""
    from dynamo.common.utils.runtime import create_runtime
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

    from specserve.frontends.nodelay import watch

    worker = Worker(cfg)
    # Nagle off on the request plane's listener too (each request is answered with a small ack
    # on the connection it came in on: specserve/frontends/nodelay.py)
    watch(lambda port: print(f"specserve: TCP_NODELAY set on listener port {port}", flush=True),
          until=lambda seen: bool(seen - {cfg.metrics_port}))
    # locally file discovery (specserve serve sets it); in a DynamoGraphDeployment the operator
    # injects DYN_DISCOVERY_BACKEND (kubernetes) and DYN_NAMESPACE into every pod
    runtime, _loop = create_runtime(os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
                                    os.environ.get("DYN_REQUEST_PLANE", "tcp"))
    endpoint = runtime.endpoint(cfg.endpoint)
    block = None
    if worker.kv_events is not None and cfg.kv_events:  # the router hashes in the pool's blocks
        from dynamo.llm import KvEventPublisher

        worker.kv_events.publisher = KvEventPublisher(endpoint=endpoint, kv_block_size=BLOCK_SIZE)
        block = BLOCK_SIZE
    # a base model (no chat template): completions only (frontends/dynamo_registration.py)
    kinds = ModelType.Chat | ModelType.Completions if has_chat_template(
        cfg.engine_dir / "target") else ModelType.Completions
    await register_model(ModelInput.Tokens, kinds, endpoint,
                         str(cfg.engine_dir / "target"), cfg.name,
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=block)
    print(f"specserve dynamo worker ready: {cfg.name} on {cfg.endpoint}", flush=True)
    # Dynamo's canary (when DYN_HEALTH_CHECK_ENABLED): a wedged engine turns /health not ready
    await endpoint.serve_endpoint(worker.generate,
                                  health_check_payload=canary_request(worker.limits.eos))


def parse_args(argv: list[str] | None = None) -> WorkerConfig:
    ap = argparse.ArgumentParser(prog="python -m specserve.frontends.dynamo_worker")
    ap.add_argument("--engine", required=True, type=Path, help="torch engine directory")
    ap.add_argument("--name", required=True, help="served model name")
    ap.add_argument("--namespace", default=os.environ.get("DYN_NAMESPACE", "specserve"))
    ap.add_argument("--component", default="worker")
    ap.add_argument("--no-speculation", action="store_true", help="the target alone")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--metrics-port", type=int, default=0)
    ap.add_argument("--prefix-cache-mb", type=int, default=DEFAULT_PREFIX_CACHE_MB,
                    help="prefix cache budget in MiB (0: off)")
    ap.add_argument("--no-kv-events", action="store_true",
                    help="do not publish the prefix cache's blocks to Dynamo's KV router")
    a = ap.parse_args(argv)
    if a.prefix_cache_mb < 0:
        ap.error(f"--prefix-cache-mb must be >= 0, got {a.prefix_cache_mb}")
    return WorkerConfig(engine_dir=a.engine, name=a.name, namespace=a.namespace,
                        component=a.component, speculation=not a.no_speculation,
                        max_batch=max(1, a.max_batch), metrics_port=a.metrics_port,
                        prefix_cache_mb=a.prefix_cache_mb, kv_events=not a.no_kv_events)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    import torch

    cap_primitive_cache()  # before the first oneDNN primitive (runtime/native_memory.py)
    try:
        torch.set_num_threads(max(1, env_threads("SPECSERVE_TORCH_THREADS", 1)))
        asyncio.run(serve(cfg))
    except SpecserveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
