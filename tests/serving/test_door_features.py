"""One table of request features per door: the same requests (greedy, sampled with a seed,
n = 2, top logprobs, a JSON schema guide, Predicted Outputs' prediction, num_draft_tokens 0,
stop strings, and bad values of each) go through every door's adapter, without a server, and
each door's outcome (served, refused with which error, or not carried by its protocol) is
checked against :data:`EXPECTED`.

The doors and their adapters, all real code:

- ``ensemble``: the rendered ``ensemble/config.pbtxt`` (its declared inputs and its steps'
  input/output maps, applied as Triton's ensemble scheduler applies them), the ``preprocessing``
  model's ``execute`` (over a stand-in ``triton_python_backend_utils``), then the
  ``tensorrt_llm`` model's request checks (:func:`specserve.triton.llm_io.admit`);
- ``bls``: the rendered ``tensorrt_llm_bls/config.pbtxt``'s declared inputs, the BLS's routing
  (``bls_lib/request.py`` ``route`` / ``target_inputs``), preprocessing, then either the
  speculation loop's checks (``bls_lib/spec_io.py`` ``check_spec_request``) or the target's;
- ``tensorrt_llm``: the model's declared inputs and :func:`specserve.triton.llm_io.admit`;
- ``dynamo``: the Dynamo worker's mapping of a preprocessed request
  (:func:`specserve.frontends.dynamo_request.admit`), the prediction and ``num_draft_tokens``
  in its ``annotations`` (where Dynamo's frontend puts the client's ``nvext.annotations``).

A Triton model refuses an input its config does not declare (Triton's own error,
"unexpected inference input"); a field Dynamo's preprocessed request has no place for never
reaches the worker ("not carried"). Every door serves every feature and refuses every bad value
alike, but for the differences a door's protocol forces, named in :data:`FORCED`; a door
dropping a feature fails here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.errors import SpecserveError
from specserve.runtime.params import SamplingParams
from specserve.serving.request import EngineLimits, LlmRequest
from tests.helpers.tiny import TinyCheckpoint

SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                     "required": ["ok"]})
PROMPT = "hello world"
MAX_TOKENS = 8


@dataclass(frozen=True)
class Case:
    """One request, as an OpenAI client would put it."""

    temperature: float = 0.0
    seed: int | None = None
    n: int = 1
    top_logprobs: int | None = None  # logprobs on, with this many alternatives
    guide: tuple[str, str] | None = None  # (guide type, guide)
    prediction: str | None = None
    num_draft_tokens: int | None = None
    stop: tuple[str, ...] = ()


CASES: dict[str, Case] = {
    "greedy": Case(),
    "sampled with seed": Case(temperature=0.8, seed=7),
    "n = 2": Case(temperature=0.8, seed=7, n=2),
    "top logprobs": Case(top_logprobs=3),
    "json schema": Case(guide=("json_schema", SCHEMA)),
    "prediction": Case(prediction="hello"),
    "num_draft_tokens 0": Case(num_draft_tokens=0),
    "stop strings": Case(stop=(".",)),
    "stop strings, n = 2": Case(temperature=0.8, seed=7, n=2, stop=(".",)),
    "bad: temperature -1": Case(temperature=-1.0),
    "bad: n = 17": Case(n=17),
    "bad: top logprobs 21": Case(top_logprobs=21),
    "bad: malformed schema": Case(guide=("json_schema", "{not json")),
    "bad: prediction too long": Case(prediction="hello " * 200),
    "bad: num_draft_tokens -1": Case(num_draft_tokens=-1),
}

DOORS = ("ensemble", "bls", "tensorrt_llm", "dynamo")
SERVED = "served"
NOT_CARRIED = "not carried"


def _unknown(name: str, model: str) -> str:
    return f"refused: unexpected inference input '{name}' for model '{model}'"


# Differences a door's protocol forces (each one named where EXPECTED records it):
FORCED = {
    # Dynamo's frontend applies stop strings itself, with ONE matcher per request, to
    # token-only chunks; with n > 1 the worker sends each choice's text, which that matcher
    # does not see, so the worker refuses the combination rather than ignore the stops.
    ("stop strings, n = 2", "dynamo"),
}

_N_RANGE = r"refused: n \(num_return_sequences\) must be in \[1, 16\], got 17"
_TOP = r"refused: top_logprobs must be in \[0, 20\], got 21"
_TEMP = r"refused: temperature must be >= 0, got -1(\.0)?"
_SCHEMA_BAD = r"refused: guided_decoding_guide: the JSON schema is not JSON \(.*\)"
_PRED_LONG = r"refused: input 'prediction' has \d+ tokens, more than the engine's max_seq_len \d+"
_DRAFTS_BAD = r"refused: num_draft_tokens must be >= 0, got -1"

# case -> door -> "served", "not carried", or a regex of the refusal (re.fullmatch)
EXPECTED: dict[str, dict[str, str]] = {
    "greedy": dict.fromkeys(DOORS, SERVED),
    "sampled with seed": dict.fromkeys(DOORS, SERVED),
    "n = 2": dict.fromkeys(DOORS, SERVED),
    "top logprobs": dict.fromkeys(DOORS, SERVED),
    "json schema": dict.fromkeys(DOORS, SERVED),
    # Dynamo: the prediction and num_draft_tokens travel in nvext.annotations
    # (frontends/dynamo_request.py: its frontend refuses OpenAI's top-level prediction)
    "prediction": dict.fromkeys(DOORS, SERVED),
    # the BLS's num_draft_tokens is its own loop's (TensorRT-LLM's BLS input): 0 turns the
    # loop off and forwards the request, with num_draft_tokens 0, to the reference target
    "num_draft_tokens 0": dict.fromkeys(DOORS, SERVED),
    "stop strings": dict.fromkeys(DOORS, SERVED),
    "stop strings, n = 2": {
        "ensemble": SERVED, "bls": SERVED, "tensorrt_llm": SERVED,
        "dynamo": r"refused: stop_conditions.stop \(stop strings\) with sampling_options.n > 1 "
                  r"is not supported by the specserve worker"},
    "bad: temperature -1": dict.fromkeys(DOORS, _TEMP),
    "bad: n = 17": dict.fromkeys(DOORS, _N_RANGE),
    "bad: top logprobs 21": dict.fromkeys(DOORS, _TOP),
    "bad: malformed schema": dict.fromkeys(DOORS, _SCHEMA_BAD),
    "bad: prediction too long": dict.fromkeys(DOORS, _PRED_LONG),
    "bad: num_draft_tokens -1": dict.fromkeys(DOORS, _DRAFTS_BAD),
}


# --- the doors ---------------------------------------------------------------------------------

# what a door hands the serving core: the request and its sampling parameters
Admitted = tuple[LlmRequest, SamplingParams]
# an adapter's answer: admitted, NOT_CARRIED, or None (served by the BLS's own loop)
Answer = Admitted | str | None


@dataclass
class Doors:
    """A reference repository's configs and the pieces each door's adapter needs."""

    configs: dict[str, Any]  # model name -> its parsed config.pbtxt
    pre: Any  # the preprocessing model (initialized over the stand-in pb_utils)
    tok: Any  # the engine's tokenizer (transformers)
    limits: EngineLimits
    guides: Callable[[str, str], Any]

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tok(text, add_special_tokens=False)["input_ids"]]

    def decoupled(self, model: str) -> bool:
        return bool(self.configs[model].model_transaction_policy.decoupled)

    def declared(self, model: str, inputs: dict[str, Any]) -> None:
        names = {i.name for i in self.configs[model].input}
        for name in inputs:
            if name not in names:
                raise ValueError(f"unexpected inference input '{name}' for model '{model}'")

    def preprocess(self, pre_inputs: dict[str, Any]) -> dict[str, Any]:
        """preprocessing's outputs (its own tensor names), or ValueError with its error."""
        from tests.reliability.test_fuzz import _Request

        (resp,) = self.pre.execute([_Request(pre_inputs)])
        if resp.error is not None:
            raise ValueError(resp.error.message())
        return dict(resp.tensors)

    def llm(self, arrays: dict[str, Any], model: str = "tensorrt_llm") -> Admitted:
        from google.protobuf import json_format

        from specserve.triton.llm_io import admit
        from specserve.triton.model_params import ModelParams

        cfg = json_format.MessageToDict(self.configs[model], preserving_proto_field_name=True)
        params = ModelParams.from_config(cfg)
        return admit(arrays, params, self.decoupled(model), self.limits, self.encode,
                     self.guides)


