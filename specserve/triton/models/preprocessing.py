"""Triton Python model ``preprocessing``: text -> token ids, TensorRT-LLM's tensor names.

Self-contained (copied into the repository as ``preprocessing/1/model.py``): needs numpy,
``tokenizers`` and Triton's ``triton_python_backend_utils``. I/O is the text-only subset of
TensorRT-LLM 1.2.1 ``inflight_batcher_llm/preprocessing``; bad/stop words become the
``[2, L]`` word-list format (flat ids; end offsets, -1 padded) the ``tensorrt_llm`` model reads.
Like upstream's model.py for a text-only request it also answers ``DECODER_INPUT_ID`` =
``[[pad_id]]``, ``REQUEST_DECODER_INPUT_LEN`` = ``[[1]]`` and ``EMBEDDING_BIAS`` = an empty
``[1, 0]`` FP32 (what NVIDIA's BLS model.py requests and forwards); Triton sends a caller only
the outputs it requested.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


def load_tokenizer(model_dir: str, tokenizer_dir: str) -> tuple[Any, dict[str, Any]]:
    """Tokenizer and tokenizer_config.json of ``tokenizer_dir`` (relative to the model folder)."""
    path = os.path.normpath(os.path.join(model_dir, tokenizer_dir))
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    cfg_path = os.path.join(path, "tokenizer_config.json")
    cfg: dict[str, Any] = {}
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    return tok, cfg


def special_id(tok: Any, cfg: dict[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return None if value is None else tok.token_to_id(value)


def params_of(args: dict[str, Any]) -> dict[str, str]:
    cfg = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}


def word_list(tok: Any, words: list[str]) -> np.ndarray[Any, Any]:
    """[2, L] int32: row 0 all words' ids concatenated, row 1 each word's end offset, -1 padded."""
    ids: list[int] = []
    offsets: list[int] = []
    for w in words:
        if not w:
            continue
        ids += tok.encode(w, add_special_tokens=False).ids
        offsets.append(len(ids))
    if not ids:
        return np.array([[0], [-1]], dtype=np.int32)
    pad = len(ids) - len(offsets)
    return np.array([ids, offsets + [-1] * pad], dtype=np.int32)


def _strings(req: Any, name: str) -> list[str]:
    t = pb_utils.get_input_tensor_by_name(req, name)
    if t is None:
        return []
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in t.as_numpy().reshape(-1)]


def _scalar(req: Any, name: str, default: int | None) -> int | None:
    t = pb_utils.get_input_tensor_by_name(req, name)
    return default if t is None else int(t.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        params = params_of(args)
        self.tok, cfg = load_tokenizer(args["model_repository"], params["tokenizer_dir"])
        self.add_special = params.get("add_special_tokens", "true").lower() in ("true", "1", "")
        self.end_id = special_id(self.tok, cfg, "eos_token")
        pad = special_id(self.tok, cfg, "pad_token")
        self.pad_id = pad if pad is not None else self.end_id

    def _one(self, req: Any) -> Any:
        texts = _strings(req, "QUERY")
        if len(texts) != 1:
            raise ValueError(f"QUERY must hold one string per request, got {len(texts)}")
        ids = self.tok.encode(texts[0], add_special_tokens=self.add_special).ids
        if not ids:
            raise ValueError("QUERY tokenizes to zero tokens")
        out_len = _scalar(req, "REQUEST_OUTPUT_LEN", None)
        end_id = _scalar(req, "END_ID", self.end_id)
        pad_id = _scalar(req, "PAD_ID", self.pad_id)
        i32 = np.int32
        bad = word_list(self.tok, _strings(req, "BAD_WORDS_DICT"))[None]  # [1, 2, L]
        stop = word_list(self.tok, _strings(req, "STOP_WORDS_DICT"))[None]
        end = -1 if end_id is None else end_id
        pad = -1 if pad_id is None else pad_id
        tensors = [
            pb_utils.Tensor("INPUT_ID", np.array([ids], dtype=i32)),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(ids)]], dtype=i32)),
            pb_utils.Tensor("DECODER_INPUT_ID", np.array([[pad]], dtype=i32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.array([[1]], dtype=i32)),
            pb_utils.Tensor("BAD_WORDS_IDS", bad),
            pb_utils.Tensor("STOP_WORDS_IDS", stop),
            pb_utils.Tensor("EMBEDDING_BIAS", np.empty([1, 0], dtype=np.float32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.array([[out_len]], dtype=i32)),
            pb_utils.Tensor("OUT_END_ID", np.array([[end]], dtype=i32)),
            pb_utils.Tensor("OUT_PAD_ID", np.array([[pad]], dtype=i32)),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for req in requests:
            try:
                responses.append(self._one(req))
            except Exception as e:  # one bad request must not fail the batch
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"preprocessing: {e}")))
        return responses
