"""Transports to a Triton server serving the TensorRT-LLM ensemble (thin I/O adapters).

- gRPC: tritonclient's bi-directional ``ModelStreamInfer`` (``start_stream`` /
  ``async_stream_infer`` with ``enable_empty_final_response=True``, so the end of a request is
  the response flagged ``triton_final_response``). One stream carries one request at a time,
  which makes every error attributable to its request; streams are pooled across requests.
- HTTP: Triton's generate extension, ``POST /v2/models/M/generate_stream`` (server-sent events,
  one ``data: {json}`` event per response) and ``POST /v2/models/M/generate``. Triton answers
  some failures with HTTP 200 and an ``error`` field in the body, so bodies are checked.

Each call returns a :class:`RawResult`: arrival times of every response carrying data, its text,
its ``num_output_tokens`` when present, the last value of every perf output, and
``spec_stats_json`` when the reference backend sends it. Times are ``time.perf_counter()``
seconds after the send. Inputs a model does not declare are left out (see
:func:`build_inputs`), so the same client talks to TRT-LLM's ensemble and to simpler ones.

A model that takes token ids and no text (the ``tensorrt_llm`` model itself: ``input_ids``,
``request_output_len``, ``streaming``) is sent the prompt's ids (:attr:`GenParams.input_ids`,
tokenized by the client) and answers ``output_ids``, kept in :attr:`RawResult.output_ids`
(the caller decodes them). Predicted Outputs: ``prediction`` (text) goes to every model that
declares it; ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` come back on the
final response.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from specserve.client.acceptance import EngineAcceptance
from specserve.client.metrics import PERF_OUTPUTS
from specserve.errors import ServerError

# Ensemble inputs of the pinned release (TensorRT-LLM 1.2.1): name -> Triton dtype.
INPUT_DTYPES: dict[str, str] = {
    "text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32",
    "top_k": "INT32", "top_p": "FP32", "seed": "UINT64", "end_id": "INT32",
    "exclude_input_in_output": "BOOL", "return_perf_metrics": "BOOL",
    "return_num_output_tokens": "BOOL", "num_draft_tokens": "INT32",
    # sent only through GenParams.extra (specserve conform): stops, min_tokens, log-probs, n
    "stop_words": "BYTES", "min_tokens": "INT32", "return_log_probs": "BOOL",
    "num_return_sequences": "INT32", "return_num_input_tokens": "BOOL",
    "num_top_log_probs": "INT32",   # the reference tensorrt_llm model's own
    "prediction": "BYTES",          # Predicted Outputs (reference ensemble, BLS, tensorrt_llm)
    # the tensorrt_llm model's own names (token ids in and out)
    "input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32",
    "streaming": "BOOL", "runtime_top_k": "INT32", "runtime_top_p": "FP32",
    "guided_decoding_guide_type": "BYTES", "guided_decoding_guide": "BYTES",
}
# outputs kept whole (flattened, in order), not reduced to their first element: log-probs of
# each token (``output_log_probs`` [1, 1, T]) and, from the reference model, its top-k
# (``top_log_probs`` / ``top_log_prob_ids`` [1, 1, T, k])
ARRAY_OUTPUTS = ("output_log_probs", "top_log_probs", "top_log_prob_ids", "output_ids")
PREDICTION_OUTPUTS = ("accepted_prediction_tokens", "rejected_prediction_tokens")
_NP = {"BYTES": np.object_, "INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32,
       "UINT64": np.uint64}


@dataclass(frozen=True)
class GenParams:
    """Sampling parameters sent with every request (``None`` = not sent)."""

    max_tokens: int
    stream: bool = True
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    perf_outputs: bool = True   # ask for perf metrics and per-response token counts
    num_draft_tokens: int | None = None  # tensorrt_llm_bls only (left out where undeclared)
    ignore_eos: bool = False             # OpenAI protocol: generate exactly max_tokens
    # more ensemble inputs by name (names in INPUT_DTYPES), e.g. (("min_tokens", 4),)
    extra: tuple[tuple[str, Any], ...] = ()
    messages: tuple[tuple[str, str], ...] = ()  # OpenAI chat: the history, sent as messages
    prediction: str | None = None        # Predicted Outputs: the expected output's text
    # OpenAI protocol: how the prediction is sent: "nvext" (Dynamo's nvext.annotations
    # "prediction:<text>") or "openai" (OpenAI's top-level {"type": "content", ...})
    prediction_field: str = "nvext"
    input_ids: tuple[int, ...] | None = None  # the prompt's ids, for models that take ids


def takes_ids(declared: frozenset[str] | None) -> bool:
    """Whether a model with these inputs takes token ids and no text (``tensorrt_llm``)."""
    return declared is not None and "input_ids" in declared and "text_input" not in declared


def build_inputs(prompt: str, p: GenParams, declared: frozenset[str] | None) -> dict[str, Any]:
    """Input name -> value (scalars; the ids a tuple), limited to the names the model declares
    (all if ``None``)."""
    if takes_ids(declared):
        if p.input_ids is None:
            raise ValueError("this model takes token ids (input_ids): the client needs the "
                             "model's tokenizer (--tokenizer)")
        ids: dict[str, Any] = {
            "input_ids": tuple(p.input_ids), "input_lengths": len(p.input_ids),
            "request_output_len": p.max_tokens, "streaming": p.stream,
            "temperature": p.temperature, "runtime_top_k": p.top_k, "runtime_top_p": p.top_p,
            "seed": p.seed, "end_id": p.end_id, "exclude_input_in_output": True,
            "return_perf_metrics": p.perf_outputs or None,
            "return_num_output_tokens": p.perf_outputs or None,
            "num_draft_tokens": p.num_draft_tokens, "prediction": p.prediction, **dict(p.extra),
        }
        return {k: v for k, v in ids.items() if v is not None and k in (declared or ())}
    values: dict[str, Any] = {
        "text_input": prompt, "max_tokens": p.max_tokens, "stream": p.stream,
        "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "seed": p.seed,
        "end_id": p.end_id, "exclude_input_in_output": True,
        "return_perf_metrics": p.perf_outputs or None,
        "return_num_output_tokens": p.perf_outputs or None,
        "num_draft_tokens": p.num_draft_tokens, "prediction": p.prediction, **dict(p.extra),
    }
    return {k: v for k, v in values.items()
            if v is not None and (declared is None or k in declared)}


@dataclass
class RawResult:
    """What came back for one request (mutable while the request runs)."""

    send_wall_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)
    chunk_num_tokens: list[int | None] = field(default_factory=list)
    # which sequence each chunk belongs to (``sequence_index``; 0 without num_return_sequences)
    chunk_sequences: list[int] = field(default_factory=list)
    end_s: float | None = None
    server: dict[str, float | int] = field(default_factory=dict)
    spec_stats: dict[str, Any] | None = None
    usage_tokens: int | None = None  # OpenAI ``usage.completion_tokens`` (the request's total)
    acceptance: EngineAcceptance | None = None   # per request, as the engine reported it
    arrays: dict[str, list[Any]] = field(default_factory=dict)  # ARRAY_OUTPUTS, all responses
    # Predicted Outputs, as the server counted them (None: not returned)
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    error: str | None = None
    cancelled: bool = False
    connection_error: bool = False   # the server could not be reached at all
    replica: str | None = None       # pooled runs: the replica that served it (balance.py)

    @property
    def output_ids(self) -> list[int] | None:
        """The emitted token ids where the model answered ids (``None``: text only)."""
        ids = self.arrays.get("output_ids")
        return None if ids is None else [int(x) for x in ids]

    def add_response(self, t: float, outputs: dict[str, Any]) -> None:
        """Record one response's outputs (already decoded to Python values)."""
        for name in PERF_OUTPUTS:
            v = outputs.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.server[name] = v  # ints stay ints: *_time_ns need every digit
        if outputs.get("spec_stats_json"):
            try:
                self.spec_stats = json.loads(outputs["spec_stats_json"])
            except (TypeError, ValueError):
                self.spec_stats = None
        if isinstance(outputs.get("num_input_tokens"), int):
            self.server["num_input_tokens"] = outputs["num_input_tokens"]
        for name in ARRAY_OUTPUTS:
            if outputs.get(name) is not None:
                self.arrays.setdefault(name, []).extend(_flat(outputs[name]))
        for name in PREDICTION_OUTPUTS:
            v = outputs.get(name)
            if v is not None and not isinstance(v, bool):
                n_pred = int(_flat(v)[0]) if isinstance(v, (list, np.ndarray)) else int(v)
                setattr(self, name, n_pred)
        text = outputs.get("text_output")
        n = outputs.get("num_output_tokens")
        ids = outputs.get("output_ids")
        n_ids = len(_flat(ids)) if ids is not None else 0
        if text is None and n is None and not n_ids:
            return  # an empty (final) response
        if n is None and ids is not None:
            n = n_ids   # a model answering ids: its chunk's tokens
        self.chunk_times_s.append(t)
        self.chunk_texts.append(text or "")
        self.chunk_num_tokens.append(None if n is None else int(n))
        seq = outputs.get("sequence_index")
        self.chunk_sequences.append(int(seq) if isinstance(seq, int) else 0)


