"""Prometheus counters of the servers under test, scraped around the measured phase (I/O).

vLLM and SGLang expose ``GET /metrics``; ``trtllm-serve`` exposes ``GET /prometheus/metrics``.
The difference of two scrapes of one server gives the run's acceptance
(:func:`specserve.client.acceptance.counter_acceptance`), whichever engine it is. Counters are
updated as outputs are processed, so the closing scrape waits until two reads agree.
``trtllm-serve``'s ``GET /perf_metrics`` (per finished request, drained on read) is read before
the phase (to drain it) and after, where a server has it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

from specserve.client.acceptance import Samples, parse_prometheus
from specserve.errors import ServerError, SpecserveError

METRICS_PATHS = ("/metrics", "/prometheus/metrics")
_SPEC_PREFIXES = ("vllm:spec_decode_", "trtllm_spec_decode_", "sglang:spec_accept")


@runtime_checkable
class TextGetter(Protocol):
    """A transport that can ``GET`` a path of its server."""

    url: str

    async def get_text(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]: ...


async def scrape(tr: TextGetter) -> Samples | None:
    """The samples of the first metrics path that answers with speculative series, else the
    first that answers at all; ``None`` if no path answers."""
    first: Samples | None = None
    for path in METRICS_PATHS:
        try:
            status, body = await tr.get_text(path, timeout_s=5.0)
        except ServerError:
            return first
        if status != 200:
            continue
        samples = parse_prometheus(body)
        if any(name.startswith(_SPEC_PREFIXES) for name, _ in samples):
            return samples
        first = samples if first is None else first
    return first


async def scrape_settled(tr: TextGetter, tries: int = 10, gap_s: float = 0.2) -> Samples | None:
    """Scrape until two consecutive reads agree on the speculative series (or ``tries`` ends)."""
    prev = await scrape(tr)
    for _ in range(tries):
        await asyncio.sleep(gap_s)
        cur = await scrape(tr)
        if cur is None or _spec_part(cur) == _spec_part(prev):
            return cur
        prev = cur
    return prev


class MetricsEndpoint:
    """A server's metrics endpoint named by URL alone (``--metrics-url``): each worker behind a
    frontend that does not pass its counters on (NVIDIA Dynamo). ``GET`` of the
    URL's own path when it has one, else of ``path``."""

    def __init__(self, url: str) -> None:
        u = urlparse(url if "://" in url else f"http://{url}")
        if u.scheme != "http" or not u.hostname or not u.port:
            raise SpecserveError(f"--metrics-url: '{url}' is not http://HOST:PORT[/path]")
        self.url = f"http://{u.hostname}:{u.port}"
        self.path = u.path if u.path not in ("", "/") else None

    async def get_text(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
        import aiohttp

        try:
            async with aiohttp.ClientSession() as s, s.get(
                    self.url + (self.path or path),
                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status, await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServerError(f"{self.url}: cannot read metrics ({type(e).__name__}: {e})") from e


def _spec_part(s: Samples | None) -> Samples:
    return {k: v for k, v in (s or {}).items() if k[0].startswith(_SPEC_PREFIXES)}


async def perf_entries(tr: TextGetter) -> list[Any] | None:
    """``GET /perf_metrics`` (``trtllm-serve``): the per-request entries it holds, or ``None``
    where the server has no such endpoint. Reading it drains it."""
    try:
        status, body = await tr.get_text("/perf_metrics", timeout_s=5.0)
        data = json.loads(body) if status == 200 else None
    except (ServerError, ValueError):
        return None
    return data if isinstance(data, list) else None
