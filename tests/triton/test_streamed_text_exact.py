"""Streamed text is exact, through a real tritonserver: the streamed
``text_output`` chunks of ``ensemble`` concatenate to the non-streamed text byte for byte, also
when the greedy output has multi-byte characters split across the decoder's steps.

The tiny checkpoint's tokenizer is trained on Chinese, emoji and accented text (tokens that are
pieces of characters). Prompts are chosen offline, with the engine's own decoder, among pieces of
that text: each one's greedy output has a valid multi-byte character whose bytes span two
verify steps, so per-step decoding (what the ensemble did before the hold-back) shows U+FFFD
there. That precondition is asserted, so the test cannot pass vacuously."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.serving.detok import REPLACEMENT, TokenHoldBack
from tests.helpers.server import (
    TEARDOWN_STOP_S,
    TinyDeployment,
    grpc_stream,
    request,
    scalar,
    serve_tiny,
)
from tests.helpers.tiny import (
    MULTILINGUAL_TEXT,
    chars_split_across,
    make_tiny_checkpoint,
    token_bytes,
)

pytestmark = pytest.mark.server

MAX_TOKENS = 24
N_PROMPTS = 3


@dataclass(frozen=True)
class Case:
    prompt: str
    prompt_ids: list[int]
    steps: list[list[int]]  # the output ids of each verify step (offline, same engine)
    split: list[str]        # multi-byte characters whose bytes span two steps


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyDeployment]:
    root = Path(tmp_path_factory.mktemp("exact"))
    ckpt = make_tiny_checkpoint(root / "ckpt", vocab_size=400, text=MULTILINGUAL_TEXT)
    dep = serve_tiny(root, ckpt=ckpt, baseline=False)
    try:
        yield dep
    finally:
        dep.server.stop(timeout_s=TEARDOWN_STOP_S)


def _greedy_steps(decoder: Any, ids: list[int]) -> list[list[int]]:
    """The output ids of each verify step of a greedy generation (``end_id`` -1)."""
    from specserve.runtime.decoder import SamplingParams

    steps: list[list[int]] = []
    decoder.generate([ids], [SamplingParams(max_tokens=MAX_TOKENS, end_id=None)],
                     lambda _i, new: steps.append([int(t) for t in new]))
    return steps


@pytest.fixture(scope="module")
def cases(served: TinyDeployment) -> list[Case]:
    """The first prompts (pieces of the training text) whose greedy output splits a multi-byte
    character across two steps, found with the engine's decoder in this process."""
    from tokenizers import Tokenizer

    from specserve.runtime.engine import load_engine

    tok_json = served.engine / "tokenizer" / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_json))
    decoder = load_engine(served.engine).decoder
    found: list[Case] = []
    for size in (2, 4, 6):
        for start in range(0, 60):
            prompt = MULTILINGUAL_TEXT[start:start + size]
            ids = tok.encode(prompt).ids  # preprocessing's encode (no special tokens added)
            steps = _greedy_steps(decoder, ids)
            split = chars_split_across([token_bytes(tok_json, s) for s in steps])
            if split:
                found.append(Case(prompt, ids, steps, split))
            if len(found) == N_PROMPTS:
                return found
    pytest.fail(f"no {N_PROMPTS} prompts split a multi-byte character across steps "
                f"(found {len(found)})")


def _bytes(responses: list[dict[str, Any]]) -> bytes:
    return b"".join(r["text_output"].reshape(-1)[0] for r in responses if "text_output" in r)


def test_precondition_per_step_decoding_shows_replacement(served: TinyDeployment,
                                                          cases: list[Case]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(served.engine / "tokenizer" / "tokenizer.json"))
    for case in cases:
        whole = tok.decode(sum(case.steps, []))
        per_step = "".join(tok.decode(s) for s in case.steps)
        assert all(c in whole for c in case.split)
        assert per_step != whole and per_step.count(REPLACEMENT) > whole.count(REPLACEMENT)
        assert len(case.steps) >= 4 and max(len(s) for s in case.steps) == 5  # K + 1 per step


def test_streamed_text_equals_non_streamed_text_byte_for_byte(served: TinyDeployment,
                                                              cases: list[Case]) -> None:
    url = served.server.grpc_url
    for case in cases:
        plain = grpc_stream(url, "ensemble", request(case.prompt, MAX_TOKENS,
                                                     exclude_input_in_output=True))
        stream = grpc_stream(url, "ensemble", request(
            case.prompt, MAX_TOKENS, stream=True, exclude_input_in_output=True,
            return_num_output_tokens=True))
        whole = _bytes(plain)
        assert all(c.encode() in whole for c in case.split), case.prompt
        assert _bytes(stream) == whole, case.prompt
        # per-response token counts (not cumulative) still add up to every generated token
        counts = [scalar(r, "num_output_tokens") for r in stream]
        assert sum(counts) == MAX_TOKENS


def test_tensorrt_llm_holds_tokens_back_to_complete_characters(served: TinyDeployment,
                                                               cases: list[Case]) -> None:
    """Where the hold-back happens: every streamed ``tensorrt_llm`` response decodes on its own
    to complete characters; the tokens are those of the steps, regrouped as TokenHoldBack
    regroups them, the final response carrying whatever is still held."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(served.engine / "tokenizer" / "tokenizer.json"))

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    for case in cases:
        stream = grpc_stream(served.server.grpc_url, "tensorrt_llm", {
            "input_ids": np.array([case.prompt_ids], dtype=np.int32),
            "input_lengths": np.array([[len(case.prompt_ids)]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
            "end_id": np.array([[-1]], dtype=np.int32),
            "streaming": np.array([[True]], dtype=bool),
            "return_num_output_tokens": np.array([[True]], dtype=bool)})
        chunks = [r["output_ids"].reshape(-1).tolist() for r in stream]
        assert sum(chunks, []) == sum(case.steps, [])
        assert [scalar(r, "num_output_tokens") for r in stream] == [len(c) for c in chunks]
        hold = TokenHoldBack(decode)
        expected = [c for c in (hold.push(s) for s in case.steps) if c] + [hold.flush()]
        assert chunks == expected
        assert not any(decode(c).endswith(REPLACEMENT) for c in chunks[:-1])
        assert len(chunks) - 1 < len(case.steps)  # some step was held back and merged
