"""Triton Python model ``tensorrt_llm_bls``: preprocessing -> tensorrt_llm -> postprocessing in one
model (Business Logic Scripting), TensorRT-LLM 1.2.1 names and parameters.

Self-contained (copied into the repository as ``tensorrt_llm_bls/1/model.py``). Decoupled: one
thread per request, inputs copied in ``execute()`` first (``triton-on-cpu.md`` §2). The engine's
responses are decoded one by one (or, with ``accumulate_tokens``, all tokens so far), and the perf
and token-count outputs are forwarded. Draft-target speculation through the BLS
(``num_draft_tokens`` > 0 with ``tensorrt_llm_draft_model_name``) is not implemented here.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# BLS input -> (model, input name)
_PRE = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
        "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
_LLM = {"exclude_input_in_output": "exclude_input_in_output", "top_k": "runtime_top_k",
        "top_p": "runtime_top_p", "temperature": "temperature", "length_penalty": "len_penalty",
        "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
        "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
        "seed": "seed", "return_perf_metrics": "return_perf_metrics",
        "return_num_input_tokens": "return_num_input_tokens",
        "return_num_output_tokens": "return_num_output_tokens", "beam_width": "beam_width",
        "num_return_sequences": "num_return_sequences", "stream": "streaming"}
_PRE_OUT = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths",
            "REQUEST_OUTPUT_LEN": "request_output_len", "BAD_WORDS_IDS": "bad_words_list",
            "STOP_WORDS_IDS": "stop_words_list", "OUT_END_ID": "end_id", "OUT_PAD_ID": "pad_id"}
_FORWARD = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
            "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens",
            "total_draft_tokens", "num_input_tokens", "num_output_tokens", "spec_stats_json")


DEFAULT_MAX_INFLIGHT = 256  # decoupled requests served at once (parameter specserve_max_inflight)


def _busy(limit: int) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
        f"tensorrt_llm_bls: server busy: {limit} requests in flight "
        "(specserve_max_inflight); retry later"))


def _param(params: dict[str, str], key: str, default: str) -> str:
    value = params.get(key, "")
    return default if not value or value.startswith("${") else value


def _as_batch(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """BLS inputs reshaped to scalars arrive as [1]; models want [1, 1]."""
    return a.reshape(1, -1) if a.ndim == 1 else a


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.llm = _param(params, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft = _param(params, "tensorrt_llm_draft_model_name", "")
        self.accumulate = _param(params, "accumulate_tokens", "false").lower() in ("true", "1")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.outputs = [o["name"] for o in cfg.get("output", [])]
        # One thread per in-flight decoupled request, bounded: past the bound a request fails
        # at once with "server busy" and the server stays up.
        self.max_inflight = max(1, int(_param(params, "specserve_max_inflight",
                                              str(DEFAULT_MAX_INFLIGHT))))
        self.slots = threading.BoundedSemaphore(self.max_inflight)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        responses = []
        for request in requests:
            inputs = {t.name(): t.as_numpy().copy() for t in request.inputs()}
            if self.decoupled:
                sender = request.get_response_sender()
                if not self.slots.acquire(blocking=False):
                    sender.send(_busy(self.max_inflight),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                threading.Thread(target=self._serve_slot, args=(inputs, sender),
                                 daemon=True).start()
            else:
                collected: list[Any] = []
                self._serve(inputs, None, collected)
                responses.append(collected[-1] if collected else pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("tensorrt_llm_bls: no output")))
        return None if self.decoupled else responses

    def _serve_slot(self, inputs: dict[str, np.ndarray[Any, Any]], sender: Any) -> None:
        try:
            self._serve(inputs, sender)
        finally:
            self.slots.release()

    def _serve(self, inputs: dict[str, np.ndarray[Any, Any]], sender: Any,
               collected: list[Any] | None = None) -> None:
        def emit(resp: Any, final: bool) -> None:
            if collected is not None:  # non-decoupled: one response, the last one wins
                collected[:] = [resp]
            else:
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                sender.send(resp, flags=flags)

        try:
            self._generate(inputs, emit)
            if sender is not None:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            emit(pb_utils.InferenceResponse(output_tensors=[],
                                            error=pb_utils.TritonError(f"tensorrt_llm_bls: {e}")),
                 True)

    def _generate(self, inputs: dict[str, np.ndarray[Any, Any]], emit: Any) -> None:
        drafts = inputs.get("num_draft_tokens")
        if drafts is not None and int(drafts.reshape(-1)[0]) > 0:
            raise ValueError("num_draft_tokens > 0 (draft-target through the BLS) is not "
                             "implemented by specserve's BLS model")
        pre_in = [pb_utils.Tensor(_PRE[k], _as_batch(v)) for k, v in inputs.items() if k in _PRE]
        pre = pb_utils.InferenceRequest(model_name="preprocessing", inputs=pre_in,
                                        requested_output_names=list(_PRE_OUT)).exec()
        if pre.has_error():
            raise RuntimeError(pre.error().message())
        llm_in = [pb_utils.Tensor(_PRE_OUT[t.name()], t.as_numpy())
                  for t in pre.output_tensors()]
        llm_in += [pb_utils.Tensor(_LLM[k], _as_batch(v)) for k, v in inputs.items() if k in _LLM]
        if not self.decoupled:
            llm_in = [t for t in llm_in if t.name() != "streaming"]
        wanted = ["output_ids", "sequence_length", *[o for o in _FORWARD if o in self.outputs]]
        llm = pb_utils.InferenceRequest(model_name=self.llm, inputs=llm_in,
                                        requested_output_names=wanted)
        seen: list[np.ndarray[Any, Any]] = []
        for resp in llm.exec(decoupled=True):  # also fine for a non-decoupled engine model
            if resp.has_error():
                raise RuntimeError(resp.error().message())
            if not resp.output_tensors():
                continue  # the empty final response of a decoupled exec
            emit(self._text_response(resp, seen), False)

    def _text_response(self, resp: Any, seen: list[np.ndarray[Any, Any]]) -> Any:
        ids = pb_utils.get_output_tensor_by_name(resp, "output_ids").as_numpy()  # [1, beams, T]
        lens = pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy()
        if self.accumulate:
            seen.append(ids[:, :, : int(lens.reshape(-1)[0])])
            ids = np.concatenate(seen, axis=2)
            lens = np.array([[ids.shape[2]]], dtype=np.int32)
        post = pb_utils.InferenceRequest(
            model_name="postprocessing", requested_output_names=["OUTPUT"],
            inputs=[pb_utils.Tensor("TOKENS_BATCH", ids.astype(np.int32)),
                    pb_utils.Tensor("SEQUENCE_LENGTH", lens.astype(np.int32))]).exec()
        if post.has_error():
            raise RuntimeError(post.error().message())
        text = pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy()
        tensors = [pb_utils.Tensor("text_output", text)]
        for name in _FORWARD:
            t = pb_utils.get_output_tensor_by_name(resp, name)
            if t is not None and name in self.outputs:
                tensors.append(pb_utils.Tensor(name, t.as_numpy()))
        return pb_utils.InferenceResponse(output_tensors=tensors)
