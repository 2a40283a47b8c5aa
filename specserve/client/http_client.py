"""What the HTTP transports share: one aiohttp session, a request's failures, error bodies.

Triton's generate extension (:mod:`specserve.client.triton_http`), OpenAI-compatible servers
(:mod:`specserve.client.openai`) and ``specserve conform``'s OpenAI target
(:mod:`specserve.conform.targets`) build on :class:`AiohttpClient`: one session per transport,
opened at first use, and every failure of a request mapped onto its
:class:`~specserve.client.transport.RawResult` (timeout, refused connection, a body cut short,
a dropped server). :func:`error_text` reads the message of an error body in any of their
dialects (Triton's ``error``, OpenAI's ``error.message``, vLLM's ``message``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from specserve.client.transport import RawResult


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