def _client_inputs(case: Case, streaming_name: str) -> dict[str, Any]:
    """The inputs an ensemble / BLS client sends (TensorRT-LLM's names, batch dim 1)."""
    out: dict[str, Any] = {
        "text_input": np.array([[PROMPT.encode()]], dtype=object),
        "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
        streaming_name: np.array([[True]]),
        "temperature": np.array([[case.temperature]], dtype=np.float32),
    }
    out.update(_common(case))
    if case.stop:
        out["stop_words"] = np.array([[s.encode() for s in case.stop]], dtype=object)
    return out


def _common(case: Case) -> dict[str, Any]:
    """The inputs every Triton door names alike."""
    out: dict[str, Any] = {}
    if case.seed is not None:
        out["seed"] = np.array([[case.seed]], dtype=np.uint64)
    if case.n != 1:
        out["num_return_sequences"] = np.array([[case.n]], dtype=np.int32)
    if case.top_logprobs is not None:
        out["return_log_probs"] = np.array([[True]])
        if case.top_logprobs:
            out["num_top_log_probs"] = np.array([[case.top_logprobs]], dtype=np.int32)
    if case.guide is not None:
        out["guided_decoding_guide_type"] = np.array([[case.guide[0].encode()]], dtype=object)
        out["guided_decoding_guide"] = np.array([[case.guide[1].encode()]], dtype=object)
    if case.prediction is not None:
        out["prediction"] = np.array([[case.prediction.encode()]], dtype=object)
    if case.num_draft_tokens is not None:
        out["num_draft_tokens"] = np.array([[case.num_draft_tokens]], dtype=np.int32)
    return out


