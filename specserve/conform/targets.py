"""Target adapters: a :class:`~specserve.conform.probe.Probe` onto one protocol, the answer back
as a :class:`~specserve.conform.probe.Reply`. Thin: the sessions, time-outs and error bodies
are ``specserve.client``'s (``AiohttpClient``, ``error_text``; the Triton transports).

- ``openai``: ``POST /v1/completions`` or ``/v1/chat/completions`` (OpenAI API reference,
  "Completions" / "Chat Completions"; streamed as server-sent events ending in ``[DONE]`` with
  ``stream_options.include_usage``). Fields outside OpenAI's API are vLLM's (``min_tokens``,
  ``ignore_eos``, ``stop_token_ids``, ``structured_outputs.regex``: ``vllm/entrypoints/openai/
  protocol.py``, ``vllm/sampling_params.py`` ``StructuredOutputsParams``); ``--extra-body``
  adds any others (``{"return_token_ids": true}`` gives vLLM's per-choice ``token_ids``).
- ``grpc`` / ``http``: the Triton ensemble's inputs (TensorRT-LLM 1.2.1's, our
  ``specserve/triton/templates/ensemble/config.pbtxt``) through ``GrpcTransport`` /
  ``HttpTransport``: ``stop`` -> ``stop_words``, ``stop_token_ids`` [t] -> ``end_id`` t,
  ``ignore_eos`` -> ``end_id`` -1, ``n`` -> ``num_return_sequences``, ``logprobs`` ->
  ``return_log_probs`` (answer: ``output_log_probs``), top-k ``logprobs`` k > 0 -> the
  reference model's ``num_top_log_probs`` (answer: ``top_log_probs`` /
  ``top_log_prob_ids``; not expressible where the model does not declare it, as the ensemble
  does not). Chat, structured output and finish reasons have no tensor there:
  :class:`NotExpressible`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

from specserve.client.http_client import AiohttpClient, error_text
from specserve.client.openai import ENDPOINTS
from specserve.client.transport import GenParams, RawResult
from specserve.client.triton_grpc import GrpcTransport
from specserve.client.triton_http import HttpTransport
from specserve.conform.probe import (
    Choice,
    NotExpressible,
    Probe,
    Reply,
    TokenLogprob,
    failed,
    is_triton_refusal,
)
from specserve.errors import SpecserveError


@dataclass(frozen=True)
class ServerInfo:
    """What a target says about itself (for the matrix rows)."""

    engine: str
    version: str
    context_limit: int | None = None


class Target(Protocol):
    """One model on one server, spoken to in probes."""

    url: str
    model: str
    protocol: str

    async def info(self) -> ServerInfo: ...

    async def send(self, probe: Probe, timeout_s: float) -> Reply: ...

    async def close(self) -> None: ...


def openai_request(model: str, p: Probe, extra_body: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of ``p`` (fields left unset are not sent)."""
    body: dict[str, Any] = {"model": model, "max_tokens": p.max_tokens, "stream": p.stream}
    if p.chat:
        body["messages"] = [{"role": "user", "content": p.prompt}]
    else:
        body["prompt"] = p.prompt
    if p.stream:
        body["stream_options"] = {"include_usage": True}
    fields: dict[str, Any] = {
        "temperature": p.temperature, "top_k": p.top_k, "seed": p.seed, "n": p.n,
        "stop": list(p.stop) or None, "stop_token_ids": list(p.stop_token_ids) or None,
        "min_tokens": p.min_tokens, "ignore_eos": True if p.ignore_eos else None,
        "response_format": p.response_format,
        "structured_outputs": {"regex": p.regex} if p.regex is not None else None,
    }
    if p.logprobs is not None:
        fields.update({"logprobs": True, "top_logprobs": p.logprobs} if p.chat
                      else {"logprobs": p.logprobs})
    body.update({k: v for k, v in fields.items() if v is not None})
    body.update(extra_body)
    return body


def _logprobs(lp: Any, chat: bool) -> list[TokenLogprob] | None:
    """OpenAI logprobs of one choice (or chunk) -> per-token entries; None when absent."""
    if not isinstance(lp, dict):
        return None
    if chat:
        return [TokenLogprob(str(e.get("token")), e.get("logprob"),
                             {str(t.get("token")): t.get("logprob")
                              for t in e.get("top_logprobs") or []}
                             if e.get("top_logprobs") is not None else None)
                for e in lp.get("content") or []]
    tokens = lp.get("tokens") or []
    lps = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    return [TokenLogprob(str(t), lps[i] if i < len(lps) else None,
                         dict(tops[i]) if i < len(tops) and isinstance(tops[i], dict) else None)
            for i, t in enumerate(tokens)]