class Transport(Protocol):
    """One protocol to one server."""

    url: str

    async def declared_inputs(self, model: str) -> frozenset[str]: ...

    async def generate(self, model: str, prompt: str, params: GenParams,
                       declared: frozenset[str] | None, timeout_s: float) -> RawResult: ...

    async def close(self) -> None: ...


def _scalar(arr: Any) -> Any:
    a = np.asarray(arr).reshape(-1)
    if a.size == 0:
        return None
    if a.dtype == np.object_ or a.dtype.kind == "S":
        return "".join(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                       for x in a)
    return a[0].item()


def _flat(value: Any) -> list[Any]:
    """An output tensor (numpy array or nested JSON list) as a flat list of Python values."""
    return [x.item() if hasattr(x, "item") else x for x in np.asarray(value).reshape(-1)]


def _grpc_outputs(result: Any) -> tuple[dict[str, Any], bool]:
    resp = result.get_response()
    outputs = {o.name: (result.as_numpy(o.name) if o.name in ARRAY_OUTPUTS
                        else _scalar(result.as_numpy(o.name))) for o in resp.outputs}
    return outputs, _is_final(result)


class _Slot:
    """One gRPC client with one open stream, carrying one request at a time.

    The stream's callback (a tritonclient thread) stamps each response and keeps it; it wakes
    the event loop only once, at the final response or an error. Parsing waits until then, so
    nothing of ours runs between the responses of a request in flight (one loop wake-up per
    request instead of one per response)."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop) -> None:
        import tritonclient.grpc as grpcclient

        self.loop = loop
        self.t0 = 0.0
        self.items: list[tuple[float, Any, Any]] = []
        self.done: asyncio.Future[None] = loop.create_future()
        self.in_flight = False  # a request sent whose final response has not come
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=self._callback)

    def arm(self) -> None:
        """Before each request: nothing received yet, a fresh end-of-request future."""
        self.items = []
        self.done = self.loop.create_future()
        self.in_flight = True

    def _callback(self, result: Any, error: Any) -> None:
        t = time.perf_counter() - self.t0
        self.items.append((t, result, error))
        if error is not None or _is_final(result):
            self.in_flight = False
            self.loop.call_soon_threadsafe(self._finish, self.done)

    @staticmethod
    def _finish(done: asyncio.Future[None]) -> None:
        if not done.done():
            done.set_result(None)

    def shut(self) -> None:
        """Close the stream: cancel only a request still in flight. Cancelling a stream whose
        requests all ended can leak the server's stream state, and with it a reference to the
        model, in Triton's gRPC front end (tritonserver 2.51: ``stream_infer_handler.cc``, the
        race fixed upstream by triton-inference-server/server PR #8078), so a later SIGTERM
        waits its whole exit timeout on a model still live (docs/reliability.md)."""
        try:
            self.client.stop_stream(cancel_requests=self.in_flight)
        finally:
            self.client.close()


def _is_final(result: Any) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and bool(
        params["triton_final_response"].bool_param)


class GrpcTransport:
    """tritonclient gRPC streaming; one open stream per in-flight request, streams pooled."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._free: list[_Slot] = []

    async def declared_inputs(self, model: str) -> frozenset[str]:
        def probe() -> frozenset[str]:
            import tritonclient.grpc as grpcclient
            from tritonclient.utils import InferenceServerException

            client = grpcclient.InferenceServerClient(self.url)
            try:
                if not client.is_server_ready():
                    raise ServerError(f"{self.url}: server is not ready")
                if not client.is_model_ready(model):
                    raise ServerError(f"{self.url}: model '{model}' is not ready")
                meta = client.get_model_metadata(model)
                return frozenset(i.name for i in meta.inputs)
            except InferenceServerException as e:
                raise ServerError(f"{self.url} (gRPC): {e.message()}") from e
            finally:
                client.close()
        return await asyncio.to_thread(probe)

    @staticmethod
    def _make_inputs(values: dict[str, Any]) -> list[Any]:
        import tritonclient.grpc as grpcclient

        out = []
        for name, v in values.items():
            dtype = INPUT_DTYPES[name]
            row = list(v) if isinstance(v, tuple) else [v.encode() if dtype == "BYTES" else v]
            arr = np.array([row], dtype=_NP[dtype])
            inp = grpcclient.InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            out.append(inp)
        return out

    async def generate(self, model: str, prompt: str, params: GenParams,
                       declared: frozenset[str] | None, timeout_s: float) -> RawResult:
        raw = RawResult(send_wall_s=time.time())
        inputs = self._make_inputs(build_inputs(prompt, params, declared))
        slot: _Slot | None = None
        healthy = False
        try:
            slot = self._free.pop() if self._free else _Slot(self.url, asyncio.get_running_loop())
            slot.arm()
            raw.send_wall_s = time.time()
            slot.t0 = time.perf_counter()
            slot.client.async_stream_infer(model, inputs, enable_empty_final_response=True)
            await asyncio.wait_for(slot.done, timeout_s)
            healthy = self._consume(slot.items, raw)
        except TimeoutError:
            self._consume(list(slot.items) if slot else [], raw)  # what did arrive
            raw.error = f"timeout: no final response after {timeout_s:g} s"
        except asyncio.CancelledError:
            self._consume(list(slot.items) if slot else [], raw)
            raw.cancelled = True
            raise
        except Exception as e:  # noqa: BLE001 - every failure becomes the record's error text
            raw.error = f"{type(e).__name__}: {_message(e)}"
            raw.connection_error = "unavailable" in raw.error.lower()
        finally:
            if slot is not None:
                if healthy:
                    self._free.append(slot)
                else:  # a broken, timed-out or cancelled stream is never reused
                    await asyncio.to_thread(slot.shut)
        return raw

    @staticmethod
    def _consume(items: list[tuple[float, Any, Any]], raw: RawResult) -> bool:
        """Parse the responses of one request into ``raw``; True when the stream ended with a
        final response and stays usable."""
        for t, result, error in items:
            if error is not None:
                msg = _message(error)
                raw.error = msg
                raw.end_s = None
                raw.connection_error = "unavailable" in msg.lower() or "connect" in msg.lower()
                return False
            outputs, final = _grpc_outputs(result)
            raw.add_response(t, outputs)
            if final:
                raw.end_s = t
                return True
        return False

    async def close(self) -> None:
        while self._free:
            await asyncio.to_thread(self._free.pop().shut)


