"""Streamed text is exact: ``serving.detok`` (also the BLS's ``lib/detok.py``) against the tiny
byte-level BPE (bytes only) and one trained on Chinese, emoji and accented text (multi-byte
tokens, whole characters and pieces of characters). Hypothesis runs derandomized."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserve.serving.detok import (
    REPLACEMENT,
    IncrementalDetokenizer,
    TokenHoldBack,
)
from tests.helpers.tiny import MULTILINGUAL_TEXT, byte_level_char, make_tokenizer

Decode = Callable[[list[int]], str]
PROPERTY = settings(derandomize=True, max_examples=300, deadline=None, database=None)
KINDS = ("tiny", "multilingual")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tokenizers import Tokenizer

    root = Path(tmp_path_factory.mktemp("detok"))
    return {
        "tiny": Tokenizer.from_file(str(make_tokenizer(root / "tiny") / "tokenizer.json")),
        "multilingual": Tokenizer.from_file(str(make_tokenizer(
            root / "ml", vocab_size=400, text=MULTILINGUAL_TEXT) / "tokenizer.json")),
    }


def decoder(tok: Any, skip_special: bool = True) -> Decode:
    """The postprocessing's decode (``tokenizers``, special tokens skipped by default)."""
    return lambda ids: str(tok.decode(ids, skip_special_tokens=skip_special))