def _piece(c: dict[str, Any], chat: bool) -> str:
    if chat:
        msg = c.get("delta") or c.get("message") or {}
        return str(msg.get("content") or "") if isinstance(msg, dict) else ""
    return str(c.get("text") or "")


def _merge(choices: dict[int, Choice], c: dict[str, Any], chat: bool, stream: bool) -> None:
    """Fold one ``choices[i]`` object (a whole answer, or one streamed chunk) into ``choices``."""
    if not isinstance(c, dict) or not isinstance(c.get("index", 0), int):
        raise ValueError(f"choice is not an object with an integer index: {str(c)[:200]}")
    ch = choices.setdefault(int(c.get("index", 0)), Choice(index=int(c.get("index", 0))))
    text = _piece(c, chat)
    ch.text += text
    if stream and text:
        ch.chunks.append(text)
        ids = c.get("token_ids")
        ch.chunk_tokens.append(len(ids) if isinstance(ids, list) else None)
    if isinstance(c.get("token_ids"), list):
        ch.token_ids = (ch.token_ids or []) + [int(t) for t in c["token_ids"]]
    lp = _logprobs(c.get("logprobs"), chat)
    if lp is not None:
        ch.logprobs = (ch.logprobs or []) + lp
    if c.get("finish_reason") is not None:
        ch.finish_reason = str(c["finish_reason"])


def parse_openai(wire: dict[str, Any], events: list[Any], chat: bool, stream: bool) -> Reply:
    """One reply from the answer's JSON object(s): the body, or every streamed chunk."""
    reply = Reply(wire=wire, status=200)
    choices: dict[int, Choice] = {}
    for data in events:
        if not isinstance(data, dict):
            return failed(wire, f"wrong shape: a JSON value that is not an object: "
                          f"{str(data)[:200]}", transport_failure=True)
        if "error" in data or data.get("object") == "error":
            return failed(wire, f"error in the answer: {error_text(json.dumps(data))}",
                          status=_error_code(data))
        if "choices" not in data:
            return failed(wire, f"wrong shape: no 'choices' in {json.dumps(data)[:200]}",
                          transport_failure=True)
        for c in data["choices"] or []:
            _merge(choices, c, chat, stream)
        usage = data.get("usage")
        if isinstance(usage, dict):
            reply.prompt_tokens = usage.get("prompt_tokens", reply.prompt_tokens)
            reply.completion_tokens = usage.get("completion_tokens", reply.completion_tokens)
    reply.choices = [choices[i] for i in sorted(choices)]
    if not reply.choices:
        return failed(wire, "wrong shape: an answer without choices", transport_failure=True)
    return reply


def _error_code(data: dict[str, Any]) -> int | None:
    err = data.get("error", data)
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, int) else None


