"""Transport to Triton over HTTP (thin I/O adapter): Triton's generate extension.

``POST /v2/models/M/generate_stream`` (server-sent events, one ``data: {json}`` event per
response) or ``POST /v2/models/M/generate`` (one JSON body); the model's declared inputs come
from ``GET /v2/models/M`` after ``GET /v2/health/ready``. Triton answers some failures with
HTTP 200 and an ``error`` field in the body, so bodies are checked.
"""

from __future__ import annotations

import json
import time
from typing import Any

from specserve.client.http_client import AiohttpClient, error_text
from specserve.client.transport import ARRAY_OUTPUTS, GenParams, RawResult, build_inputs
from specserve.errors import ServerError


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
