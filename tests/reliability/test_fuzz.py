"""Property-based fuzzing (hypothesis) of the server-side request handling, in process:

- ``specserve.triton.llm_io.parse_request`` (the ``tensorrt_llm`` model's request parser):
  FUZZ_CASES random input dicts (names from the model's inputs plus unknown ones, random dtypes,
  shapes, values). Property: it returns an ``LlmRequest`` whose fields are consistent, or
  raises ``ValueError`` with one of the reasons in ``PARSE_ERRORS``; nothing else. A request of
  only the core with a positive output length always parses; at least PARSE_FLOOR cases parse.
- the ``preprocessing`` model (``execute``): FUZZ_CASES random texts (any Unicode, invalid UTF-8
  bytes), output lengths, end/pad ids, bad/stop word lists. Property: one response per request,
  either an error response with one of the reasons in ``PRE_ERRORS`` or the tokenizer's ids of
  the text (inside the vocab, count in ``REQUEST_INPUT_LEN``); valid text with one QUERY always
  succeeds; ``execute`` never raises; at least PRE_FLOOR requests succeed.

Triton's ``triton_python_backend_utils`` exists only inside the stub, so a minimal stand-in
module is installed for the preprocessing import (tensors by name, responses with an error).
Seeded by hypothesis' derandomize=True: the same cases every run.
"""

from __future__ import annotations

import re
import types
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserve.serving.request import LlmRequest
from specserve.triton.llm_io import HONOURED, NEUTRAL, parse_request

FUZZ_CASES = 400
SETTINGS = settings(max_examples=FUZZ_CASES, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

NAMES = sorted(HONOURED | set(NEUTRAL)) + ["lora_weights", "prompt_embedding_table"]
DTYPES = [np.int32, np.int64, np.uint64, np.float32, np.bool_]


@st.composite
def arrays(draw: Any) -> np.ndarray[Any, Any]:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from([(1, 1), (1, 0), (1, 3), (2, 2), (1, 2, 4), (0,)]))
    size = int(np.prod(shape))
    if dtype is np.bool_:
        values = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    elif dtype is np.float32:
        values = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=size, max_size=size))
    else:
        lo = 0 if dtype is np.uint64 else -(2**31)
        values = draw(st.lists(st.integers(lo, 2**31 - 1), min_size=size, max_size=size))
    return np.array(values, dtype=dtype).reshape(shape)


@st.composite
def request_dicts(draw: Any) -> dict[str, np.ndarray[Any, Any]]:
    out: dict[str, np.ndarray[Any, Any]] = {}
    if draw(st.booleans()):  # often a plausible core, so that deeper checks are reached
        n = draw(st.integers(1, 6))
        out["input_ids"] = np.arange(1, n + 1, dtype=np.int32).reshape(1, n)
        out["request_output_len"] = np.array([[draw(st.integers(-3, 50))]], dtype=np.int32)
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=6, unique=True)):
        out[name] = draw(arrays())
    return out


# Every ValueError parse_request raises, by its reason (re.fullmatch)
PARSE_ERRORS = [
    r"input '\w+' is empty",
    r"input '\w+' is not supported by the specserve reference backend",
    r"inputs 'input_ids' and 'request_output_len' are required",
    r"input_lengths -?\d+ does not fit input_ids of length \d+",
    r"stop words must be single tokens in the specserve reference backend",
    r"request_output_len must be positive, got -?\d+",
    r"input 'draft_logits' needs 'draft_input_ids'",
    r"input 'draft_logits' must be \[K, V\] with K = \d+ \(the draft_input_ids\), got shape "
    r"\[[\d, ]*\]",
    r"input 'draft_logits' holds NaN or \+inf",
    r"input 'return_generation_logits' is not supported with streaming by the specserve "
    r"reference backend",
    r"input '(bad|stop)_words_list' must hold \[2, L\] values \(ids, then end offsets\), "
    r"got \d+",
]
# Floor on parsed requests among the FUZZ_CASES. Half the dicts get the plausible core
# (st.booleans()) and 50 of its 54 output lengths are positive; hypothesis' lists(max_size=6)
# draws no extra names for a large share of those (average size 3), and such a request must
# parse (checked per case below). derandomize=True fixes the cases (for this test code): 57
# of 400 parse with hypothesis 6.170. 20 (5%) leaves room for another hypothesis version
# drawing other cases, and fails a parser that refuses valid requests.
PARSE_FLOOR = 20


def _parse_outcome(arrays_in: dict[str, Any]) -> str:
    plainly_valid = set(arrays_in) == {"input_ids", "request_output_len"} and \
        arrays_in["input_ids"].size > 0 and arrays_in["request_output_len"].size == 1 and \
        int(arrays_in["request_output_len"].item()) >= 1
    try:
        req = parse_request(arrays_in)
    except ValueError as e:  # any other type fails the test
        msg = str(e)
        assert any(re.fullmatch(p, msg) for p in PARSE_ERRORS), f"unexpected reason: {msg}"
        assert not plainly_valid, f"a valid request was refused: {msg}"
        return "error"
    assert isinstance(req, LlmRequest)
    assert req.max_tokens >= 1 and 1 <= len(req.prompt) <= arrays_in["input_ids"].size
    assert all(isinstance(t, int) for t in req.prompt)
    return "ok"


def test_parse_request_returns_or_raises_value_error() -> None:
    outcomes: Counter[str] = Counter()

    @SETTINGS
    @given(request_dicts())
    def check(arrays_in: dict[str, Any]) -> None:
        outcomes[_parse_outcome(arrays_in)] += 1

    check()
    assert outcomes["ok"] >= PARSE_FLOOR, outcomes


# --- preprocessing -------------------------------------------------------------------------