def ensemble_door(doors: Doors, case: Case) -> Answer:
    """Triton's ensemble scheduler over the rendered config: declared inputs, then each step's
    input_map (model input <- ensemble tensor) and output_map (model output -> tensor)."""
    inputs = _client_inputs(case, "stream")
    doors.declared("ensemble", inputs)
    tensors = dict(inputs)
    admitted = None
    for step in doors.configs["ensemble"].ensemble_scheduling.step:
        if step.model_name == "postprocessing":
            continue
        model_in = {key: tensors[value] for key, value in step.input_map.items()
                    if value in tensors}
        if step.model_name == "preprocessing":
            out = doors.preprocess(model_in)
            tensors.update({value: out[key] for key, value in step.output_map.items()
                            if key in out})
        else:
            admitted = doors.llm(model_in, step.model_name)
    return admitted


def bls_door(doors: Doors, case: Case) -> Answer:
    from specserve.triton.models.bls_lib import request as rq
    from specserve.triton.models.bls_lib import spec_io

    inputs = {k: v.reshape(-1) for k, v in _client_inputs(case, "stream").items()}
    doors.declared("tensorrt_llm_bls", inputs)
    decoupled = doors.decoupled("tensorrt_llm_bls")
    k = rq.route(inputs, decoupled)
    pre = doors.preprocess({rq.PRE[n]: rq.as_batch(v) for n, v in inputs.items() if n in rq.PRE})
    pre = {rq.PRE_OUT[n]: v for n, v in pre.items() if n in rq.PRE_OUT}
    params = spec_io.BlsParams.from_params(
        {key: p.string_value for key, p in doors.configs["tensorrt_llm_bls"].parameters.items()})
    if k != 0:
        spec_io.check_spec_request(params, inputs, k)
        return None
    return doors.llm(rq.target_inputs(inputs, pre, decoupled, params.reference_target))


def tensorrt_llm_door(doors: Doors, case: Case) -> Answer:
    from specserve.triton.models.preprocessing import word_list

    ids = doors.encode(PROMPT)
    arrays: dict[str, Any] = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
        "streaming": np.array([[True]]),
        "temperature": np.array([[case.temperature]], dtype=np.float32),
    }
    arrays.update(_common(case))
    if case.stop:  # the client tokenizes its stop words (TensorRT-LLM's [1, 2, L] word list)
        arrays["stop_words_list"] = word_list(doors.pre.tok, list(case.stop))[None]
    doors.declared("tensorrt_llm", arrays)
    return doors.llm(arrays)