class OpenAITarget(AiohttpClient):
    """An OpenAI-compatible server (vLLM, SGLang, ``trtllm-serve``, Dynamo) at ``host:port``."""

    protocol = "openai"

    def __init__(self, url: str, model: str, extra_body: dict[str, Any] | None = None) -> None:
        super().__init__(url)
        self.model = model
        self.extra_body = dict(extra_body or {})
        self.base = f"http://{url}"

    async def _get_json(self, path: str) -> Any:
        import aiohttp

        s = await self._sess()
        try:
            async with s.get(self.base + path, timeout=aiohttp.ClientTimeout(total=10)) as r:
                return json.loads(await r.text()) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def info(self) -> ServerInfo:
        """What the server says about itself; SpecserveError when it does not answer as an
        OpenAI server or does not serve the model."""
        models = await self._get_json("/v1/models")
        if not isinstance(models, dict) or not isinstance(models.get("data"), list):
            raise SpecserveError(f"{self.url} does not answer GET /v1/models as an OpenAI "
                                 "server")
        listed = models["data"]
        if self.model not in [m.get("id") for m in listed if isinstance(m, dict)]:
            raise SpecserveError(f"{self.url}: model '{self.model}' is not served here; give "
                                 "--model")
        version = await self._get_json("/version")
        entry: dict[str, Any] = next((m for m in listed if m.get("id") == self.model), {})
        engine = str(entry.get("owned_by") or "openai")
        ver = str(version.get("version")) if isinstance(version, dict) else "unknown"
        limit = entry.get("max_model_len")
        return ServerInfo(engine, ver, limit if isinstance(limit, int) else None)

    async def send(self, probe: Probe, timeout_s: float) -> Reply:
        wire = openai_request(self.model, probe, self.extra_body)
        holder: list[Reply] = []
        raw = RawResult(send_wall_s=time.time())   # carries transport failures (AiohttpClient)
        await self._guarded(self._post(wire, probe, holder), raw, timeout_s)
        if raw.error:
            return failed(wire, raw.error, transport_failure=True)
        return holder[0]

    async def _post(self, wire: dict[str, Any], probe: Probe, holder: list[Reply]) -> None:
        s = await self._sess()
        path = ENDPOINTS["chat" if probe.chat else "completions"]
        async with s.post(self.base + path, json=wire) as r:
            body_text = "" if r.status == 200 and probe.stream else await r.text()
            if r.status != 200:
                holder.append(failed(wire, f"HTTP {r.status}: {error_text(body_text)}",
                                     status=r.status))
                return
            if not probe.stream:
                holder.append(parse_openai(wire, [json.loads(body_text)], probe.chat, False))
                return
            events: list[Any] = []
            done = False
            while line := await r.content.readline():
                text = line.decode("utf-8").strip()
                if not text.startswith("data:"):
                    continue
                payload = text[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                events.append(json.loads(payload))
            reply = parse_openai(wire, events, probe.chat, True)
            if done or not reply.ok:
                holder.append(reply)
            else:
                holder.append(failed(wire, "stream ended without [DONE]", transport_failure=True))


def triton_inputs(p: Probe, declared: frozenset[str]) -> dict[str, Any]:
    """The ensemble inputs beyond ``GenParams``' own for ``p``; :class:`NotExpressible` for what
    the Triton generate contract cannot say."""
    if p.chat:
        raise NotExpressible("the Triton ensemble takes text_input only: no chat messages")
    guide = triton_guide(p)
    if len(p.stop) > 1:
        raise NotExpressible("one stop word per request through stop_words here")
    if len(p.stop_token_ids) > 1 or (p.stop_token_ids and p.ignore_eos):
        raise NotExpressible("stop token ids map onto end_id: one id, and not with ignore_eos")
    extra: dict[str, Any] = {
        "guided_decoding_guide_type": None if guide is None else guide[0],
        "guided_decoding_guide": None if guide is None else guide[1],
        "stop_words": p.stop[0] if p.stop else None, "min_tokens": p.min_tokens,
        "num_return_sequences": p.n,
        "return_log_probs": True if p.logprobs is not None else None,
        "num_top_log_probs": p.logprobs or None,   # the reference model's own input
        "return_num_input_tokens": True,
    }
    extra = {k: v for k, v in extra.items() if v is not None}
    missing = sorted(k for k in extra if k not in declared and k != "return_num_input_tokens")
    if missing:
        raise NotExpressible(f"the model declares no input {missing[0]!r}")
    return {k: v for k, v in extra.items() if k in declared}


def triton_guide(p: Probe) -> tuple[str, str | None] | None:
    """OpenAI ``response_format`` / a regex as TensorRT-LLM's guided-decoding inputs
    (``guided_decoding_guide_type`` ``json_schema`` / ``regex`` and the guide; tensorrtllm_backend
    ``tensorrt_llm/1/model.py`` ``get_guided_decoding_params_from_request``). ``json_object`` is
    the schema ``{"type": "object"}``, as vLLM and Dynamo send it: the guide type ``json`` allows
    any JSON value. None when the probe asks for no structure."""
    if p.regex is not None:
        return "regex", p.regex
    fmt = p.response_format
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "json_object":  # an object; TensorRT-LLM's "json" is any JSON value ('[1]')
        return "json_schema", '{"type": "object"}'
    if kind == "json_schema":
        return "json_schema", json.dumps(fmt["json_schema"]["schema"])
    raise NotExpressible(f"response_format type {kind!r} has no TensorRT-LLM guide type")


def triton_logprobs(arrays: dict[str, list[Any]], k: int) -> list[TokenLogprob] | None:
    """``output_log_probs`` (and with ``k`` > 0 ``top_log_probs`` / ``top_log_prob_ids``, k per
    token, most likely first) as per-token entries; None when the answer carries none. The
    Triton answer names no token per log-prob: entries are named by position (``#i``), the
    top-k alternatives by token id."""
    lps = arrays.get("output_log_probs")
    if not lps:
        return None
    vals, ids = arrays.get("top_log_probs") or [], arrays.get("top_log_prob_ids") or []
    out = []
    for i, lp in enumerate(lps):
        top = None
        if k > 0 and len(vals) >= (i + 1) * k and len(ids) >= (i + 1) * k:
            top = {str(int(t)): float(v) for t, v in
                   zip(ids[i * k:(i + 1) * k], vals[i * k:(i + 1) * k], strict=True)}
        out.append(TokenLogprob(f"#{i}", None if lp is None else float(lp), top))
    return out


def triton_choices(raw: RawResult, probe: Probe) -> list[Choice]:
    """One :class:`Choice` per ``sequence_index`` seen (``num_return_sequences`` > 1: each
    response holds one sequence's tokens, TensorRT-LLM's layout), in index order; its text the
    sequence's chunks joined, and when streamed its pieces. One choice when there is no index."""
    by_seq: dict[int, list[tuple[str, int | None]]] = {}
    seqs = raw.chunk_sequences if len(raw.chunk_sequences) == len(raw.chunk_texts) else \
        [0] * len(raw.chunk_texts)
    for c, n, i in zip(raw.chunk_texts, raw.chunk_num_tokens, seqs, strict=True):
        by_seq.setdefault(i, []).append((c, n))
    out = []
    for i in sorted(by_seq) or [0]:
        chunks = by_seq.get(i, [])
        pieces = [(c, n) for c, n in chunks if c] if probe.stream else []
        out.append(Choice(index=i, text="".join(c for c, _ in chunks),
                          chunks=[c for c, _ in pieces], chunk_tokens=[n for _, n in pieces]))
    return out


class TritonTarget:
    """The Triton ensemble (or BLS) over gRPC streaming or the HTTP generate extension."""

    def __init__(self, url: str, model: str, protocol: str,
                 num_draft_tokens: int | None = None) -> None:
        if protocol not in ("grpc", "http"):
            raise ValueError(f"unknown Triton protocol {protocol!r}")
        self.url, self.model, self.protocol = url, model, protocol
        self.num_draft_tokens = num_draft_tokens   # tensorrt_llm_bls: K of its loop
        self.transport: GrpcTransport | HttpTransport = (
            GrpcTransport(url) if protocol == "grpc" else HttpTransport(url))
        self._declared: frozenset[str] | None = None

    async def declared(self) -> frozenset[str]:
        if self._declared is None:
            self._declared = await self.transport.declared_inputs(self.model)
        return self._declared

    async def info(self) -> ServerInfo:
        await self.declared()
        version = "unknown"
        if isinstance(self.transport, HttpTransport):
            s = await self.transport._sess()
            async with s.get(f"http://{self.url}/v2") as r:
                version = str(json.loads(await r.text()).get("version", "unknown"))
        else:
            import asyncio

            version = await asyncio.to_thread(self._grpc_version)
        return ServerInfo("triton", version)

    def _grpc_version(self) -> str:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.url)
        try:
            return str(client.get_server_metadata().version)
        finally:
            client.close()

    async def send(self, probe: Probe, timeout_s: float) -> Reply:
        declared = await self.declared()
        extra = triton_inputs(probe, declared)
        params = GenParams(
            max_tokens=probe.max_tokens, stream=probe.stream, temperature=probe.temperature,
            top_k=probe.top_k, seed=probe.seed, perf_outputs=True, extra=tuple(extra.items()),
            num_draft_tokens=self.num_draft_tokens,
            end_id=-1 if probe.ignore_eos else (probe.stop_token_ids[0]
                                                 if probe.stop_token_ids else None))
        from specserve.client.transport import build_inputs

        wire = {"model": self.model, "protocol": self.protocol,
                "inputs": build_inputs(probe.prompt, params, declared)}
        raw = await self.transport.generate(self.model, probe.prompt, params, declared, timeout_s)
        if raw.error:
            m = re.match(r"HTTP (\d+):", raw.error)
            status = int(m.group(1)) if m else None
            return failed(wire, raw.error, status=status,
                          transport_failure=raw.connection_error
                          or raw.error.startswith(("timeout", "stream cut")),
                          refusal=None if status is not None else is_triton_refusal(raw.error))
        counts = [n for n in raw.chunk_num_tokens if n is not None]
        n_in = raw.server.get("num_input_tokens")
        choices = triton_choices(raw, probe)
        if probe.logprobs is not None and len(choices) == 1:
            choices[0].logprobs = triton_logprobs(raw.arrays, probe.logprobs)
        return Reply(wire=wire, choices=choices,
                     completion_tokens=sum(counts) if counts else None,
                     prompt_tokens=int(n_in) if n_in is not None else None)

    async def close(self) -> None:
        await self.transport.close()


def make_target(protocol: str, url: str, model: str,
                extra_body: dict[str, Any] | None = None,
                num_draft_tokens: int | None = None) -> Target:
    """The adapter for ``protocol`` (openai | grpc | http)."""
    if protocol == "openai":
        return OpenAITarget(url, model, extra_body)
    return TritonTarget(url, model, protocol, num_draft_tokens)