def _message(e: BaseException) -> str:
    msg = e.message() if hasattr(e, "message") and callable(e.message) else str(e)
    return " ".join(str(msg).split()) or type(e).__name__


class AiohttpClient:
    """What the HTTP transports share: one aiohttp session (opened at first use) and the
    mapping of a request's failures onto its :class:`RawResult`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._session: Any = None

    async def _sess(self) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _guarded(self, post: Any, raw: RawResult, timeout_s: float) -> RawResult:
        """Await ``post`` (which fills ``raw``) within ``timeout_s``; every failure becomes
        ``raw.error`` (a cancellation is recorded and re-raised)."""
        import aiohttp

        try:
            await asyncio.wait_for(post, timeout_s)
        except TimeoutError:
            raw.error = f"timeout: no complete answer after {timeout_s:g} s"
        except asyncio.CancelledError:
            raw.cancelled = True
            raise
        except aiohttp.ClientConnectorError as e:
            raw.error, raw.connection_error = f"cannot connect: {e}", True
        except aiohttp.ClientPayloadError:  # the connection closed inside a chunked body
            raw.error = self._cut_message(raw)
        except (aiohttp.ClientError, ValueError) as e:
            raw.error = f"{type(e).__name__}: {e}"
            raw.connection_error = isinstance(e, aiohttp.ServerDisconnectedError)
        if raw.error:
            raw.end_s = None
        return raw

    @staticmethod
    def _cut_message(raw: RawResult) -> str:
        return f"stream cut: the connection closed after {len(raw.chunk_times_s)} chunks"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpTransport(AiohttpClient):
    """Triton's HTTP generate extension: ``generate_stream`` (SSE) or ``generate``."""

    async def declared_inputs(self, model: str) -> frozenset[str]:
        import aiohttp

        s = await self._sess()
        base = f"http://{self.url}/v2"
        try:
            async with s.get(f"{base}/health/ready") as r:
                if r.status != 200:
                    raise ServerError(f"{self.url}: server is not ready (HTTP {r.status})")
            async with s.get(f"{base}/models/{model}") as r:
                body = await r.text()
                if r.status != 200:
                    raise ServerError(f"{self.url}: model '{model}': HTTP {r.status} {body[:200]}")
                return frozenset(i["name"] for i in json.loads(body).get("inputs", []))
        except aiohttp.ClientError as e:
            raise ServerError(f"{self.url} (HTTP): {e}") from e

    async def generate(self, model: str, prompt: str, params: GenParams,
                       declared: frozenset[str] | None, timeout_s: float) -> RawResult:
        s = await self._sess()
        endpoint = "generate_stream" if params.stream else "generate"
        body = http_body(prompt, params, declared)
        raw = RawResult(send_wall_s=time.time())
        t0 = time.perf_counter()
        url = f"http://{self.url}/v2/models/{model}/{endpoint}"
        return await self._guarded(self._post(s, url, body, raw, t0), raw, timeout_s)

    @staticmethod
    async def _post(s: Any, url: str, body: dict[str, Any], raw: RawResult, t0: float) -> None:
        async with s.post(url, json=body) as r:
            if r.status != 200:
                raw.error = f"HTTP {r.status}: {error_text(await r.text())}"
                return
            if r.content_type == "text/event-stream":
                while line := await r.content.readline():
                    text = line.decode("utf-8", "replace").strip()
                    if text.startswith("data:"):
                        if not _http_event(text[5:].strip(), time.perf_counter() - t0, raw):
                            return
            else:
                _http_event(await r.text(), time.perf_counter() - t0, raw)
                if raw.error:
                    return
            raw.end_s = time.perf_counter() - t0


