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
