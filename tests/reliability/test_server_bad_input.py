"""Bad requests to a real tritonserver (``docs/reliability.md``), through
tritonclient gRPC (ensemble, streaming) and the HTTP generate extension. Each: an error response
with a message; then the server is still ready and the next good request gives the reference
text. Also: a bad request in the same dynamic batch as good ones fails alone.
The run-wide tiny server (tests/conftest.py ``tiny_server``: reference engine, draft = target)."""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

import numpy as np
import pytest

from tests.helpers.server import StreamError, grpc_stream, request, text_of
from tests.reliability.helpers import Job, llm_inputs, run_jobs, run_jobs_tolerant

pytestmark = pytest.mark.server

GOOD = "def add(a, b):"


@pytest.fixture(scope="module")
def srv(tiny_server: Any) -> Any:
    """The run-wide tiny deployment's server (tests/conftest.py), with the reference text of
    GOOD taken before any bad request."""
    server = tiny_server.server
    server.reference = text_of(
        grpc_stream(server.grpc_url, "ensemble", request(GOOD, 8, stream=True)))
    return server


def _healthy(server: Any) -> None:
    conn = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200, "server not ready after a bad request"
    conn.close()
    again = text_of(grpc_stream(server.grpc_url, "ensemble", request(GOOD, 8, stream=True)))
    assert again == server.reference


def _arr(value: Any, dtype: Any, shape: tuple[int, ...] = (1, 1)) -> np.ndarray[Any, Any]:
    return np.array(value, dtype=dtype).reshape(shape)


LONG = "x = 1\n" * 400  # > max_input_len (256 tokens)

# (case, model, inputs, the reason the error must give: a regex over the whole message)
GRPC_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("empty text_input", "ensemble", request("", 8),
     r"^in ensemble 'ensemble', preprocessing: QUERY tokenizes to zero tokens$"),
    ("max_tokens 0", "ensemble", request(GOOD, 0),
     r"^in ensemble 'ensemble', tensorrt_llm: request_output_len must be positive, got 0$"),
    ("max_tokens -1", "ensemble", request(GOOD, -1),
     r"^in ensemble 'ensemble', tensorrt_llm: request_output_len must be positive, got -1$"),
    ("max_tokens 1e9", "ensemble", request(GOOD, 10**9),
     r"tensorrt_llm: prompt \d+ \+ request_output_len 1000000000 exceeds the engine's "
     r"max_seq_len 512$"),
    ("prompt > max_input_len", "ensemble", request(LONG, 8),
     r"tensorrt_llm: prompt has 2400 tokens, the engine's max_input_len is 256$"),
    ("non-UTF-8 text_input", "ensemble",
     {**request(GOOD, 8), "text_input": _arr([b"\xff\xfe\x80abc"], object)},
     r"preprocessing: 'utf-8' codec can't decode byte 0xff in position 0"),
    ("max_tokens as FP32", "ensemble",
     {**request(GOOD, 8), "max_tokens": _arr([8.0], np.float32)},
     r"input 'max_tokens' data-type is 'FP32', but model 'ensemble' expects 'INT32'"),
    ("text_input as INT32", "ensemble",
     {**request(GOOD, 8), "text_input": _arr([5], np.int32)},
     r"input 'text_input' data-type is 'INT32', but model 'ensemble' expects 'BYTES'"),
    ("max_tokens shape [1, 3]", "ensemble",
     {**request(GOOD, 8), "max_tokens": _arr([8, 8, 8], np.int32, (1, 3))},
     r"unexpected shape for input 'max_tokens' for model 'ensemble'\. "
     r"Expected \[-1,1\], got \[1,3\]"),
    ("unknown model", "no_such_model", request(GOOD, 8),
     r"^Request for unknown model: 'no_such_model' is not found$"),
    ("temperature -1", "ensemble", request(GOOD, 8, temperature=-1.0),
     r"tensorrt_llm: temperature must be >= 0, got -1\.0$"),
    ("beam_width 4", "ensemble", request(GOOD, 8, beam_width=4),
     r"tensorrt_llm: input 'beam_width' is not supported by the specserve reference backend$"),
]


@pytest.mark.parametrize(("case", "model", "inputs", "reason"), GRPC_CASES,
                         ids=[c[0] for c in GRPC_CASES])
def test_grpc_bad_request(srv: Any, record_property: Any, case: str, model: str,
                          inputs: dict[str, Any], reason: str) -> None:
    with pytest.raises(StreamError, match=reason) as err:  # the server's error response
        grpc_stream(srv.grpc_url, model, inputs, timeout_s=60)
    record_property("message", str(err.value)[:300])
    _healthy(srv)