class _Tensor:
    def __init__(self, name: str, array: np.ndarray[Any, Any]) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array


class _Error:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class _Response:
    def __init__(self, output_tensors: list[_Tensor], error: _Error | None = None) -> None:
        self.tensors = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class _Request:
    def __init__(self, tensors: dict[str, np.ndarray[Any, Any]]) -> None:
        self.tensors = tensors


def _fake_pb_utils() -> types.ModuleType:
    m = types.ModuleType("triton_python_backend_utils")
    m.Tensor = _Tensor  # type: ignore[attr-defined]
    m.InferenceResponse = _Response  # type: ignore[attr-defined]
    m.TritonError = _Error  # type: ignore[attr-defined]
    m.get_input_tensor_by_name = (  # type: ignore[attr-defined]
        lambda req, name: _Tensor(name, req.tensors[name]) if name in req.tensors else None)
    return m


@pytest.fixture(scope="module")
def preprocessing(tiny_ckpt: Any) -> Any:
    import json
    import os

    from tests.helpers.fake_module import installed

    with installed(_fake_pb_utils(), reimport=("specserve.triton.models.preprocessing",)):
        from specserve.triton.models import preprocessing as pre

        model = pre.TritonPythonModel()
        tok_dir = str(tiny_ckpt.tokenizer)
        model.initialize({"model_repository": os.path.dirname(tok_dir), "model_config": json.dumps(
            {"parameters": {"tokenizer_dir": {"string_value": os.path.basename(tok_dir)}}})})
        yield model


texts = st.one_of(st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
                  st.binary(max_size=64))
words = st.lists(st.one_of(st.text(max_size=8).map(lambda s: s.encode("utf-8", "surrogatepass")),
                           st.binary(max_size=8)), max_size=3)


@st.composite
def pre_requests(draw: Any) -> dict[str, np.ndarray[Any, Any]]:
    n_query = draw(st.sampled_from([1, 1, 1, 0, 2]))
    t: dict[str, np.ndarray[Any, Any]] = {
        "QUERY": np.array([draw(texts) for _ in range(n_query)], dtype=object).reshape(1, -1)}
    for name in ("REQUEST_OUTPUT_LEN", "END_ID", "PAD_ID"):  # the first is required (config)
        if name == "REQUEST_OUTPUT_LEN" or draw(st.booleans()):
            t[name] = np.array([[draw(st.integers(-(2**31), 2**31 - 1))]], dtype=np.int32)
    for name in ("BAD_WORDS_DICT", "STOP_WORDS_DICT"):
        if draw(st.booleans()):
            t[name] = np.array(draw(words) or [b""], dtype=object).reshape(1, -1)
    return t


PRE_ERRORS = [  # every error response preprocessing gives, by its reason (re.fullmatch)
    r"preprocessing: QUERY must hold one string per request, got \d+",
    r"preprocessing: QUERY tokenizes to zero tokens",
    r"preprocessing: 'utf-8' codec can't decode (byte 0x[0-9a-f]{2}|bytes) in position "
    r"\d+(-\d+)?: (invalid start byte|invalid continuation byte|unexpected end of data)",
]
# Floor on requests that get token ids. A request succeeds iff every string decodes, QUERY
# holds one (3 of the 5 sampled counts) and it tokenizes to >= 1 token (st.text is often empty;
# st.binary is mostly invalid UTF-8). derandomize=True fixes the cases (for this test code):
# 107 of 681 requests succeed with hypothesis 6.170; 30 (~4%) leaves room for another
# hypothesis version and fails a model that refuses valid text. Each case is also checked
# against that rule, below.
PRE_FLOOR = 30


def _decodes(values: np.ndarray[Any, Any]) -> bool:
    try:
        for v in values.reshape(-1):
            v.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _pre_outcome(model: Any, req: dict[str, Any], r: _Response) -> str:
    strings_ok = all(_decodes(req[n]) for n in ("QUERY", "BAD_WORDS_DICT", "STOP_WORDS_DICT")
                     if n in req)
    queries = req["QUERY"].reshape(-1)
    ids = model.tok.encode(queries[0].decode("utf-8"), add_special_tokens=model.add_special
                           ).ids if strings_ok and len(queries) == 1 else []
    if r.error is not None:
        msg = r.error.message()
        assert any(re.fullmatch(p, msg) for p in PRE_ERRORS), f"unexpected reason: {msg}"
        assert not ids, f"valid text {queries[0]!r} refused: {msg}"
        assert not strings_ok or "codec can't decode" not in msg, msg
        return "error"
    assert ids, f"{req} should have been refused"
    out = r.tensors["INPUT_ID"]
    assert out.dtype == np.int32 and out.reshape(-1).tolist() == ids
    assert int(r.tensors["REQUEST_INPUT_LEN"].reshape(-1)[0]) == len(ids)
    assert int(r.tensors["REQUEST_OUTPUT_LEN"].reshape(-1)[0]) == \
        int(req["REQUEST_OUTPUT_LEN"].reshape(-1)[0])
    return "ok"


def test_preprocessing_never_raises(preprocessing: Any) -> None:
    outcomes: Counter[str] = Counter()
    vocab = preprocessing.tok.get_vocab_size()

    @SETTINGS
    @given(st.lists(pre_requests(), min_size=1, max_size=3))
    def check(reqs: list[dict[str, Any]]) -> None:
        responses = preprocessing.execute([_Request(r) for r in reqs])
        assert len(responses) == len(reqs)
        for req, r in zip(reqs, responses, strict=True):
            outcomes[_pre_outcome(preprocessing, req, r)] += 1
            if r.error is None:
                assert int(r.tensors["INPUT_ID"].max()) < vocab

    check()
    assert outcomes["ok"] >= PRE_FLOOR, outcomes
