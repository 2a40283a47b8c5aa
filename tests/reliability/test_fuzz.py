"""Property-based fuzzing (hypothesis) of the server-side request handling, in process:

- ``specserve.triton.llm_io.parse_request`` (the ``tensorrt_llm`` model's request parser):
  FUZZ_CASES random input dicts (names from the model's inputs plus unknown ones, random dtypes,
  shapes, values). Property: it returns an ``LlmRequest`` whose fields are consistent, or
  raises ``ValueError`` with a message; nothing else.
- the ``preprocessing`` model (``execute``): FUZZ_CASES random texts (any Unicode, invalid UTF-8
  bytes), output lengths, end/pad ids, bad/stop word lists. Property: one response per request,
  either an error response with a message or token ids inside the vocab whose count matches
  ``REQUEST_INPUT_LEN``; ``execute`` never raises.

Triton's ``triton_python_backend_utils`` exists only inside the stub, so a minimal stand-in
module is installed for the preprocessing import (tensors by name, responses with an error).
Seeded by hypothesis' derandomize=True: the same cases every run.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserve.triton.llm_io import HONOURED, NEUTRAL, LlmRequest, parse_request

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


@SETTINGS
@given(request_dicts())
def test_parse_request_returns_or_raises_value_error(arrays_in: dict[str, Any]) -> None:
    try:
        req = parse_request(arrays_in)
    except ValueError as e:
        assert str(e)
        return
    assert isinstance(req, LlmRequest)
    assert req.max_tokens >= 1 and 1 <= len(req.prompt) <= arrays_in["input_ids"].size
    assert all(isinstance(t, int) for t in req.prompt)


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

    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = _fake_pb_utils()
    try:
        sys.modules.pop("specserve.triton.models.preprocessing", None)
        from specserve.triton.models import preprocessing as pre

        model = pre.TritonPythonModel()
        tok_dir = str(tiny_ckpt.tokenizer)
        model.initialize({"model_repository": os.path.dirname(tok_dir), "model_config": json.dumps(
            {"parameters": {"tokenizer_dir": {"string_value": os.path.basename(tok_dir)}}})})
        yield model
    finally:
        sys.modules.pop("specserve.triton.models.preprocessing", None)
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


texts = st.one_of(st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
                  st.binary(max_size=64))
words = st.lists(st.one_of(st.text(max_size=8).map(lambda s: s.encode("utf-8", "surrogatepass")),
                           st.binary(max_size=8)), max_size=3)


@st.composite
def pre_requests(draw: Any) -> dict[str, np.ndarray[Any, Any]]:
    n_query = draw(st.sampled_from([1, 1, 1, 0, 2]))
    t: dict[str, np.ndarray[Any, Any]] = {
        "QUERY": np.array([draw(texts) for _ in range(n_query)], dtype=object).reshape(1, -1)}
    for name in ("REQUEST_OUTPUT_LEN", "END_ID", "PAD_ID"):
        if draw(st.booleans()):
            t[name] = np.array([[draw(st.integers(-(2**31), 2**31 - 1))]], dtype=np.int32)
    for name in ("BAD_WORDS_DICT", "STOP_WORDS_DICT"):
        if draw(st.booleans()):
            t[name] = np.array(draw(words) or [b""], dtype=object).reshape(1, -1)
    return t


@SETTINGS
@given(st.lists(pre_requests(), min_size=1, max_size=3))
def test_preprocessing_never_raises(preprocessing: Any, reqs: list[dict[str, Any]]) -> None:
    responses = preprocessing.execute([_Request(r) for r in reqs])
    assert len(responses) == len(reqs)
    vocab = preprocessing.tok.get_vocab_size()
    for r in responses:
        if r.error is not None:
            assert r.error.message().startswith("preprocessing: ")
            continue
        ids = r.tensors["INPUT_ID"]
        assert ids.dtype == np.int32 and ids.size >= 1 and int(ids.max()) < vocab
        assert int(r.tensors["REQUEST_INPUT_LEN"].reshape(-1)[0]) == ids.size
