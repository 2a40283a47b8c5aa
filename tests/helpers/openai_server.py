"""A scripted OpenAI-compatible server in vLLM's wire format, for the client's unit tests.

Not a peer (the real one is vLLM, ``make test-peers``): it streams a fixed plan of verify steps
so every figure the client derives is known exactly. Each request's answer: a first chunk with
the prefill token, then one chunk per verify step carrying ``steps[i]`` tokens (``steps[i] - 1``
accepted drafts of ``k``), cumulative ``usage`` on every chunk when the request asks for
``continuous_usage_stats``, the usage chunk with vLLM's ``metrics.speculative_decoding``, then
``[DONE]``. ``GET /metrics`` serves vLLM's counters over all requests answered so far.
Faults: ``fail_status`` (429/503 answers), ``cut_after`` (close the stream after N chunks),
``not_openai`` (404 everywhere, like Triton's HTTP port).
``split_chars``: chunks whose tokens are the leading bytes of a multi-byte character
(byte-fallback tokens): vLLM holds back an incomplete character's bytes, so such a chunk carries
its tokens in ``usage`` but no text, and the next chunk's first token completes the character
(vLLM ``vllm/entrypoints/openai/serving_completion.py`` ``completion_stream_generator``: a chunk
is skipped only when it has neither text nor token ids).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    steps: tuple[int, ...] = (5, 3, 1, 4)   # tokens per verify step, cycled
    k: int = 4
    model: str = "demo"
    gap_s: float = 0.004
    load_gap_s: float = 0.0                  # extra gap per request in flight (a loaded server)
    context_gap_s: float = 0.0               # extra gap per 1000 prompt characters (long context)
    continuous_usage: bool = True            # honour stream_options.continuous_usage_stats
    per_request_metrics: bool = True
    fail_status: int | None = None
    fail_after: int = 0                      # with fail_status: the first N requests succeed
    cut_after: int | None = None
    not_openai: bool = False
    split_chars: tuple[int, ...] = ()        # chunk indices sent without text (see the docstring)
    drafts_counted: bool = True              # False: counters stay at zero (spec off)
    trtllm_perf: bool = False                # trtllm-serve style: /perf_metrics, no /metrics
    perf: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    inflight: int = 0
    totals: dict[str, int] = field(default_factory=lambda: {"drafts": 0, "draft": 0, "acc": 0})
    per_pos: list[int] = field(default_factory=list)


def plan(n_tokens: int, steps: tuple[int, ...]) -> list[int]:
    """Tokens per chunk: the prefill token, then the steps (cycled, the last one cut to fit)."""
    out, i = [1], 0
    while sum(out) < n_tokens:
        out.append(min(steps[i % len(steps)], n_tokens - sum(out)))
        i += 1
    return out


# a character of n + 1 UTF-8 bytes, for a chunk of n byte tokens completed by the next token
CHARS = {1: "é", 2: "€", 3: "🙂"}


def chunk_texts(chunks: list[int], split: tuple[int, ...] = ()) -> list[str]:
    """The text each chunk carries: token j is ``"t{j} "``, except that the tokens of a chunk in
    ``split`` and the next chunk's first token are the bytes of one :data:`CHARS` character,
    which comes out whole with the next chunk (never, after the last chunk: the stream ended
    inside the character)."""
    out, done, carry = [], 0, ""
    for i, c in enumerate(chunks):
        if i in split:
            if c not in CHARS or i + 1 in split:
                raise ValueError(f"split_chars: chunk {i} of {chunks} cannot split a character")
            out.append("")
            carry = CHARS[c]
        else:
            first = done + 1 if carry else done
            out.append(carry + "".join(f"t{j} " for j in range(first, done + c)))
            carry = ""
        done += c
    return out


def _spec(chunks: list[int], k: int) -> dict[str, Any]:
    hist = [0] * (k + 1)
    for c in chunks[1:]:
        hist[c - 1] += 1
    steps = len(chunks) - 1
    acc = sum(c - 1 for c in chunks[1:])
    return {"mean_acceptance_length": 1 + acc / steps if steps else 0.0,
            "draft_acceptance_rate": acc / (steps * k) if steps else 0.0,
            "acceptance_histogram": hist, "num_spec_steps": steps,
            "num_accepted_draft_tokens": acc, "num_draft_tokens": steps * k, "num_spec_tokens": k}


class ScriptedOpenAI:
    """Runs :class:`Script` on 127.0.0.1 in a thread; ``url`` is HOST:PORT."""

    def __init__(self, script: Script) -> None:
        self.s = script
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ScriptedOpenAI:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/perf_metrics", self.perf_metrics)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"127.0.0.1:{port}"

    async def models(self, request: web.Request) -> web.Response:
        if self.s.not_openai:
            return web.Response(status=404, text='{"error":"Not Found"}')
        return web.json_response({"object": "list", "data": [{"id": self.s.model}]})

    async def perf_metrics(self, request: web.Request) -> web.Response:
        if not self.s.trtllm_perf:
            return web.Response(status=404)
        entries, self.s.perf = self.s.perf, []   # drained on read, as trtllm-serve does
        return web.json_response(entries)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.s.trtllm_perf:
            return web.Response(status=404)
        t, lines = self.s.totals, []
        for name, key in (("num_drafts", "drafts"), ("num_draft_tokens", "draft"),
                          ("num_accepted_tokens", "acc")):
            lines += [f"# TYPE vllm:spec_decode_{name} counter",
                      f'vllm:spec_decode_{name}_total{{engine="0",model_name="demo"}} '
                      f"{float(t[key])}"]
        for pos, v in enumerate(self.s.per_pos):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",'
                         f'model_name="demo",position="{pos}"}} {float(v)}')
        return web.Response(text="\n".join(lines) + "\n")

    def _count(self, spec: dict[str, Any]) -> None:
        if not self.s.drafts_counted:
            return
        self.s.perf.append({"request_id": len(self.s.requests), "perf_metrics": {
            "speculative_decoding": {"acceptance_rate": spec["draft_acceptance_rate"],
                                     "total_accepted_draft_tokens":
                                         spec["num_accepted_draft_tokens"],
                                     "total_draft_tokens": spec["num_draft_tokens"]}}})
        t = self.s.totals
        t["drafts"] += spec["num_spec_steps"]
        t["draft"] += spec["num_draft_tokens"]
        t["acc"] += spec["num_accepted_draft_tokens"]
        hist = spec["acceptance_histogram"]
        if not self.s.per_pos:
            self.s.per_pos = [0] * self.s.k
        for j in range(self.s.k):
            self.s.per_pos[j] += sum(hist[j + 1:])

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.s.requests.append(body)
        if self.s.not_openai:
            return web.Response(status=404, text='{"error":"Not Found"}')
        if self.s.fail_status and len(self.s.requests) > self.s.fail_after:
            return web.json_response({"object": "error", "message": "Server busy, retry later",
                                      "type": "ServiceUnavailable", "code": self.s.fail_status},
                                     status=self.s.fail_status)
        if body.get("model") != self.s.model:
            return web.json_response({"object": "error", "type": "NotFoundError", "code": 404,
                                      "message": f"The model `{body.get('model')}` does not "
                                                 "exist."}, status=404)
        chunks = plan(int(body["max_tokens"]), self.s.steps)
        spec = _spec(chunks, self.s.k)
        self._count(spec)
        chat = "messages" in body
        if not body.get("stream"):
            text = "".join(chunk_texts(chunks, self.s.split_chars))
            choice = {"message": {"role": "assistant", "content": text}} if chat else \
                {"text": text}
            out: dict[str, Any] = {"choices": [choice], "usage": {
                "prompt_tokens": 7, "completion_tokens": sum(chunks)}}
            if self.s.per_request_metrics:
                out["metrics"] = {"speculative_decoding": spec}
            return web.json_response(out)
        return await self._stream(request, body, chunks, spec, chat)

    async def _stream(self, request: web.Request, body: dict[str, Any], chunks: list[int],
                      spec: dict[str, Any], chat: bool) -> web.StreamResponse:
        self.s.inflight += 1
        try:
            return await self._stream_body(request, body, chunks, spec, chat)
        finally:
            self.s.inflight -= 1

    async def _stream_body(self, request: web.Request, body: dict[str, Any], chunks: list[int],
                           spec: dict[str, Any], chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        opts = body.get("stream_options") or {}
        continuous = self.s.continuous_usage and opts.get("continuous_usage_stats")
        done, texts = 0, chunk_texts(chunks, self.s.split_chars)
        if chat:
            await self._send(resp, {"choices": [{"delta": {"role": "assistant", "content": ""}}],
                                    **({"usage": {"completion_tokens": 0}} if continuous else {})})
        for i, c in enumerate(chunks):
            if self.s.cut_after is not None and i >= self.s.cut_after:
                if request.transport is not None:
                    request.transport.close()
                return resp
            ctx = len(str(body.get("prompt") or body.get("messages") or "")) / 1000.0
            await asyncio.sleep(self.s.gap_s + self.s.load_gap_s * self.s.inflight
                                + self.s.context_gap_s * ctx)
            text, done = texts[i], done + c
            choice = {"delta": {"content": text}} if chat else {"text": text}
            ev: dict[str, Any] = {"choices": [choice]}
            if continuous:
                ev["usage"] = {"prompt_tokens": 7, "completion_tokens": done}
            await self._send(resp, ev)
        if opts.get("include_usage"):
            last: dict[str, Any] = {"choices": [], "usage": {"prompt_tokens": 7,
                                                             "completion_tokens": done}}
            if self.s.per_request_metrics:
                last["metrics"] = {"speculative_decoding": spec}
            await self._send(resp, last)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    @staticmethod
    async def _send(resp: web.StreamResponse, ev: dict[str, Any]) -> None:
        await resp.write(f"data: {json.dumps(ev)}\n\n".encode())
