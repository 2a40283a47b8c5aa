"""The prefix cache's block events as NVIDIA Dynamo KV events, so that Dynamo's
KV-aware router (``--router-mode kv``) sends a request to the worker that holds its prefix.

Our events are vLLM's shape (:mod:`specserve.runtime.kv_pool`: ``BlockStored`` with the blocks'
hashes, the parent's hash, their tokens and the block size; ``BlockRemoved`` with hashes). Dynamo
1.6.1's worker-side publisher is ``dynamo.llm.KvEventPublisher(endpoint, kv_block_size=...)``
with ``publish_stored(token_ids, num_block_tokens, block_hashes, parent_hash)`` and
``publish_removed(block_hashes)``, hashes as signed 64-bit integers (``dynamo/_core.pyi``; its
own TensorRT-LLM and SGLang publishers, ``dynamo/trtllm/publisher.py``, call it the same way).
The router hashes a stored block's tokens itself, as it hashes an incoming request's, so the
worker registers ``kv_cache_block_size`` equal to the pool's block size; our hashes only name
blocks (what ``publish_removed`` refers to). Events come on the serving loop's thread; a failed
publish is counted and logged once, never raised into the step.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from specserve.runtime.kv_pool import BlockStored, KVEvent

_TWO_64, _TWO_63 = 1 << 64, 1 << 63


def signed64(h: int) -> int:
    """An unsigned 64-bit block hash as the signed 64-bit integer Dynamo's publisher takes."""
    h %= _TWO_64
    return h - _TWO_64 if h >= _TWO_63 else h


def publisher_call(e: KVEvent) -> tuple[str, dict[str, Any]]:
    """The ``KvEventPublisher`` method and keyword arguments of one event (pure)."""
    if isinstance(e, BlockStored):
        return "publish_stored", {
            "token_ids": [int(t) for t in e.token_ids],
            "num_block_tokens": [e.block_size] * len(e.block_hashes),
            "block_hashes": [signed64(h) for h in e.block_hashes],
            "parent_hash": None if e.parent_block_hash is None else
            signed64(e.parent_block_hash)}
    return "publish_removed", {"block_hashes": [signed64(h) for h in e.block_hashes]}


class Publisher(Protocol):
    """What of ``dynamo.llm.KvEventPublisher`` the relay calls."""

    def publish_stored(self, token_ids: list[int], num_block_tokens: list[int],
                       block_hashes: list[int], parent_hash: int | None = None) -> None: ...

    def publish_removed(self, block_hashes: list[int]) -> None: ...


class KvEventRelay:
    """The scheduler's ``on_event``: each event to ``publisher`` once it is set (the endpoint
    exists only after the engine is loaded; no block is stored before serving starts)."""

    def __init__(self) -> None:
        self.publisher: Publisher | None = None
        self.sent = self.failed = 0

    def __call__(self, e: KVEvent) -> None:
        if self.publisher is None:
            return
        method, kwargs = publisher_call(e)
        try:
            getattr(self.publisher, method)(**kwargs)
            self.sent += 1
        except Exception as err:  # routing hints: serving goes on without them
            self.failed += 1
            if self.failed == 1:
                print(f"specserve: a KV event could not be published ({err}); the router "
                      "may route without this worker's cache", file=sys.stderr, flush=True)
