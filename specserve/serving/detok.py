"""Incremental detokenization: streamed text chunks that concatenate to exactly the text of the
whole sequence (``"".join(pushes) + flush() == decode(all ids)``).

Self-contained (standard library only): the repository writer copies it into a repository as
``tensorrt_llm_bls/1/lib/detok.py`` for the BLS model (:mod:`specserve.triton.repository`).

The method is the standard one of vLLM's ``detokenize_incrementally``
(``vllm/transformers_utils/detokenizer_utils.py``, itself from text-generation-inference): decode a
short window of ids starting at a *prefix offset*, compare it with the decode of the window's
already-emitted part (``[prefix offset, read offset)``), and emit the new suffix only when the
window's text grew and does not end in U+FFFD -- a trailing U+FFFD is, potentially, a multi-byte
character whose remaining bytes are in tokens not generated yet. A U+FFFD *inside* the text is a
real invalid byte sequence and is emitted like any other character. Hugging Face's ``TextStreamer``
(``transformers/generation/streamers.py``) keeps a similar cache and ``print_len`` but decodes
the whole cache until a newline and holds back by words; here the window restarts after every
emit, which is what keeps a push cheap. Our own code, written from reading both.

Cost of a push: one decode of the window (two when it emits; one call with a ``decode_many``,
which decodes the window and its would-be next window together: the BLS's postprocessing call
is a Triton round trip, and a batch of two costs one). The window holds the ids of the
previous emit (the context a decoder may need to place leading spaces, e.g. SentencePiece's
Metaspace), the ids held back since then and the pushed ones -- O(window), not O(sequence).
The window only grows while the text keeps ending in U+FFFD (a run of invalid bytes at the end),
as in vLLM.

:class:`TokenHoldBack` applies the same rule to token ids, for a pipeline whose detokenizer is
stateless per chunk (the ensemble's postprocessing decodes each response on its own): it holds
ids back while their decode ends in U+FFFD, so every released chunk decodes on its own to
complete characters and the chunks' texts concatenate to the text of the whole sequence.

Exactness holds for decoders whose text, split at a character boundary, is the concatenation of
the texts of the two parts (byte-level BPE such as GPT-2's and ours: the token bytes joined and
decoded with replacement); the property tests in ``tests/serving/test_detok.py`` check it.
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Streamed text of one sequence: :meth:`push` each step's new ids, :meth:`flush` at the end.

    ``decode(ids) -> str`` decodes a list of ids (e.g. ``tokenizers.Tokenizer.decode`` with the
    postprocessing's ``skip_special_tokens``); it must be the decode the non-streamed text uses.
    ``decode_many(lists) -> texts``, when given, is the same decode of several lists at once
    (one call per push instead of two).
    """

    def __init__(self, decode: Callable[[list[int]], str],
                 decode_many: Callable[[list[list[int]]], list[str]] | None = None) -> None:
        self._decode = decode
        self._decode_many = decode_many
        self._ids: list[int] = []   # the window: ids from the prefix offset on
        self._read = 0              # ids[:read] were emitted (their text is _prefix_text)
        self._prefix_text = ""

    @property
    def pending(self) -> int:
        """How many pushed ids are held back (not yet in any returned text)."""
        return len(self._ids) - self._read

    def push(self, ids: list[int]) -> str:
        """Add the next ids; return the text they complete ("" while held back)."""
        if not ids:
            return ""
        self._ids.extend(int(t) for t in ids)
        after = None  # the next window's text, when decoded with this one
        if self._decode_many is None:
            text = self._decode(self._ids)
        else:
            text, after = self._decode_many([self._ids, self._ids[self._read:]])
        if len(text) <= len(self._prefix_text) or text.endswith(REPLACEMENT):
            return ""  # nothing new yet, or possibly an unfinished multi-byte character
        return self._emit(text, after)

    def flush(self) -> str:
        """The text still held back (ends in U+FFFD when the sequence really ends mid-character,
        as the non-streamed decode does). The detokenizer is then empty, ready for a new
        sequence."""
        out = ""
        if self.pending:
            out = self._emit(self._decode(self._ids))
        self._ids, self._read, self._prefix_text = [], 0, ""
        return out

    def _emit(self, text: str, after: str | None = None) -> str:
        """Return the window's new text and restart the window at the old read offset
        (``after``: the new window's text, when already decoded)."""
        out = text[len(self._prefix_text):]
        del self._ids[:self._read]   # the new prefix offset is the old read offset
        self._read = len(self._ids)
        # Decoded again rather than taken from ``out``: without its context a decoder may
        # render the window differently (a leading space dropped).
        self._prefix_text = self._decode(self._ids) if after is None else after
        return out


def ends_incomplete(decode: Callable[[list[int]], str], ids: list[int]) -> bool:
    """True when the text of ``ids`` ends in U+FFFD: possibly a multi-byte character whose
    remaining bytes come with later ids (or a real invalid sequence at the end: held too, until
    the next character or the end shows which)."""
    return decode(ids).endswith(REPLACEMENT)


class TokenHoldBack:
    """Token-level hold-back for chunks that are decoded independently: :meth:`push` returns
    the ids to send now (``[]`` while they end mid-character), :meth:`flush` the rest at the end.

    Each push decodes the held ids plus the pushed ones: O(chunk), the held part being at most
    one character's tokens unless the output ends in a run of invalid bytes.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._held: list[int] = []

    @property
    def pending(self) -> int:
        """How many ids are held back."""
        return len(self._held)

    def push(self, ids: list[int]) -> list[int]:
        """Add the next ids; return the ids whose chunk now ends on a complete character."""
        if not ids:
            return []
        self._held.extend(int(t) for t in ids)
        if ends_incomplete(self._decode, self._held):
            return []
        out, self._held = self._held, []
        return out

    def flush(self) -> list[int]:
        """The ids still held (their decode ends in U+FFFD, as the whole sequence's does)."""
        out, self._held = self._held, []
        return out
