"""The draft-target / n-gram loop of the ``tensorrt_llm_bls`` model (:mod:`bls`), as a mixin of
its ``TritonPythonModel``: the request checks, the draft and target calls (``_exec``, with the
errors that name the model and its parameter) and :meth:`SpecLoop._spec_generate`, which runs
:func:`lib.spec_loop.run` and answers with text, counts and perf outputs. The contract and its
upstream sources are in :mod:`bls`'s docstring. Copied into the repository as
``tensorrt_llm_bls/1/bls_spec.py`` (the Python backend puts that folder on ``sys.path``).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import triton_python_backend_utils as pb_utils

if TYPE_CHECKING:
    from specserve.triton.models.bls_lib import ngram, spec_loop
    from specserve.triton.models.bls_lib import request as rq
    from specserve.triton.models.bls_lib.detok import IncrementalDetokenizer
else:
    try:  # in a repository: tensorrt_llm_bls/1/lib/
        from lib import ngram, spec_loop
        from lib import request as rq
        from lib.detok import IncrementalDetokenizer
    except ImportError:  # imported from the specserve package
        from specserve.triton.models.bls_lib import ngram, spec_loop
        from specserve.triton.models.bls_lib import request as rq
        from specserve.triton.models.bls_lib.detok import IncrementalDetokenizer


class _CallError(RuntimeError):
    """A draft or target call failed (the message names the model and its parameter)."""


def _i32(v: int) -> np.ndarray[Any, Any]:
    return np.array([[v]], dtype=np.int32)


class SpecLoop:
    """What the loop needs of the model: its parameters (set in ``initialize``) and three of
    its methods (the model's own ``_keep``, ``_preprocess`` and ``_decode``)."""

    llm: str
    draft: str
    spec_mode: str
    ngram_max: int
    max_draft_len: int | None
    vocab: int | None
    llm_decoupled: bool
    draft_decoupled: bool
    decoupled: bool
    accumulate: bool
    outputs: list[str]

    def _keep(self, iterator: Any) -> Any:
        raise NotImplementedError

    def _preprocess(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def _check_spec_request(self, inputs: dict[str, np.ndarray[Any, Any]], k: int) -> None:
        if k < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {k}")
        if self.max_draft_len is not None and k > self.max_draft_len:
            raise ValueError(f"num_draft_tokens {k} exceeds the target's max_draft_len "
                             f"{self.max_draft_len} (parameter max_draft_len)")
        if self.spec_mode == "draft" and not self.draft:
            raise ValueError("num_draft_tokens > 0 needs a draft model: parameter "
                             "tensorrt_llm_draft_model_name is empty")
        if self.spec_mode not in ("draft", "ngram"):
            raise ValueError("num_draft_tokens > 0 needs a draft source: parameter "
                             "tensorrt_llm_draft_model_name or speculative_mode ngram "
                             f"(speculative_mode is {self.spec_mode!r})")
        for name in ("beam_width", "num_return_sequences"):
            if int(rq.scalar(inputs, name, 1)) > 1:
                raise ValueError(f"{name} > 1 is not supported with speculative decoding")

    def _call_error(self, role: str, model: str, message: str) -> _CallError:
        param = ("tensorrt_llm_draft_model_name" if role == "draft"
                 else "tensorrt_llm_model_name")
        if any(m in message.lower() for m in rq.MISSING):
            return _CallError(f"{role} model '{model}' (parameter {param}) is not available "
                              f"in the repository: {message}")
        return _CallError(f"{role} model '{model}' (parameter {param}): {message}")

    def _exec(self, role: str, model: str, tensors: list[Any], names: list[str],
              decoupled: bool) -> dict[str, Any]:
        """One call; ``output_ids`` (a list of new ids), ``generation_logits`` ([n, V]) and the
        last value of every other output, over all responses of a decoupled model."""
        req = pb_utils.InferenceRequest(model_name=model, inputs=tensors,
                                        requested_output_names=names)
        try:
            responses = self._keep(req.exec(decoupled=True)) if decoupled else [req.exec()]
            out: dict[str, Any] = {"output_ids": []}
            logits: list[np.ndarray[Any, Any]] = []
            for resp in responses:
                if resp.has_error():
                    raise self._call_error(role, model, resp.error().message())
                got = {t.name(): t.as_numpy().copy() for t in resp.output_tensors()}
                if not got:
                    continue
                ids = got.pop("output_ids", np.zeros((1, 1, 0), dtype=np.int32)).reshape(-1)
                n = int(got.pop("sequence_length", np.array([ids.size])).reshape(-1)[0])
                out["output_ids"].extend(int(t) for t in ids[:min(n, ids.size)])
                lg = got.pop("generation_logits", None)
                if lg is not None and lg.size:
                    logits.append(lg.reshape(-1, lg.shape[-1]))
                out.update(got)
        except _CallError:
            raise
        except Exception as e:  # exec itself failed (e.g. an unknown model)
            raise self._call_error(role, model, str(e)) from e
        if logits:
            out["generation_logits"] = np.concatenate(logits)
        return out

    def _common(self, inputs: dict[str, np.ndarray[Any, Any]], pre: dict[str, Any],
                ctx: list[int], s: spec_loop.Sampling, out_len: int, end_id: int) -> list[Any]:
        tensors = [
            pb_utils.Tensor("input_ids", np.array([ctx], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", _i32(len(ctx))),
            pb_utils.Tensor("request_output_len", _i32(out_len)),
            pb_utils.Tensor("end_id", _i32(end_id)),
            pb_utils.Tensor("exclude_input_in_output", np.array([[True]], dtype=bool)),
            pb_utils.Tensor("temperature", np.array([[s.temperature]], dtype=np.float32)),
            pb_utils.Tensor("runtime_top_k", _i32(s.top_k)),
            pb_utils.Tensor("runtime_top_p", np.array([[s.top_p]], dtype=np.float32)),
            pb_utils.Tensor("min_tokens", _i32(s.min_tokens)),
        ]
        if s.seed is not None:
            tensors.append(pb_utils.Tensor("seed", np.array([[s.seed]], dtype=np.uint64)))
        for name in ("pad_id", "bad_words_list"):
            if name in pre:
                tensors.append(pb_utils.Tensor(name, pre[name]))
        tensors += [pb_utils.Tensor(rq.LLM[k], rq.as_batch(inputs[k])) for k in rq.SPEC_PASS
                    if k in inputs]
        return tensors

    def _spec_generate(self, inputs: dict[str, np.ndarray[Any, Any]], emit: Any, k: int,
                       arrival: int) -> None:
        self._check_spec_request(inputs, k)
        pre = self._preprocess(inputs)
        n_in = int(pre["input_lengths"].reshape(-1)[0])
        prompt = tuple(int(t) for t in pre["input_ids"].reshape(-1)[:n_in])
        end_id = int(pre["end_id"].reshape(-1)[0]) if "end_id" in pre else -1
        seed = rq.scalar(inputs, "seed", None)
        req = spec_loop.SpecRequest(
            prompt=prompt, max_tokens=int(rq.scalar(inputs, "max_tokens", 0)), num_draft_tokens=k,
            sampling=spec_loop.Sampling(
                temperature=float(rq.scalar(inputs, "temperature", 0.0)),
                top_k=int(rq.scalar(inputs, "top_k", 0)),
                top_p=float(rq.scalar(inputs, "top_p", 1.0)),
                seed=None if seed is None else int(seed)),
            end_id=end_id, stop_words=rq.word_lists(pre.get("stop_words_list")),
            min_tokens=int(rq.scalar(inputs, "min_tokens", 0)))
        use_logits = bool(rq.scalar(inputs, "use_draft_logits", False))
        streaming = self.decoupled and bool(rq.scalar(inputs, "stream", False))
        counts_in = bool(rq.scalar(inputs, "return_num_input_tokens", False))
        counts_out = bool(rq.scalar(inputs, "return_num_output_tokens", False))
        checked_vocab = [self.vocab is None]
        draft: spec_loop.DraftFn

        def model_draft(ctx: list[int], n: int, s: spec_loop.Sampling) -> tuple[list[int], Any]:
            want = use_logits or not checked_vocab[0]
            tensors = self._common(inputs, pre, ctx, s, n, -1)
            tensors.append(pb_utils.Tensor("return_generation_logits",
                                           np.array([[want]], dtype=bool)))
            names = ["output_ids", "sequence_length"] + (["generation_logits"] if want else [])
            out = self._exec("draft", self.draft, tensors, names, self.draft_decoupled)
            tokens: list[int] = out["output_ids"]
            logits = out.get("generation_logits")
            if self.vocab is not None and logits is not None and tokens:
                if logits.shape[-1] != self.vocab:
                    raise ValueError(
                        f"draft model '{self.draft}' has a vocabulary of {logits.shape[-1]} "
                        f"(its generation_logits), the target's is {self.vocab} (parameter "
                        "tensorrt_llm_vocab_size): draft and target must share the tokenizer")
                checked_vocab[0] = True
            bad = next((t for t in tokens if self.vocab is not None and not
                        0 <= t < self.vocab), None)
            if bad is not None:
                raise ValueError(f"draft model '{self.draft}' proposed token id {bad}, outside "
                                 f"the target's vocabulary ({self.vocab})")
            return tokens, (logits if use_logits else None)

        def ngram_draft(ctx: list[int], n: int, s: spec_loop.Sampling) -> tuple[list[int], Any]:
            return ngram.propose(ctx, n, self.ngram_max), None

        draft = ngram_draft if self.spec_mode == "ngram" else model_draft

        def target(ctx: list[int], drafts: list[int], logits: Any,
                   s: spec_loop.Sampling) -> tuple[list[int], int, int]:
            tensors = self._common(inputs, pre, ctx, s, len(drafts) + 1, end_id)
            if "stop_words_list" in pre:
                tensors.append(pb_utils.Tensor("stop_words_list", pre["stop_words_list"]))
            if drafts:
                tensors.append(pb_utils.Tensor("draft_input_ids",
                                               np.array([drafts], dtype=np.int32)))
            if drafts and logits is not None:
                tensors.append(pb_utils.Tensor(
                    "draft_logits", np.ascontiguousarray(logits, dtype=np.float32)[None]))
            # Exactly the outputs the target produces (no perf outputs asked: see _keep)
            out = self._exec("target", self.llm, tensors, ["output_ids", "sequence_length"],
                             self.llm_decoupled)
            tokens: list[int] = out["output_ids"]
            # a rejected draft's position never holds the draft: the prefix is what was accepted
            return tokens, spec_loop.accepted_prefix(drafts, tokens), len(drafts)

        detok = IncrementalDetokenizer(self._decode)
        streamed: list[str] = []

        def on_iteration(it: spec_loop.Iteration) -> None:
            if not streaming or not it.new_tokens:
                return
            piece = detok.push(it.new_tokens)
            streamed.append(piece)
            arrays: dict[str, Any] = {"text_output": "".join(streamed) if self.accumulate
                                      else piece}
            if counts_out:
                arrays["num_output_tokens"] = len(it.new_tokens)
            if counts_in:
                arrays["num_input_tokens"] = len(prompt)
            emit(self._response(arrays), False)

        scheduled = time.monotonic_ns()
        result = spec_loop.run(req, draft, target, on_iteration)
        exclude = bool(rq.scalar(inputs, "exclude_input_in_output", False))
        final: dict[str, Any]
        if streaming:
            rest = detok.flush()
            streamed.append(rest)
            final = {"text_output": "".join(streamed) if self.accumulate else rest}
            n_out = 0
        else:
            ids = result.tokens if exclude else [*prompt, *result.tokens]
            final = {"text_output": self._decode(ids)}
            n_out = len(ids)
        if counts_out:
            final["num_output_tokens"] = n_out
        if counts_in:
            final["num_input_tokens"] = len(prompt)
        if bool(rq.scalar(inputs, "return_perf_metrics", False)):
            final.update(
                arrival_time_ns=np.array([[arrival]], dtype=np.int64),
                first_scheduled_time_ns=np.array([[scheduled]], dtype=np.int64),
                first_token_time_ns=np.array([[result.first_token_ns or scheduled]],
                                             dtype=np.int64),
                last_token_time_ns=np.array([[result.last_token_ns or scheduled]],
                                            dtype=np.int64),
                acceptance_rate=np.array([[result.acceptance_rate]], dtype=np.float32),
                total_accepted_draft_tokens=_i32(result.accepted),
                total_draft_tokens=_i32(result.drafted),
                spec_stats_json=json.dumps(result.stats_dict(), sort_keys=True))
        emit(self._response(final), False)

    def _response(self, values: dict[str, Any]) -> Any:
        """A response of the declared outputs among ``values`` (str -> BYTES, int -> INT32)."""
        tensors = []
        for name, v in values.items():
            if name not in self.outputs:
                continue
            if isinstance(v, str):
                v = np.array([[v.encode("utf-8")]], dtype=np.object_)
            elif isinstance(v, int):
                v = _i32(v)
            tensors.append(pb_utils.Tensor(name, v))
        return pb_utils.InferenceResponse(output_tensors=tensors)
