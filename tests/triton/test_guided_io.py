"""Structured output through the reference ``tensorrt_llm`` model's request path:
TensorRT-LLM's inputs ``guided_decoding_guide_type`` / ``guided_decoding_guide``
(tensorrtllm_backend ``tensorrt_llm/1/model.py`` ``get_guided_decoding_params_from_request``:
types ``json``, ``json_schema``, ``regex``, ``ebnf_grammar``) checked by ``llm_io.admit`` with
the tiny model's real tokenizer and xgrammar, run by the serving loop (a real Scheduler, n-gram
speculation): the guided answer is valid JSON under the schema, the unguided neighbour is
unaffected; a bad guide is one error line for that request only."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.grammar import GuideCompiler
from specserve.runtime.loader import load_tokenizer
from specserve.runtime.model import load_model
from specserve.runtime.proposers import NgramProposer
from specserve.serving.request import EngineLimits
from tests.helpers.serving import serve_requests
from tests.helpers.tiny import TinyCheckpoint
from tests.serving.test_loop import Recorder

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0,
                                                 "maximum": 9}},
          "required": ["ok", "n"]}
PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]


@pytest.fixture(scope="module")
def engine(tiny_ckpt: TinyCheckpoint) -> tuple[SpecDecoder, Any, GuideCompiler]:
    dec = SpecDecoder(load_model(tiny_ckpt.target), NgramProposer(3))
    tok = load_tokenizer(tiny_ckpt.target)
    return dec, tok, GuideCompiler(tok, dec.target.cfg.vocab_size, [tok.eos_token_id])


def _arrays(n: int, **inputs: Any) -> dict[str, np.ndarray]:
    arrays = {"input_ids": np.array([PROMPT], dtype=np.int32),
              "request_output_len": np.array([[n]], dtype=np.int32),
              "exclude_input_in_output": np.array([[True]])}
    arrays.update({k: np.array([[v.encode()]], dtype=object) for k, v in inputs.items()})
    return arrays


def _run(engine: tuple[SpecDecoder, Any, GuideCompiler],
         reqs: list[dict[str, np.ndarray]]) -> list[Recorder]:
    dec, tok, guides = engine
    limits = EngineLimits(vocab_size=dec.target.cfg.vocab_size, max_draft_len=3,
                          max_seq_len=96, eos=tok.eos_token_id)
    return serve_requests(dec, reqs, limits, lambda ids: str(tok.decode(ids)),
                          guides=guides.compile_text)


def test_a_json_schema_request_answers_valid_json(engine: tuple[SpecDecoder, Any,
                                                                GuideCompiler]) -> None:
    import jsonschema

    dec, tok, _ = engine
    guided, plain = _run(engine, [
        _arrays(48, guided_decoding_guide_type="json_schema",
                guided_decoding_guide=json.dumps(SCHEMA)),
        _arrays(10)])
    arrays, error, _ = guided.got[-1]
    assert error is None and arrays is not None
    jsonschema.validate(json.loads(tok.decode(arrays["output_ids"][0, 0].tolist())), SCHEMA)
    want = dec.generate([PROMPT], SamplingParams(max_tokens=10, end_id=tok.eos_token_id))[0]
    assert plain.got[-1][0] is not None
    assert plain.got[-1][0]["output_ids"][0, 0].tolist() == want.token_ids


def test_guide_types_json_and_regex(engine: tuple[SpecDecoder, Any, GuideCompiler]) -> None:
    _, tok, _ = engine
    obj, rx = _run(engine, [_arrays(48, guided_decoding_guide_type="json"),
                            _arrays(16, guided_decoding_guide_type="regex",
                                    guided_decoding_guide="(yes|no)")])
    for s in (obj, rx):
        assert s.got[-1][1] is None and s.got[-1][0] is not None
    text = tok.decode(rx.got[-1][0]["output_ids"][0, 0].tolist())
    assert text in ("yes", "no")
    # "json" is xgrammar's built-in JSON grammar (any JSON value, unbounded): a random model
    # need not close it within 48 tokens, but it starts as JSON does
    start = tok.decode(obj.got[-1][0]["output_ids"][0, 0].tolist()).lstrip()[:1]
    assert start and start in '{["-0123456789tfn'



@pytest.mark.parametrize(("inputs", "message"), [
    ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "{oops"},
     "the JSON schema is not JSON"),
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "(a"},
     "guided_decoding_guide (regex): Regex parsing error"),
    ({"guided_decoding_guide_type": "xml", "guided_decoding_guide": "<a/>"},
     "guided_decoding_guide_type must be one of json, json_schema, regex, ebnf_grammar"),
    ({"guided_decoding_guide": "[0-9]+"},
     "input 'guided_decoding_guide' needs 'guided_decoding_guide_type'"),
])
def test_bad_guides_fail_that_request_only(engine: tuple[SpecDecoder, Any, GuideCompiler],
                                           inputs: dict[str, str], message: str) -> None:
    bad, good = _run(engine, [_arrays(8, **inputs), _arrays(8)])
    assert len(bad.got) == 1 and bad.got[0][1] is not None and message in bad.got[0][1]
    assert "\n" not in bad.got[0][1]
    assert good.got[-1][1] is None and good.got[-1][0] is not None