def chunked(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted({c % (len(ids) + 1) for c in cuts}), len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def streamed(decode: Decode, chunks: list[list[int]], many: bool = False) -> list[str]:
    d = IncrementalDetokenizer(decode, (lambda lists: [decode(x) for x in lists]) if many
                               else None)
    return [d.push(c) for c in chunks] + [d.flush()]


def held_back(decode: Decode, chunks: list[list[int]]) -> list[list[int]]:
    h = TokenHoldBack(decode)
    return [h.push(c) for c in chunks] + [h.flush()]


def byte_ids(tok: Any, data: bytes) -> list[int]:
    """One single-byte token per byte."""
    ids = [tok.token_to_id(byte_level_char(b)) for b in data]
    assert None not in ids
    return ids


def test_the_tokenizers_have_tokens_that_end_or_start_mid_character(
        tokenizers: dict[str, Any]) -> None:
    """Precondition of the properties: a token decoded alone can be a piece of a character."""
    for kind in KINDS:
        tok = tokenizers[kind]
        pieces = [i for i in range(tok.get_vocab_size()) if REPLACEMENT in tok.decode([i])]
        assert len(pieces) >= 100, kind
    ml = tokenizers["multilingual"]
    multi_byte = [i for i in range(ml.get_vocab_size())
                  if len(ml.id_to_token(i)) > 1 and REPLACEMENT in ml.decode([i])]
    assert len(multi_byte) >= 20  # merged tokens holding part of a character


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("skip_special", [True, False])
def test_random_ids_any_split_concatenate_to_the_whole_decode(
        tokenizers: dict[str, Any], kind: str, skip_special: bool) -> None:
    tok = tokenizers[kind]
    decode = decoder(tok, skip_special)
    ids_st = st.lists(st.integers(0, tok.get_vocab_size() - 1), max_size=40)

    @PROPERTY
    @given(ids=ids_st, cuts=st.lists(st.integers(0, 40), max_size=12))
    def prop(ids: list[int], cuts: list[int]) -> None:
        chunks = chunked(ids, cuts)
        assert "".join(streamed(decode, chunks)) == decode(ids)
        assert streamed(decode, chunks, many=True) == streamed(decode, chunks)
        released = held_back(decode, chunks)
        assert sum(released, []) == ids
        assert "".join(decode(c) for c in released) == decode(ids)

    prop()


TEXT_ST = st.text(alphabet=st.sampled_from(sorted(set(MULTILINGUAL_TEXT) | set("€𝄞ü中"))),
                  max_size=30)


@pytest.mark.parametrize("kind", KINDS)
def test_valid_text_streams_without_replacement_characters(
        tokenizers: dict[str, Any], kind: str) -> None:
    """Text that is valid UTF-8 never shows U+FFFD in any chunk, however the ids are split; each
    chunk the hold-back releases decodes on its own to complete characters."""
    tok = tokenizers[kind]
    decode = decoder(tok)

    @PROPERTY
    @given(text=TEXT_ST, cuts=st.lists(st.integers(0, 80), max_size=20))
    def prop(text: str, cuts: list[int]) -> None:
        ids = tok.encode(text).ids
        assert decode(ids) == text
        chunks = chunked(ids, cuts)
        pieces = streamed(decode, chunks)
        assert "".join(pieces) == text
        assert not any(REPLACEMENT in p for p in pieces)
        released = held_back(decode, chunks)
        assert "".join(decode(c) for c in released) == text
        assert not any(REPLACEMENT in decode(c) for c in released)

    prop()


def test_a_split_character_is_held_back_until_complete(tokenizers: dict[str, Any]) -> None:
    tok = tokenizers["multilingual"]
    decode = decoder(tok)
    ids = byte_ids(tok, "a中🚀".encode())  # 1 + 3 + 4 single-byte tokens
    chunks = [[i] for i in ids]
    naive = "".join(decode(c) for c in chunks)
    assert naive != "a中🚀" and REPLACEMENT in naive  # what per-chunk decoding shows
    assert streamed(decode, chunks) == ["a", "", "", "中", "", "", "", "🚀", ""]
    released = held_back(decode, chunks)
    assert [len(c) for c in released] == [1, 0, 0, 3, 0, 0, 0, 4, 0]
    assert [decode(c) for c in released if c] == ["a", "中", "🚀"]


def test_replacement_inside_a_real_invalid_sequence_is_kept(tokenizers: dict[str, Any]) -> None:
    """Invalid bytes in the middle give U+FFFD in the stream as in the whole decode; a sequence
    that really ends mid-character ends in U+FFFD after flush(); a real U+FFFD character too."""
    tok = tokenizers["tiny"]
    decode = decoder(tok)
    data = b"\x80a\xe4\xb8b\xef\xbf\xbdc\xf0\x9f"  # lone continuation, truncated 中, U+FFFD, end
    ids = byte_ids(tok, data)
    whole = decode(ids)
    assert whole == data.decode("utf-8", "replace") == "\ufffda\ufffdb\ufffdc\ufffd"
    for size in (1, 2, 3):
        chunks = [ids[i:i + size] for i in range(0, len(ids), size)]
        pieces = streamed(decode, chunks)
        assert "".join(pieces) == whole
        assert pieces[-1].endswith(REPLACEMENT)  # flush() gives the truncated tail
        released = held_back(decode, chunks)
        assert "".join(decode(c) for c in released) == whole
    d = IncrementalDetokenizer(decode)
    assert d.push(ids[:1]) == ""             # \x80 alone: maybe unfinished, held
    assert d.push(ids[1:2]) == "\ufffda"     # the next character shows it was invalid
    assert d.pending == 0


def test_cost_per_push_stays_bounded(tokenizers: dict[str, Any]) -> None:
    """The decoded window stays O(chunk) however long the sequence gets."""
    tok = tokenizers["multilingual"]
    seen: list[int] = []

    def decode(ids: list[int]) -> str:
        seen.append(len(ids))
        return str(tok.decode(ids))

    text_in = MULTILINGUAL_TEXT * 4
    ids = tok.encode(text_in).ids
    assert len(ids) > 900
    d = IncrementalDetokenizer(decode)
    h = TokenHoldBack(decode)
    text = ""
    for i in range(0, len(ids), 3):
        text += d.push(ids[i:i + 3])
        h.push(ids[i:i + 3])
    assert text + d.flush() == text_in
    assert max(seen) <= 12, max(seen)


def test_decode_many_makes_one_call_per_push(tokenizers: dict[str, Any]) -> None:
    """With ``decode_many`` (the BLS's batched postprocessing call) a push is one call, whether
    it emits or holds back, and the pieces are those of two decodes per emit."""
    tok = tokenizers["multilingual"]
    decode = decoder(tok)
    calls: list[int] = []

    def many(lists: list[list[int]]) -> list[str]:
        calls.append(len(lists))
        return [decode(x) for x in lists]

    ids = tok.encode(MULTILINGUAL_TEXT).ids[:60]
    d = IncrementalDetokenizer(lambda x: (_ for _ in ()).throw(AssertionError("decode")), many)
    chunks = [ids[i:i + 2] for i in range(0, len(ids), 2)]
    pieces = [d.push(c) for c in chunks]
    assert calls == [2] * len(chunks)
    assert pieces == streamed(decode, chunks)[:-1]


def test_flush_empties_the_detokenizer(tokenizers: dict[str, Any]) -> None:
    tok = tokenizers["multilingual"]
    decode = decoder(tok)
    d = IncrementalDetokenizer(decode)
    ids = tok.encode("你好 héllo").ids
    assert "".join([d.push(ids), d.flush()]) == "你好 héllo"
    assert d.flush() == "" and d.pending == 0
    assert d.push([]) == ""
    assert d.push(ids) + d.flush() == "你好 héllo"  # reusable for the next sequence
    assert d.push(byte_ids(tok, b"\xe4\xb8")) == "" and d.flush() == REPLACEMENT
    assert d.push(byte_ids(tok, b"\x80a")) == "\ufffda"  # not continuing the cut character
    h = TokenHoldBack(decode)
    assert h.push([]) == [] and h.flush() == []


def test_context_keeps_the_spaces_of_a_metaspace_decoder() -> None:
    """A SentencePiece-style decoder drops the leading space of what it decodes; decoding each
    window with the previous emit as context keeps the spaces between words."""
    words = ["▁Hello", "▁world", "▁again", "!", "▁and", "▁so", "▁on"]

    def decode(ids: list[int]) -> str:
        return "".join(words[i] for i in ids).replace("▁", " ").removeprefix(" ")

    ids = [0, 1, 2, 3, 4, 5, 6]
    assert "".join(decode([i]) for i in ids) != decode(ids)  # context matters
    for size in (1, 2, 3):
        chunks = [ids[i:i + size] for i in range(0, len(ids), size)]
        assert "".join(streamed(decode, chunks)) == decode(ids) == "Hello world again! and so on"
