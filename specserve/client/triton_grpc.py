"""Transport to Triton over gRPC (thin I/O adapter): tritonclient's bi-directional
``ModelStreamInfer``.

Requests go by ``start_stream`` / ``async_stream_infer`` with
``enable_empty_final_response=True``, so the end of a request is the response flagged
``triton_final_response``. One stream carries one request at a time, which makes every error
attributable to its request; streams are pooled across requests, and a broken, timed-out or
cancelled one is closed, never reused (:meth:`_Slot.shut` says why only a request in flight is
cancelled: triton-inference-server/server PR #8078).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from specserve.client.transport import (
    ARRAY_OUTPUTS,
    INPUT_DTYPES,
    GenParams,
    RawResult,
    build_inputs,
)
from specserve.errors import ServerError

# Triton dtype -> the numpy dtype of an input tensor
_NP = {"BYTES": np.object_, "INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32,
       "UINT64": np.uint64}


def _scalar(arr: Any) -> Any:
    a = np.asarray(arr).reshape(-1)
    if a.size == 0:
        return None
    if a.dtype == np.object_ or a.dtype.kind == "S":
        return "".join(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                       for x in a)
    return a[0].item()


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