@pytest.mark.parametrize("missing", ["max_tokens", "text_input"])
def test_grpc_missing_required_input(srv: Any, missing: str) -> None:
    """KNOWN tritonserver 2.51 behaviour (docs/reliability.md): a decoupled model's gRPC stream
    request without a required input gets NO error, only an empty final response (and nothing
    at all without ``enable_empty_final_response``); HTTP gets a 400 naming the input (below).
    Pinned here so that a change shows up; the server stays healthy."""
    inputs = {k: v for k, v in request(GOOD, 8).items() if k != missing}
    responses = grpc_stream(srv.grpc_url, "ensemble", inputs, timeout_s=60)
    assert responses == [{"final": True}]
    _healthy(srv)


def _http(srv: Any, path: str, body: bytes) -> tuple[int, str]:
    conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=60)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = (resp.status, resp.read().decode("utf-8", "replace"))
    conn.close()
    return out


def _j(**kw: Any) -> bytes:
    return json.dumps({"text_input": GOOD, "max_tokens": 8, "end_id": -1, **kw}).encode()


# (case, model, body, HTTP status, the reason: a regex over the "error" field)
HTTP_CASES: list[tuple[str, str, bytes, int, str]] = [
    ("empty text_input", "ensemble", _j(text_input=""), 400,
     r"^in ensemble 'ensemble', preprocessing: QUERY tokenizes to zero tokens$"),
    ("max_tokens 0", "ensemble", _j(max_tokens=0), 400,
     r"^in ensemble 'ensemble', tensorrt_llm: request_output_len must be positive, got 0$"),
    ("max_tokens -1", "ensemble", _j(max_tokens=-1), 400,
     r"^in ensemble 'ensemble', tensorrt_llm: request_output_len must be positive, got -1$"),
    ("max_tokens 1e9", "ensemble", _j(max_tokens=10**9), 400,
     r"tensorrt_llm: prompt \d+ \+ request_output_len 1000000000 exceeds the engine's "
     r"max_seq_len 512$"),
    ("prompt > max_input_len", "ensemble", _j(text_input=LONG), 400,
     r"tensorrt_llm: prompt has 2400 tokens, the engine's max_input_len is 256$"),
    # tritonserver's own JSON parser (2.51) answers 500 for these three
    ("invalid UTF-8 body", "ensemble", _j()[:-2] + b'\xff\xfe"}', 500,
     r"^failed to parse the request JSON buffer: Invalid value\."),
    ("not JSON", "ensemble", b"{max_tokens: ", 500,
     r"^failed to parse the request JSON buffer: Missing a name for object member\."),
    ("max_tokens as string", "ensemble", _j(max_tokens="eight"), 500,
     r"attempt to access JSON non-signed-integer as signed-integer"),
    ("missing max_tokens", "ensemble", json.dumps({"text_input": GOOD}).encode(), 400,
     r"missing required input\(s\) \['max_tokens'\]"),
    ("unknown model", "no_such_model", _j(), 404,
     r"^Request for unknown model: 'no_such_model' is not found$"),
]


@pytest.mark.parametrize(("case", "model", "body", "status", "reason"), HTTP_CASES,
                         ids=[c[0] for c in HTTP_CASES])
def test_http_bad_request(srv: Any, record_property: Any, case: str, model: str, body: bytes,
                          status: int, reason: str) -> None:
    got, text = _http(srv, f"/v2/models/{model}/generate", body)
    record_property("message", f"{got} {text[:300]}")
    assert got == status, (got, text)
    error = json.loads(text)["error"]
    assert re.search(reason, error), error


def test_bad_neighbours_in_one_batch_fail_alone(srv: Any) -> None:
    """Requests that only fail together (a long prompt and a long output share one KV cache
    size) or alone (a token id outside the vocab) must not fail their batch neighbours. A
    blocker request keeps the worker busy so that the rest queue up into one batch."""
    blocker = Job([30, 31], 300, 0.0)
    good = [Job([20, 21, 22, 23], 6, 0.0) for _ in range(4)]
    long_prompt = Job(list(range(4, 254)), 10, 0.0)  # 250 + 10 <= 512
    long_output = Job([20, 21], 490, 0.0)  # 2 + 490 <= 512, but 250 + 490 > 512
    bad_id = Job([20, 10**6], 6, 0.0)
    expected = run_jobs(srv.grpc_url, "tensorrt_llm", good[:1])[0]
    results = run_jobs(srv.grpc_url, "tensorrt_llm", [blocker, *good, long_prompt, long_output])
    assert results[1:5] == [expected] * 4
    assert len(results[5]) == 10 and len(results[6]) == 490
    out, errors = run_jobs_tolerant(srv.grpc_url, "tensorrt_llm", [blocker, *good, bad_id])
    assert len(errors) == 1 and "vocab" in errors[0], errors
    assert [out[i] for i in range(1, 5)] == [expected] * 4 and 5 not in out
    _healthy(srv)


def test_llm_inputs_helper_shape() -> None:
    arrays = llm_inputs(Job([1, 2, 3], 4))
    assert arrays["input_ids"].shape == (1, 3) and arrays["seed"].dtype == np.uint64