def dynamo_door(doors: Doors, case: Case) -> Answer:
    """The worker's mapping of the preprocessed request Dynamo's frontend hands it (the
    client's ``nvext.annotations`` arrive as its ``annotations``)."""
    from specserve.frontends.dynamo_request import admit

    notes = []
    if case.prediction is not None:
        notes.append(f"prediction:{case.prediction}")
    if case.num_draft_tokens is not None:
        notes.append(f"num_draft_tokens:{case.num_draft_tokens}")
    guided = None
    if case.guide is not None:
        kind, text = case.guide
        guided = {{"json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}[kind]: text}
    eos = doors.limits.eos
    request = {
        "token_ids": doors.encode(PROMPT),
        "stop_conditions": {"max_tokens": MAX_TOKENS, "stop": list(case.stop) or None,
                            "stop_token_ids_hidden": [] if eos is None else [eos]},
        "sampling_options": {"n": case.n, "temperature": case.temperature, "seed": case.seed,
                             "guided_decoding": guided},
        "output_options": {"logprobs": case.top_logprobs},
        "eos_token_ids": [] if eos is None else [eos],
        "annotations": notes,
    }
    return admit(request, doors.limits, doors.guides, doors.encode)


ADAPTERS: dict[str, Callable[[Doors, Case], Answer]] = {
    "ensemble": ensemble_door,
    "bls": bls_door,
    "tensorrt_llm": tensorrt_llm_door,
    "dynamo": dynamo_door,
}


def outcome(doors: Doors, door: str, case: Case) -> str:
    """"served", "served without <features>" (the door took the request and lost them),
    NOT_CARRIED or "refused: <error>"."""
    try:
        got = ADAPTERS[door](doors, case)
    except (ValueError, SpecserveError) as e:
        return f"refused: {e}"
    if isinstance(got, str):
        return got
    lost = [] if got is None else dropped(doors, door, case, *got)
    return f"served without {', '.join(lost)}" if lost else SERVED


def dropped(doors: Doors, door: str, case: Case, req: LlmRequest,
            params: SamplingParams) -> list[str]:
    """The features of ``case`` that did not reach the serving core."""
    want_top = case.top_logprobs or 0
    checks = {
        "temperature": abs(params.temperature - case.temperature) < 1e-6,
        "seed": params.seed == case.seed,
        "n": req.n == case.n,
        "logprobs": params.logprobs == (case.top_logprobs is not None),
        "top_logprobs": params.top_logprobs == want_top,
        "guide": (params.guide is not None) == (case.guide is not None),
        "prediction": bool(params.prediction) == (case.prediction is not None),
        "num_draft_tokens": params.num_draft_tokens == case.num_draft_tokens,
        # Dynamo's frontend applies stop strings itself: the worker never sees them as ids
        "stop": door == "dynamo" or all(
            set(doors.encode(s)) <= set(params.stop_token_ids) for s in case.stop),
    }
    return [name for name, ok in checks.items() if not ok]


@pytest.fixture(scope="module")
def doors(tiny_ckpt: TinyCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    from specserve.engine_record import read_engine_record
    from specserve.runtime.grammar import GuideCompiler
    from specserve.runtime.loader import load_tokenizer
    from specserve.serving.engine import engine_limits
    from specserve.triton.repository import write_repository
    from tests.helpers.fake_module import installed
    from tests.helpers.server import make_tiny_engine
    from tests.reliability.test_fuzz import _fake_pb_utils

    tmp = tmp_path_factory.mktemp("doors")
    engine = make_tiny_engine(tiny_ckpt, tmp / "engine", "draft")
    repo = write_repository(engine, tmp / "repo")
    configs = {d.name: text_format.Parse((d / "config.pbtxt").read_text(),
                                         model_config_pb2.ModelConfig())
               for d in Path(repo).iterdir() if (d / "config.pbtxt").is_file()}

    tok = load_tokenizer(tiny_ckpt.target)
    vocab = json.loads((Path(engine) / "target" / "config.json").read_text())["vocab_size"]
    limits = engine_limits(read_engine_record(Path(engine)), vocab, tok.eos_token_id)
    guides = GuideCompiler(tok, vocab, [tok.eos_token_id])
    with installed(_fake_pb_utils(), reimport=("specserve.triton.models.preprocessing",)):
        from specserve.triton.models import preprocessing

        pre = preprocessing.TritonPythonModel()
        pre.initialize({"model_repository": str(repo / "preprocessing"),
                        "model_config": json.dumps(json_format.MessageToDict(
                            configs["preprocessing"], preserving_proto_field_name=True))})
        yield Doors(configs, pre, tok, limits, guides.compile_text)


def table(doors: Doors) -> dict[str, dict[str, str]]:
    return {name: {door: outcome(doors, door, case) for door in DOORS}
            for name, case in CASES.items()}


def mismatches(got: dict[str, dict[str, str]]) -> list[str]:
    bad = []
    for name, row in EXPECTED.items():
        for door, want in row.items():
            have = got[name][door]
            ok = have == want if not want.startswith("refused") else \
                re.fullmatch(want, have) is not None
            if not ok:
                bad.append(f"{name} @ {door}: expected {want!r}, got {have!r}")
    return bad


def test_every_door_serves_or_refuses_each_feature_as_recorded(doors: Doors) -> None:
    assert set(EXPECTED) == set(CASES) and all(set(r) == set(DOORS) for r in EXPECTED.values())
    got = table(doors)
    assert not mismatches(got), "\n".join(mismatches(got))


def test_every_difference_between_doors_is_named() -> None:
    """A feature served at one door and not at another is forced by a protocol
    (:data:`FORCED`); no other gap between doors."""
    for name, row in EXPECTED.items():
        served = {d for d, v in row.items() if v == SERVED}
        if 0 < len(served) < len(DOORS):
            for door in set(DOORS) - served:
                assert (name, door) in FORCED, (name, door)
    for name, row in EXPECTED.items():  # refusals of a bad value: the value, at every door
        if name.startswith("bad:"):
            assert SERVED not in row.values() and len(set(row.values())) == 1, name


def test_doors_that_serve_a_request_sample_it_alike(doors: Doors) -> None:
    """Where every door serves a request, each hands the core the same sampling: temperature
    and top_p as FP32 (Triton's tensor type; the Dynamo worker rounds them the same way), the
    same seed, n and log-probabilities, so the same request samples the same tokens."""
    for name, case in CASES.items():
        got = {door: ADAPTERS[door](doors, case) for door in DOORS
               if EXPECTED[name][door] == SERVED}
        seen = {door: (a[1].temperature, a[1].top_p, a[1].top_k, a[1].seed, a[0].n,
                       a[1].logprobs, a[1].top_logprobs, a[1].max_tokens, a[1].min_tokens)
                for door, a in got.items() if isinstance(a, tuple)}
        assert len(set(seen.values())) <= 1, (name, seen)


def test_a_door_dropping_a_feature_fails_the_table(doors: Doors) -> None:
    """The table notices one door losing one feature: the Dynamo worker no longer mapping
    logprobs or the prediction annotation, the BLS no longer forwarding the guide or top
    logprobs, the ensemble declaring top logprobs or the prediction but no longer passing them
    on."""
    from specserve.frontends import dynamo_request
    from specserve.triton.models.bls_lib import request as rq

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamo_request, "OUTPUT_SERVED", frozenset())
        assert any(m.startswith("top logprobs @ dynamo") for m in mismatches(table(doors)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamo_request, "ANNOTATIONS", ("num_draft_tokens",))
        assert "prediction @ dynamo: expected 'served', got 'served without prediction'" \
            in mismatches(table(doors))
    for lost, case in (("guided_decoding_guide", "json schema"),
                       ("num_top_log_probs", "top logprobs")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(rq, "LLM", {k: v for k, v in rq.LLM.items() if k != lost})
            assert any(m.startswith(f"{case} @ bls") for m in mismatches(table(doors)))
    ensemble = doors.configs["ensemble"]
    steps = ensemble.ensemble_scheduling.step
    llm = next(s for s in steps if s.model_name == "tensorrt_llm")
    saved = dict(llm.input_map)
    try:
        del llm.input_map["num_top_log_probs"]
        del llm.input_map["prediction"]
        got = mismatches(table(doors))
        assert "top logprobs @ ensemble: expected 'served', got 'served without top_logprobs'" \
            in got
        assert "prediction @ ensemble: expected 'served', got 'served without prediction'" in got
    finally:
        llm.input_map.update(saved)

