"""Triton Python model ``postprocessing``: token ids -> text, TensorRT-LLM's tensor names.

Self-contained (copied into the repository as ``postprocessing/1/model.py``). Each response's
tokens are decoded on their own, as TensorRT-LLM 1.2.1's postprocessing does (stateless: Triton
sends every streamed response through as a separate request). The reference ``tensorrt_llm``
holds tokens back so that each streamed response decodes to complete characters; behind the
TensorRT-LLM backend a multi-byte character split across responses shows as U+FFFD
(docs/architecture.md, "Streaming").
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        path = os.path.normpath(os.path.join(args["model_repository"], params["tokenizer_dir"]))
        self.tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.skip_special = params.get("skip_special_tokens", "true").lower() in ("true", "1", "")

    def _one(self, req: Any) -> Any:
        tokens = pb_utils.get_input_tensor_by_name(req, "TOKENS_BATCH").as_numpy()  # [B, beams, T]
        lengths = pb_utils.get_input_tensor_by_name(req, "SEQUENCE_LENGTH").as_numpy()  # [B, beams]
        texts = []
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                n = int(lengths[b, beam])
                ids = [int(t) for t in tokens[b, beam, :n]]
                texts.append(self.tok.decode(ids, skip_special_tokens=self.skip_special))
        out = np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("OUTPUT", out.reshape(tokens.shape[0], -1))])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for req in requests:
            try:
                responses.append(self._one(req))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {e}")))
        return responses
