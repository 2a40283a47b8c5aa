"""Load generation for ``specserve bench``: closed loop or Poisson open loop, spec and baseline
requests interleaved in one run, every request recorded as it completes.

- Closed loop (``--concurrency N``): N workers, each sends its next request when the previous
  one finished (genai-perf/perf_analyzer ``--concurrency``).
- Open loop (``--request-rate R``): arrivals of a Poisson process of rate R (exponential gaps
  from a seeded generator), independent of completions (vLLM ``bench serve --request-rate``).
- With a baseline, prompt i is sent once to each variant, in alternating order
  (spec, baseline), (baseline, spec), ... so both see the same load and the same prompts.
- Warmup requests go first (recorded with ``phase="warmup"``, left out of summaries).
- A prompt's ``prediction`` (Predicted Outputs) goes with its spec request only; the baseline
  variant gets the same request without it (:mod:`specserve.client.prediction`).
- After ``abort_after_errors`` consecutive failed requests (unreachable, dying or unloaded
  server; a rejected request between successes does not count) no new request is sent; the run
  ends with the records it has (``aborted`` says why).

Each answer becomes its record in :mod:`specserve.client.request_accounting`; the engine's own
counters around the measured phase are read by :mod:`specserve.client.phase_acceptance`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from specserve.client.acceptance import EngineAcceptance
from specserve.client.balance import PooledTransport
from specserve.client.config import BenchmarkConfig
from specserve.client.datasets import load_prompts
from specserve.client.metrics import RequestRecord, make_record
from specserve.client.openai import OpenAITransport
from specserve.client.phase_acceptance import phase_acceptance, scrape_variants
from specserve.client.prediction import Codec, load_codec
from specserve.client.prompt import Prompt, conversation_text
from specserve.client.request_accounting import (
    acceptance_fields,
    chunk_tokens,
    decode_ids,
    prediction_fields,
)
from specserve.client.transport import GenParams, RawResult, Transport, takes_ids
from specserve.client.triton_grpc import GrpcTransport
from specserve.client.triton_http import HttpTransport
from specserve.errors import SpecserveError


@dataclass(frozen=True)
class Job:
    index: int
    variant: str         # "spec" | "baseline"
    phase: str           # "warmup" | "measure"
    prompt_index: int
    prompt: Prompt


@dataclass(frozen=True)
class Target:
    """Where one variant's requests go."""

    transport: Transport
    model: str
    declared: frozenset[str]


@dataclass(frozen=True)
class RunResult:
    records: tuple[RequestRecord, ...]
    measure_duration_s: float
    aborted: str | None
    interrupted: bool
    inputs_declared: dict[str, list[str]]
    counters: dict[str, EngineAcceptance] = field(default_factory=dict)  # variant -> delta


def plan_jobs(prompts: list[Prompt], warmup: int, requests: int, baseline: bool) -> list[Job]:
    """Warmup jobs then measured jobs; with a baseline, each prompt once per variant."""
    jobs: list[Job] = []
    for phase, count, offset in (("warmup", warmup, 0), ("measure", requests, warmup)):
        for i in range(count):
            pi = offset + i
            order = ["spec"] if not baseline else (
                ["spec", "baseline"] if i % 2 == 0 else ["baseline", "spec"])
            for variant in order:
                jobs.append(Job(len(jobs), variant, phase, pi, prompts[pi]))
    return jobs


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of ``n`` Poisson arrivals at ``rate`` per second."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)  # [n]
    return [float(x) for x in np.cumsum(gaps) - gaps[0]]