def http_body(prompt: str, p: GenParams, declared: frozenset[str] | None) -> dict[str, Any]:
    """The JSON body of a generate request (:func:`build_inputs`; ids as a list)."""
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in build_inputs(prompt, p, declared).items()}


def error_text(body: str) -> str:
    """The error message of a JSON or SSE error body (Triton's ``error``, OpenAI's
    ``error.message``, vLLM's ``message``), else the body itself (one line)."""
    text = body.strip().removeprefix("data:").strip()
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            err = data.get("error", data if data.get("object") == "error" else None)
            if isinstance(err, dict):
                err = err.get("message", err)
            if err is not None:
                text = str(err)
    except ValueError:
        pass
    return " ".join(text.split())[:500]


def _http_event(payload: str, t: float, raw: RawResult) -> bool:
    """Parse one JSON body/event into ``raw``; False (and ``raw.error``) on an error body."""
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError(f"unexpected JSON body: {payload[:200]}")
    if "error" in data:
        raw.error = " ".join(str(data["error"]).split())
        return False
    outputs = {k: (v if k in ARRAY_OUTPUTS else v[0] if isinstance(v, list) and len(v) == 1
                   else v) for k, v in data.items()}
    if isinstance(outputs.get("text_output"), list):
        outputs["text_output"] = "".join(map(str, outputs["text_output"]))
    raw.add_response(t, outputs)
    return True
