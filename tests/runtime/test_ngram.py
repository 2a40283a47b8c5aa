"""Prompt-lookup proposals (hand-made sequences with known answers)."""

from __future__ import annotations

from specserve.runtime.proposers import ngram_lookup


def test_longest_suffix_match_proposes_what_followed() -> None:
    seq = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert ngram_lookup(seq, 2) == [4, 5]  # "2 3" (n=2) matched, not just "3"


def test_prefers_most_recent_full_continuation() -> None:
    seq = [7, 1, 2, 8, 8, 1, 2, 6, 6, 0, 1, 2]
    assert ngram_lookup(seq, 2) == [6, 6]


def test_repeated_token_run_gives_full_k() -> None:
    assert ngram_lookup([4, 4, 4, 4, 4, 4, 4], 3) == [4, 4, 4]


def test_no_match_and_short_sequences() -> None:
    assert ngram_lookup([1, 2, 3], 4) == []
    assert ngram_lookup([5], 4) == []
    assert ngram_lookup([5, 6, 5], 4) == [6, 5]  # n=1 match; fewer than k tokens follow