class Runner:
    """Runs the jobs of one benchmark and hands every record to ``on_record``."""

    def __init__(self, cfg: BenchmarkConfig, targets: dict[str, Target],
                 on_record: Callable[[RequestRecord], None],
                 count_text: Callable[[str], int] | None, codec: Codec | None = None) -> None:
        self.cfg = cfg
        self.targets = targets
        self.on_record = on_record
        self.count_text = count_text
        self.codec = codec   # the model's tokenizer (--tokenizer): ids doors, the recount
        self.records: list[RequestRecord] = []
        self.aborted: str | None = None
        self.interrupted = False
        self._errors_in_row = 0
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def stopping(self) -> bool:
        return self.aborted is not None or self.interrupted

    def _params(self, job: Job, messages: tuple[tuple[str, str], ...] = (),
                text: str = "") -> GenParams:
        c = self.cfg
        ids = None
        if takes_ids(self.targets[job.variant].declared) and self.codec is not None:
            ids = tuple(self.codec.encode(text))
        return GenParams(max_tokens=job.prompt.max_tokens or c.max_tokens, stream=c.stream,
                         temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, seed=c.seed,
                         end_id=c.end_id, perf_outputs=c.perf_outputs,
                         num_draft_tokens=c.num_draft_tokens, ignore_eos=c.ignore_eos,
                         messages=messages, prediction=self._prediction(job),
                         prediction_field=c.prediction_field, input_ids=ids)

    def _prediction(self, job: Job) -> str | None:
        """The prompt's prediction, for its spec request (``--no-prediction``: none)."""
        if job.variant != "spec" or not self.cfg.send_prediction or job.prompt.turns:
            return None
        return job.prompt.prediction

    async def run_job(self, job: Job) -> None:
        """One request, or every turn of a conversation (one record per turn)."""
        if job.prompt.turns:
            await self._conversation(job)
            return
        await self._send(job, job.prompt.text, job.prompt.messages, 0)

    async def _conversation(self, job: Job) -> None:
        """Turn ``i`` resends the conversation so far, the model's own replies appended (a
        failed turn ends the conversation)."""
        history: list[tuple[str, str]] = []
        for turn, user in enumerate(job.prompt.turns):
            if self.stopping:
                return
            history.append(("user", user))
            rec = await self._send(job, conversation_text(history), tuple(history), turn)
            if rec.status != "completed":
                return
            history.append(("assistant", rec.output_text.strip()))

    async def _send(self, job: Job, text: str, messages: tuple[tuple[str, str], ...],
                    turn: int) -> RequestRecord:
        t = self.targets[job.variant]
        raw = RawResult(send_wall_s=time.time())
        params = self._params(job, messages, text)
        try:
            raw = await t.transport.generate(t.model, text, params, t.declared,
                                             self.cfg.timeout_s)
        except asyncio.CancelledError:
            raw.cancelled, raw.error = True, None
            self._record(job, raw, text, turn, params)
            raise
        return self._record(job, raw, text, turn, params)

    def _record(self, job: Job, raw: RawResult, text: str = "", turn: int = 0,
                params: GenParams | None = None) -> RequestRecord:
        decode_ids(raw, self.codec)
        counts, source = chunk_tokens(raw, self.cfg.num_output_tokens_mode, self.count_text)
        server, spec_stats, acc_source = acceptance_fields(raw)
        t = self.targets[job.variant]
        rec = make_record(
            index=job.index, variant=job.variant, phase=job.phase, model=t.model,
            url=raw.replica or t.transport.url, prompt_index=job.prompt_index,
            send_time_unix_s=raw.send_wall_s,
            streaming=self.cfg.stream, chunk_times_s=raw.chunk_times_s, chunk_tokens=counts,
            end_s=raw.end_s if not (raw.error or raw.cancelled) else None,
            token_count_source=source, server=server, spec_stats=spec_stats,
            acceptance_source=acc_source,
            error=raw.error, cancelled=raw.cancelled, output_text="".join(raw.chunk_texts),
            category=job.prompt.category, turn=turn,
            input_tokens=self.count_text(text) if self.count_text and text else None,
            **prediction_fields(raw, params, self.codec))
        self._errors_in_row = self._errors_in_row + 1 if rec.status == "error" else 0
        if self._errors_in_row >= self.cfg.abort_after_errors and not self.aborted:
            kind = "connection errors" if raw.connection_error else "failed requests"
            self.aborted = f"{self._errors_in_row} {kind} in a row; last: {raw.error}"
        self.records.append(rec)
        self.on_record(rec)
        return rec

    async def closed_loop(self, jobs: list[Job], concurrency: int) -> None:
        it = iter(jobs)

        async def worker() -> None:
            for job in it:
                if self.stopping:
                    return
                await self.run_job(job)

        tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(jobs)))]
        self._tasks.extend(tasks)
        await asyncio.gather(*tasks)

    async def settle(self) -> None:
        """After an interrupt: let every cancelled request write its record."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def open_loop(self, jobs: list[Job], rate: float, seed: int) -> None:
        start = time.perf_counter()
        tasks: list[asyncio.Task[None]] = []
        try:
            for job, at in zip(jobs, poisson_arrivals(len(jobs), rate, seed), strict=True):
                delay = start + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.stopping:
                    break
                tasks.append(asyncio.create_task(self.run_job(job)))
                self._tasks.append(tasks[-1])
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()


def make_transport(protocol: str, url: str, endpoint: str = "completions") -> Transport:
    """``grpc``, ``http`` (Triton) or ``openai`` (``endpoint``: completions | chat) to ``url``."""
    if protocol == "grpc":
        return GrpcTransport(url)
    if protocol == "http":
        return HttpTransport(url)
    if protocol == "openai":
        return OpenAITransport(url, endpoint)
    raise ValueError(f"unknown protocol {protocol!r}")


def _spread(cfg: BenchmarkConfig) -> Transport:
    """The spec variant's transport: one server, or a pool over ``--url A --url B ...``."""
    if not cfg.replicas:
        return make_transport(cfg.protocol, cfg.url, cfg.endpoint)
    return PooledTransport([make_transport(cfg.protocol, u, cfg.endpoint) for u in cfg.urls],
                           cfg.balance)


