"""The answers of the ``tensorrt_llm_bls`` speculation loop, without Triton (numpy and the
standard library; copied into a repository as ``tensorrt_llm_bls/1/lib/``): what each
iteration streams, the final response with TensorRT-LLM's perf outputs, and the declared
outputs as arrays. :mod:`spec_io` builds the calls; ``bls.py`` turns these dicts into
``pb_utils`` tensors (the split of tensorrtllm_backend's ``lib/decode.py`` and
``lib/triton_decoder.py``, see :mod:`spec_io`).

- :class:`TextStream`: the streamed per-iteration text and token counts (incremental
  detokenization: the serving core's :mod:`specserve.serving.detok`, which the repository
  writer copies next to these files as ``lib/detok.py``), and the final response with the
  perf outputs (:func:`perf_values`);
- :func:`response_arrays`: the declared outputs among those values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import spec_loop
from .spec_io import Arrays, SpecOptions, i32

if TYPE_CHECKING:
    from specserve.serving.detok import IncrementalDetokenizer
else:
    try:  # in a repository: lib/detok.py, the serving core's module copied by the writer
        from .detok import IncrementalDetokenizer
    except ImportError:  # imported from the specserve package: the serving core's own
        from specserve.serving.detok import IncrementalDetokenizer


def perf_values(arrival: int, scheduled: int, result: spec_loop.LoopResult) -> Arrays:
    """TensorRT-LLM's perf outputs of the request (and ``spec_stats_json``, one verify step per
    iteration); token times fall back to the scheduled time when no token was added."""
    return {
        "arrival_time_ns": np.array([[arrival]], dtype=np.int64),
        "first_scheduled_time_ns": np.array([[scheduled]], dtype=np.int64),
        "first_token_time_ns": np.array([[result.first_token_ns or scheduled]], dtype=np.int64),
        "last_token_time_ns": np.array([[result.last_token_ns or scheduled]], dtype=np.int64),
        "acceptance_rate": np.array([[result.acceptance_rate]], dtype=np.float32),
        "total_accepted_draft_tokens": i32(result.accepted),
        "total_draft_tokens": i32(result.drafted),
        "spec_stats_json": json.dumps(result.stats_dict(), sort_keys=True),
    }


class TextStream:
    """The text of one request: per iteration (streaming) and at the end."""

    def __init__(self, opts: SpecOptions, accumulate: bool, prompt: Sequence[int],
                 decode: Callable[[list[int]], str],
                 decode_many: Callable[[list[list[int]]], list[str]] | None = None) -> None:
        self.opts, self.accumulate, self.prompt, self.decode = opts, accumulate, prompt, decode
        self.detok = IncrementalDetokenizer(decode, decode_many)
        self.streamed: list[str] = []

    def iteration(self, it: spec_loop.Iteration) -> dict[str, Any] | None:
        """The streamed response of an iteration (None: not streaming, or no new tokens):
        its new text (all text so far with ``accumulate_tokens``) and token counts."""
        if not self.opts.streaming or not it.new_tokens:
            return None
        piece = self.detok.push(it.new_tokens)
        self.streamed.append(piece)
        values: dict[str, Any] = {"text_output": "".join(self.streamed) if self.accumulate
                                  else piece}
        if self.opts.counts_out:
            values["num_output_tokens"] = len(it.new_tokens)
        if self.opts.counts_in:
            values["num_input_tokens"] = len(self.prompt)
        return values

    def final(self, result: spec_loop.LoopResult, arrival: int, scheduled: int
              ) -> dict[str, Any]:
        """The final response: streamed, the text held back (0 output tokens); else the whole
        text (after the prompt unless ``exclude_input_in_output``); counts and perf outputs."""
        if self.opts.streaming:
            rest = self.detok.flush()
            self.streamed.append(rest)
            values: dict[str, Any] = {"text_output": "".join(self.streamed) if self.accumulate
                                      else rest}
            n_out = 0
        else:
            ids = result.tokens if self.opts.exclude else [*self.prompt, *result.tokens]
            values = {"text_output": self.decode(list(ids))}
            n_out = len(ids)
        if self.opts.counts_out:
            values["num_output_tokens"] = n_out
        if self.opts.counts_in:
            values["num_input_tokens"] = len(self.prompt)
        if self.opts.perf:
            values.update(perf_values(arrival, scheduled, result))
        return values


def response_arrays(values: dict[str, Any], outputs: Sequence[str]) -> Arrays:
    """The declared ``outputs`` among ``values`` as arrays (str -> BYTES [1, 1], int -> INT32
    [1, 1], arrays as they are)."""
    out: Arrays = {}
    for name, v in values.items():
        if name not in outputs:
            continue
        if isinstance(v, str):
            v = np.array([[v.encode("utf-8")]], dtype=np.object_)
        elif isinstance(v, int):
            v = i32(v)
        out[name] = v
    return out
