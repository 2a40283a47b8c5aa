"""The Dynamo worker's :class:`~specserve.serving.loop.Sender`: the serving loop's responses
as Dynamo's ``LLMEngineOutput`` chunks (token ids, each choice's own text, log-probs, the
finish reason, Predicted Outputs' counts in ``completion_usage``) on the handler's asyncio
queue, and each finished request's counts into the worker's Prometheus counters. Used by
:mod:`specserve.frontends.dynamo_worker`."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from specserve.frontends.dynamo_metrics import SpecCounters
from specserve.serving.detok import IncrementalDetokenizer
from specserve.serving.finish import finish_reason
from specserve.serving.loop import Arrays, Sender, TextFn

if TYPE_CHECKING:
    from specserve.runtime.params import SamplingParams


class DynamoSender:
    """A request's responses, from the loop's thread to the handler's asyncio queue. ``n`` > 1:
    :meth:`split` gives one sender per choice, sharing the queue; each chunk then carries its
    choice's ``index`` and its own ``text`` (an incremental detokenizer per choice: Dynamo's
    backend detokenizes one stream per request, so token-only chunks of several choices would
    be decoded as one text)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, params: SamplingParams,
                 counters: SpecCounters | None, text: TextFn | None = None) -> None:
        self.loop, self.params, self.counters, self.text = loop, params, counters, text
        self.out: asyncio.Queue[tuple[dict[str, Any], bool]] = asyncio.Queue()
        self.gone = threading.Event()  # the handler ended: the client went away
        self.generated = 0
        self.first_send = 0.0  # wall time of the loop's first response (the trace)
        self.index: int | None = None
        self.detok: IncrementalDetokenizer | None = None
        self.finals = 1  # final responses that end the request (n with split)
        self.prompt_tokens = 0  # the request's (a prediction's usage)

    def split(self, n: int) -> list[Sender]:
        """One sender per choice (:class:`~specserve.serving.loop.SplitSender`)."""
        self.finals = n
        out: list[Sender] = []
        for i in range(n):
            s = DynamoSender(self.loop, self.params, self.counters, self.text)
            s.out, s.gone, s.index = self.out, self.gone, i
            s.detok = IncrementalDetokenizer(self.text) if self.text else None
            out.append(s)
        return out

    def send(self, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        if final and self.counters:
            reason = "abort" if self.gone.is_set() else "error" if error is not None else \
                finish_reason(self.generated + _count(arrays), self.params)
            self.counters.finished.labels(finished_reason=reason).inc()
        if self.gone.is_set():
            return False
        self.first_send = self.first_send or time.time()
        item: dict[str, Any]
        if error is not None:
            item = {"error": error}
        else:
            tokens = [] if arrays is None else [int(t) for t in arrays["output_ids"].reshape(-1)]
            self.generated += len(tokens)
            item = {"token_ids": tokens}
            if arrays is not None and "output_log_probs" in arrays:
                item.update(logprob_fields(arrays, self.text))
            if self.index is not None:
                item["index"] = self.index
            if self.detok is not None:
                item["text"] = self.detok.push(tokens) + (self.detok.flush() if final else "")
            if final:
                item["finish_reason"] = finish_reason(self.generated, self.params)
            if final and arrays is not None and "accepted_prediction_tokens" in arrays \
                    and self.index is None:  # one choice (n > 1: the counters only)
                item["completion_usage"] = prediction_usage(arrays, self.prompt_tokens,
                                                            self.generated)
            if final and arrays is not None and self.counters:
                self._count(arrays)
        self.loop.call_soon_threadsafe(self.out.put_nowait, (item, final))
        return True

    def cancelled(self) -> bool:
        return self.gone.is_set()

    def _count(self, arrays: Arrays) -> None:
        """A final response's acceptance and prediction counts into the worker's counters."""
        assert self.counters is not None
        if "spec_stats_json" in arrays:
            self.counters.add(json.loads(arrays["spec_stats_json"].reshape(-1)[0]))
        if "accepted_prediction_tokens" in arrays:
            self.counters.add_prediction(int(arrays["accepted_prediction_tokens"].sum()),
                                         int(arrays["rejected_prediction_tokens"].sum()))


def prediction_usage(arrays: Arrays, prompt: int, generated: int) -> dict[str, Any]:
    """OpenAI's usage with ``completion_tokens_details``' accepted / rejected prediction
    tokens, as Dynamo's ``LLMEngineOutput.completion_usage`` (ai-dynamo 1.6.1's frontend
    returns it as the response's ``usage``)."""
    return {"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated,
            "completion_tokens_details": {
                "accepted_prediction_tokens": int(arrays["accepted_prediction_tokens"].sum()),
                "rejected_prediction_tokens": int(arrays["rejected_prediction_tokens"].sum())}}


def logprob_fields(arrays: Arrays, text: TextFn | None) -> dict[str, Any]:
    """A response's ``output_log_probs`` [1, 1, T] (and ``top_log_probs`` /
    ``top_log_prob_ids`` [1, 1, T, k]) as Dynamo's ``LLMEngineOutput`` fields: ``log_probs``
    (one per token) and ``top_logprobs`` (per token, k ``{rank, token_id, token, logprob}``,
    most likely first, rank from 1; ``token`` decoded when the worker has a tokenizer)."""
    out: dict[str, Any] = {
        "log_probs": [float(v) for v in arrays["output_log_probs"].reshape(-1)]}
    if "top_log_probs" in arrays:
        vals, ids = arrays["top_log_probs"][0, 0], arrays["top_log_prob_ids"][0, 0]  # [T, k]
        out["top_logprobs"] = [
            [{"rank": r + 1, "token_id": int(t), "token": text([int(t)]) if text else None,
              "logprob": float(v)} for r, (t, v) in enumerate(zip(row_ids, row_vals,
                                                                   strict=True))]
            for row_ids, row_vals in zip(ids, vals, strict=True)]
    return out


def _count(arrays: Arrays | None) -> int:
    return 0 if arrays is None else int(arrays["output_ids"].size)