def _transports(cfg: BenchmarkConfig) -> dict[str, tuple[Transport, str]]:
    spec_tr = _spread(cfg)
    out = {"spec": (spec_tr, cfg.model)}
    if cfg.has_baseline:
        url = cfg.baseline_url or cfg.url
        tr = spec_tr if url == cfg.url else make_transport(cfg.protocol, url, cfg.endpoint)
        out["baseline"] = (tr, cfg.baseline_model or cfg.model)
    return out


def check_targets(cfg: BenchmarkConfig, jobs: list[Job], targets: dict[str, Target],
                  codec: Codec | None) -> None:
    """Refuse, in one line, a run its models cannot serve as asked: a model that takes token
    ids without ``--tokenizer``; predictions for a Triton model without a ``prediction`` input."""
    for t in targets.values():
        if takes_ids(t.declared) and codec is None:
            raise SpecserveError(f"model '{t.model}' takes token ids (input_ids), not text: "
                                 "give --tokenizer (the model's tokenizer folder)")
    spec = targets["spec"]
    if cfg.protocol == "openai" or not cfg.send_prediction or "prediction" in spec.declared:
        return
    if any(j.prompt.prediction is not None and not j.prompt.turns for j in jobs
           if j.variant == "spec"):
        raise SpecserveError(f"model '{spec.model}' takes no 'prediction' input, and the "
                             "prompts carry predictions: give --no-prediction to send them "
                             "without")


async def _run(cfg: BenchmarkConfig, jobs: list[Job], on_record: Callable[[RequestRecord], None],
               count_text: Callable[[str], int] | None, codec: Codec | None = None) -> RunResult:
    transports = _transports(cfg)
    try:
        targets = {v: Target(tr, model, await tr.declared_inputs(model))
                   for v, (tr, model) in transports.items()}
        check_targets(cfg, jobs, targets, codec)
        return await _measure(cfg, jobs, targets, on_record, count_text, codec)
    finally:
        for tr in {id(t): t for t, _ in transports.values()}.values():
            await tr.close()


async def _measure(cfg: BenchmarkConfig, jobs: list[Job], targets: dict[str, Target],
                   on_record: Callable[[RequestRecord], None],
                   count_text: Callable[[str], int] | None,
                   codec: Codec | None = None) -> RunResult:
    runner = Runner(cfg, targets, on_record, count_text, codec)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def interrupt() -> None:
        runner.interrupted = True
        if main is not None:
            main.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (ValueError, RuntimeError):  # not the main thread: Ctrl-C stays default
        pass
    duration = 0.0
    counters: dict[str, EngineAcceptance] = {}
    transports = {v: t.transport for v, t in targets.items()}
    try:
        warm = [j for j in jobs if j.phase == "warmup"]
        meas = [j for j in jobs if j.phase == "measure"]
        await runner.closed_loop(warm, cfg.closed_loop_concurrency)
        before = await scrape_variants(cfg, transports)
        t0 = time.perf_counter()
        try:
            if cfg.request_rate is not None:
                await runner.open_loop(meas, cfg.request_rate, cfg.seed)
            else:
                await runner.closed_loop(meas, cfg.closed_loop_concurrency)
        finally:
            duration = time.perf_counter() - t0
        counters = phase_acceptance(before, await scrape_variants(cfg, transports))
    except asyncio.CancelledError:
        if not runner.interrupted:
            raise
        if main is not None:
            main.uncancel()
        await runner.settle()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return RunResult(tuple(runner.records), duration, runner.aborted, runner.interrupted,
                     {v: sorted(t.declared) for v, t in targets.items()}, counters)


def tokenizer_counter(path: str | None) -> Callable[[str], int] | None:
    """A text -> token count function from a tokenizer folder or file (fallback only)."""
    codec = load_codec(path)
    return None if codec is None else codec.count


class JsonlSink:
    """Appends one JSON line per record and flushes it at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: IO[str] | None = None   # opened at the first record

    def __call__(self, rec: RequestRecord) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = self.path.open("w", encoding="utf-8")
        self._f.write(json.dumps(rec.to_dict(), sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def run_load(cfg: BenchmarkConfig, on_record: Callable[[RequestRecord], None],
             progress: Any = None) -> RunResult:
    """Run the benchmark's requests (blocking); ``progress(rec)`` is called for each record."""
    cfg.validate()
    n = cfg.warmup + cfg.requests
    prompts = load_prompts(cfg.dataset, cfg.prompts, n, cfg.seed)
    jobs = plan_jobs(prompts, cfg.warmup, cfg.requests, cfg.has_baseline)
    codec = load_codec(cfg.tokenizer)
    count_text = None if codec is None else codec.count

    def both(rec: RequestRecord) -> None:
        on_record(rec)
        if progress is not None:
            progress(rec)

    return asyncio.run(_run(cfg, jobs, both, count_text, codec))
