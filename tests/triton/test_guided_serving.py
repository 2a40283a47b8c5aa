"""Structured output on a real tritonserver (the tiny reference engine, draft = target; fixture
``tiny_server``): TensorRT-LLM's ``guided_decoding_guide_type`` / ``guided_decoding_guide``
sent straight to ``tensorrt_llm`` over gRPC give an answer valid under the JSON schema, equal to
the engine's guided output without speculation; a malformed schema is one error line on that
request's stream."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tests.helpers.server import StreamError, grpc_stream

pytestmark = pytest.mark.server

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0,
                                                 "maximum": 99}},
          "required": ["ok", "n"]}


def _inputs(ids: list[int], **guide: str) -> dict[str, np.ndarray]:
    arrays = {"input_ids": np.array([ids], dtype=np.int32),
              "input_lengths": np.array([[len(ids)]], dtype=np.int32),
              "request_output_len": np.array([[48]], dtype=np.int32),
              "exclude_input_in_output": np.array([[True]], dtype=bool)}
    arrays.update({k: np.array([[v.encode()]], dtype=object) for k, v in guide.items()})
    return arrays


def test_a_guided_request_is_valid_json_and_lossless(tiny_server: Any) -> None:
    import jsonschema
    from transformers import AutoTokenizer

    from specserve.runtime.decoder import SamplingParams, SpecDecoder
    from specserve.runtime.grammar import Guide, GuideCompiler
    from specserve.runtime.model import load_model

    tok = AutoTokenizer.from_pretrained(str(tiny_server.engine / "tokenizer"))
    ids = list(tok("def add(a, b):")["input_ids"])
    got = grpc_stream(tiny_server.server.grpc_url, "tensorrt_llm", _inputs(
        ids, guided_decoding_guide_type="json_schema", guided_decoding_guide=json.dumps(SCHEMA)))
    out = [t for r in got if "output_ids" in r for t in r["output_ids"].reshape(-1).tolist()]
    jsonschema.validate(json.loads(tok.decode(out)), SCHEMA)
    target = load_model(tiny_server.engine / "target")
    guide = GuideCompiler(tok, target.cfg.vocab_size, [tok.eos_token_id]).compile(
        Guide("json_schema", json.dumps(SCHEMA)))
    plain = SpecDecoder(target).generate([ids], SamplingParams(
        max_tokens=48, end_id=tok.eos_token_id, guide=guide))[0]
    assert out == plain.token_ids


def test_a_malformed_schema_is_one_error_line(tiny_server: Any) -> None:
    with pytest.raises(StreamError, match="the JSON schema is not JSON") as e:
        grpc_stream(tiny_server.server.grpc_url, "tensorrt_llm", _inputs(
            [5, 6, 7], guided_decoding_guide_type="json_schema", guided_decoding_guide="{x"))
    assert "\n" not in str(e.value)


# --- the ensemble and the BLS: the guide inputs reach the model that serves them ---

def _text_request(eos: int, **extra: Any) -> dict[str, np.ndarray]:
    from tests.helpers.server import request

    arrays = request("def add(a, b):", 48, end_id=eos, exclude_input_in_output=True, **extra)
    for name, value in (("guided_decoding_guide_type", "json_schema"),
                        ("guided_decoding_guide", json.dumps(SCHEMA))):
        arrays[name] = np.array([[value.encode()]], dtype=object)
    return arrays


def _eos(tiny_server: Any) -> int:
    from transformers import AutoTokenizer

    return int(AutoTokenizer.from_pretrained(str(tiny_server.engine / "tokenizer")).eos_token_id)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_the_ensemble_and_the_bls_pass_the_guide_through(tiny_server: Any, model: str) -> None:
    """Through the ensemble (speculating) and the BLS without its loop: text valid under the
    schema, the same text as the guided request sent to tensorrt_llm itself."""
    import jsonschema

    got = grpc_stream(tiny_server.server.grpc_url, model, _text_request(_eos(tiny_server)))
    text = "".join(t.decode() for r in got if "text_output" in r
                   for t in r["text_output"].reshape(-1))
    jsonschema.validate(json.loads(text), SCHEMA)


def test_the_bls_loop_refuses_a_guide(tiny_server: Any) -> None:
    with pytest.raises(StreamError, match="'guided_decoding_guide_type' is not supported with "
                                          "speculative decoding") as e:
        grpc_stream(tiny_server.server.grpc_url, "tensorrt_llm_bls",
                    _text_request(_eos(tiny_server), num_draft_tokens=3))
    assert "\n" not in str(e.value)


def test_n_sequences_through_the_ensemble(tiny_server: Any) -> None:
    """``num_return_sequences`` 3 streamed through the speculating ensemble: each response
    carries ``sequence_index``; the three texts are the engine's, seeded 11, 12, 13."""
    from tests.helpers.server import request

    def sampled(seed: int, **extra: Any) -> dict[str, np.ndarray]:
        arrays = request("def add(a, b):", 12, temperature=1.0, stream=True, **extra)
        arrays["seed"] = np.array([[seed]], dtype=np.uint64)
        return arrays

    got = grpc_stream(tiny_server.server.grpc_url, "ensemble",
                      sampled(11, num_return_sequences=3))
    texts = ["", "", ""]
    for r in got:
        if "text_output" in r:
            texts[int(r["sequence_index"].reshape(-1)[0])] += r["text_output"].reshape(-1)[
                0].decode()
    alone = ["".join(t.decode() for r in grpc_stream(tiny_server.server.grpc_url, "ensemble",
                                                      sampled(s))
                     if "text_output" in r for t in r["text_output"].reshape(-1))
             for s in (11, 12, 13)]
    assert texts == alone and len(set(texts)) > 1
    assert [r["final"] for r in got].count(True) == 1
