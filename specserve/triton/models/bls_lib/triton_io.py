"""The BLS's conversions between Triton objects and numpy, and its calls to ``postprocessing``.

The half of ``tensorrt_llm_bls`` that only moves data: numpy dicts to ``pb_utils`` tensors and
back, error responses, and the text of token ids as postprocessing decodes them (one sequence,
a batch, or an engine response with its forwarded outputs). Unlike the other ``lib`` modules it
imports ``triton_python_backend_utils``, so it runs only inside the Python backend's stub (the
live BLS tests exercise it). ``model.py`` keeps the serving (threads, slots, cancellation) and
the calls that generate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

Arrays = dict[str, np.ndarray[Any, Any]]


def error(message: str) -> Any:
    """A response carrying only ``message`` as its error."""
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def tensors(arrays: Arrays) -> list[Any]:
    return [pb_utils.Tensor(k, v) for k, v in arrays.items()]


def arrays(resp: Any) -> Arrays:
    """A response's outputs as numpy copies (they outlive the response)."""
    return {t.name(): t.as_numpy().copy() for t in resp.output_tensors()}


def postprocess(ids: np.ndarray[Any, Any], lens: np.ndarray[Any, Any]) -> Any:
    """postprocessing's ``OUTPUT`` (a copy) of ``TOKENS_BATCH`` ids [B, beams, T] and their
    lengths [B, beams]."""
    post = pb_utils.InferenceRequest(
        model_name="postprocessing", requested_output_names=["OUTPUT"],
        inputs=[pb_utils.Tensor("TOKENS_BATCH", ids.astype(np.int32)),
                pb_utils.Tensor("SEQUENCE_LENGTH", lens.astype(np.int32))]).exec()
    if post.has_error():
        raise RuntimeError(post.error().message())
    return pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy().copy()


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def decode(ids: list[int]) -> str:
    """postprocessing's text of ``ids`` (the decode of the non-streamed text)."""
    if not ids:
        return ""
    out = postprocess(np.array(ids, dtype=np.int32).reshape(1, 1, -1),
                      np.array([[len(ids)]], dtype=np.int32))
    return _text(out.reshape(-1)[0])


def decode_many(lists: list[list[int]]) -> list[str]:
    """postprocessing's texts of several id lists in one call (a batch, right-padded)."""
    width = max(1, *(len(ids) for ids in lists))
    ids = np.zeros((len(lists), 1, width), dtype=np.int32)
    for b, x in enumerate(lists):
        ids[b, 0, :len(x)] = x
    lens = np.array([[len(x)] for x in lists], dtype=np.int32)
    return [_text(v) for v in postprocess(ids, lens).reshape(-1)]


def text_response(resp: Any, seen: dict[int, list[np.ndarray[Any, Any]]], accumulate: bool,
                  forward: Sequence[str], outputs: Sequence[str]) -> Any:
    """The BLS response of one engine response: its text (with ``accumulate``, the text of all
    tokens so far of its sequence, kept in ``seen``) and the outputs in ``forward`` that the BLS
    declares (``outputs``)."""
    ids = pb_utils.get_output_tensor_by_name(resp, "output_ids").as_numpy()  # [1, beams, T]
    lens = pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy()
    if accumulate:  # all tokens so far of this response's sequence
        index = pb_utils.get_output_tensor_by_name(resp, "sequence_index")
        mine = seen[0 if index is None else int(index.as_numpy().reshape(-1)[0])]
        mine.append(ids[:, :, : int(lens.reshape(-1)[0])])
        ids = np.concatenate(mine, axis=2)
        lens = np.array([[ids.shape[2]]], dtype=np.int32)
    out = [pb_utils.Tensor("text_output", postprocess(ids, lens))]
    for name in forward:
        t = pb_utils.get_output_tensor_by_name(resp, name)
        if t is not None and name in outputs:
            out.append(pb_utils.Tensor(name, t.as_numpy()))
    return pb_utils.InferenceResponse(output_tensors=out)
