"""Transport to OpenAI-compatible servers (``trtllm-serve``, vLLM, SGLang, Dynamo); thin adapter.

- ``POST /v1/completions`` (``prompt``) or ``/v1/chat/completions`` (``messages``), streamed as
  server-sent events ending with ``data: [DONE]``, or one JSON body (OpenAI API reference,
  "Completions" / "Chat Completions").
- Streaming asks for ``stream_options: {include_usage: true, continuous_usage_stats: true}``:
  the last chunk carries ``usage`` (OpenAI), and vLLM/SGLang also put the cumulative ``usage`` on
  every chunk, which gives each chunk's token count exactly (one chunk carries a whole verify
  step's tokens, so chunks are never counted as tokens). The request's total is always
  ``usage.completion_tokens``.
- A chunk may carry new tokens and no text: vLLM holds back the bytes of an incomplete UTF-8
  character (byte-fallback tokens) and sends the chunk anyway (``vllm/entrypoints/openai/
  serving_completion.py`` ``completion_stream_generator`` skips only chunks with neither text nor
  token ids). Those tokens count with the next chunk that has text, the one that shows them
  (at the end of the stream: with the last chunk).
- Per-request acceptance, where the engine sends it (vLLM ``metrics.speculative_decoding``,
  SGLang ``meta_info``), is read by :func:`specserve.client.acceptance.from_response`.
- ``GET /v1/models`` checks that the server speaks the protocol and serves the model.
- Predicted Outputs: a request's prediction goes as Dynamo takes it, ``nvext.annotations``
  ``["prediction:<text>"]`` (its frontend refuses OpenAI's top-level ``prediction``), or as
  OpenAI's own ``prediction: {"type": "content", "content": ...}`` (:data:`PREDICTION_FIELDS`);
  the counts come back in ``usage.completion_tokens_details`` (``accepted_prediction_tokens``,
  ``rejected_prediction_tokens``). Only text comes back, no token ids.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from specserve.client.acceptance import from_response
from specserve.client.http_client import AiohttpClient, error_text
from specserve.client.transport import GenParams, RawResult
from specserve.errors import ServerError

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PREDICTION_FIELDS = ("nvext", "openai")


def openai_body(model: str, prompt: str, p: GenParams, endpoint: str) -> dict[str, Any]:
    """The JSON body of one request (fields left as ``None`` are not sent)."""
    body: dict[str, Any] = {"model": model, "max_tokens": p.max_tokens, "stream": p.stream}
    if endpoint == "chat":
        msgs = p.messages or (("user", prompt),)  # a conversation's history, else the prompt
        body["messages"] = [{"role": r, "content": c} for r, c in msgs]
    else:
        body["prompt"] = prompt
    if p.stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    extra = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "seed": p.seed,
             "ignore_eos": True if p.ignore_eos else None}
    body.update({k: v for k, v in extra.items() if v is not None})
    if p.prediction is not None:
        if p.prediction_field == "openai":
            body["prediction"] = {"type": "content", "content": p.prediction}
        else:
            body["nvext"] = {"annotations": [f"prediction:{p.prediction}"]}
    return body


def prediction_counts(data: dict[str, Any]) -> tuple[int, int] | None:
    """(accepted, rejected) prediction tokens of ``usage.completion_tokens_details``; ``None``
    when the answer has neither (a server that does not count them)."""
    usage = data.get("usage")
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return None
    acc, rej = details.get("accepted_prediction_tokens"), details.get("rejected_prediction_tokens")
    if not isinstance(acc, int) and not isinstance(rej, int):
        return None
    return (acc if isinstance(acc, int) else 0), (rej if isinstance(rej, int) else 0)


def _take_counts(data: dict[str, Any], raw: RawResult) -> None:
    counts = prediction_counts(data)
    if counts is not None:
        raw.accepted_prediction_tokens, raw.rejected_prediction_tokens = counts


@dataclass
class _Stream:
    """Parse state of one streamed response."""

    raw: RawResult
    cumulative: int = 0
    pending: int = 0    # tokens counted in chunks without text (held-back detokenization)
    done: bool = False

    def event(self, payload: str, t: float) -> bool:
        """Parse one ``data:`` payload; False when the stream is over (``[DONE]`` or error)."""
        if payload == "[DONE]":
            self._flush()
            self.done = True
            return False
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise ValueError(f"unexpected event: {payload[:200]}")
        if "error" in data or data.get("object") == "error":
            self.raw.error = f"server error in stream: {error_text(payload)}"
            return False
        acc = from_response(data)
        if acc is not None:
            self.raw.acceptance = acc
        _take_counts(data, self.raw)
        text = _choice_text(data)
        usage = _completion_tokens(data)
        n: int | None = None
        if usage is not None:
            n, self.cumulative = max(usage - self.cumulative, 0), max(usage, self.cumulative)
            self.raw.usage_tokens = usage
        if text:
            self.raw.chunk_times_s.append(t)
            self.raw.chunk_texts.append(text)
            self.raw.chunk_num_tokens.append(None if n is None else n + self.pending)
            self.pending = 0
        elif n:
            self.pending += n   # their text comes with a later chunk
        return True

    def _flush(self) -> None:
        """Tokens whose text never came (the stream ended inside a character): the last chunk."""
        counts = self.raw.chunk_num_tokens
        last = counts[-1] if counts else None
        if self.pending and last is not None:
            counts[-1], self.pending = last + self.pending, 0


def _choice_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    if "text" in c:
        return str(c.get("text") or "")
    msg = c.get("delta") or c.get("message") or {}
    return str(msg.get("content") or "") if isinstance(msg, dict) else ""


def _completion_tokens(data: dict[str, Any]) -> int | None:
    usage = data.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None


class OpenAITransport(AiohttpClient):
    """aiohttp client for ``/v1/completions`` or ``/v1/chat/completions`` at ``url``."""

    def __init__(self, url: str, endpoint: str = "completions") -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        super().__init__(url)
        self.endpoint = endpoint
        self.base = f"http://{url}"

    async def get_text(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
        """``GET path`` -> (status, body); connection failures raise :class:`ServerError`."""
        import aiohttp

        s = await self._sess()
        try:
            async with s.get(self.base + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status, await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServerError(f"{self.url}: cannot connect ({type(e).__name__}: {e})") from e

    async def declared_inputs(self, model: str) -> frozenset[str]:
        status, body = await self.get_text("/v1/models")
        not_openai = f"{self.url} does not answer as an OpenAI-compatible server (GET /v1/models"
        if status != 200:
            raise ServerError(f"{not_openai}: HTTP {status} {error_text(body)[:120]})")
        try:
            ids = [str(m["id"]) for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ServerError(f"{not_openai}: no model list in the answer)") from e
        if model not in ids:
            raise ServerError(f"{self.url}: model '{model}' is not served here "
                              f"(it serves: {', '.join(ids) or 'nothing'}); give --model")
        return frozenset({f"openai:{self.endpoint}"})

    async def generate(self, model: str, prompt: str, params: GenParams,
                       declared: frozenset[str] | None, timeout_s: float) -> RawResult:
        s = await self._sess()
        raw = RawResult(send_wall_s=time.time())
        body = openai_body(model, prompt, params, self.endpoint)
        return await self._guarded(self._post(s, body, raw, time.perf_counter()), raw,
                                   timeout_s)

    @staticmethod
    def _cut_message(raw: RawResult) -> str:
        return (f"stream cut: the server closed it before [DONE] after "
                f"{len(raw.chunk_times_s)} chunks")

    async def _post(self, s: Any, body: dict[str, Any], raw: RawResult, t0: float) -> None:
        async with s.post(self.base + ENDPOINTS[self.endpoint], json=body) as r:
            if r.status != 200:
                raw.error = f"HTTP {r.status}: {error_text(await r.text())}"
                return
            if not body["stream"]:
                data = json.loads(await r.text())
                t = time.perf_counter() - t0
                _whole_body(data, t, raw)
                return
            st = _Stream(raw)
            while line := await r.content.readline():
                text = line.decode("utf-8", "replace").strip()
                if text.startswith("data:") and not st.event(text[5:].strip(),
                                                             time.perf_counter() - t0):
                    break
            if raw.error:
                return
            if not st.done:
                raw.error = self._cut_message(raw)
                return
            raw.end_s = time.perf_counter() - t0


def _whole_body(data: Any, t: float, raw: RawResult) -> None:
    """A non-streamed answer: one chunk at its arrival carrying ``usage.completion_tokens``."""
    if not isinstance(data, dict) or "error" in data or data.get("object") == "error":
        raw.error = f"server error: {error_text(json.dumps(data))}"
        return
    n = _completion_tokens(data)
    raw.usage_tokens = n
    raw.acceptance = from_response(data)
    _take_counts(data, raw)
    raw.chunk_times_s.append(t)
    raw.chunk_texts.append(_choice_text(data))
    raw.chunk_num_tokens.append(n)
    raw.end_s = t
