"""Tokens per chunk: server counts first, then the tokenizer, then one per chunk."""

from __future__ import annotations

import pytest

from specserve.client.tokens import resolve_chunk_tokens


def test_server_counts_per_response() -> None:
    assert resolve_chunk_tokens([1, 3, 2], ["a", "bcd", "ef"]) == ([1, 3, 2], "server")


def test_server_counts_cumulative() -> None:
    assert resolve_chunk_tokens([1, 4, 6], ["a", "bcd", "ef"], "cumulative") == (
        [1, 3, 2], "server")


def test_tokenizer_fallback_counts_the_growing_text() -> None:
    words = lambda s: len(s.split())  # noqa: E731 - a stand-in tokenizer: one token per word
    counts, src = resolve_chunk_tokens([None, None], ["a b", " c d e"], count_text=words)
    assert (counts, src) == ([2, 3], "tokenizer")


def test_chunk_fallback_and_partial_server_counts() -> None:
    assert resolve_chunk_tokens([None, 2], ["x", "yz"]) == ([1, 1], "chunks")
    assert resolve_chunk_tokens([], []) == ([], "chunks")


def test_unknown_mode() -> None:
    with pytest.raises(ValueError):
        resolve_chunk_tokens([1], ["a"], "bogus")
