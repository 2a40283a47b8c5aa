"""Conformance check 8: structured output under speculation. ``response_format`` json_schema
and json_object (OpenAI API reference, "Structured Outputs"), and a regex where the engine has
one (vLLM ``structured_outputs.regex``): every finished answer valid, and greedy equal to the
baseline's under the same constraint (TensorRT-LLM #18892: EAGLE-3 trees leave the grammar)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from specserve.conform.checks.base import (
    PROMPTS,
    Context,
    Outcome,
    check,
    error_outcome,
    evidence,
    not_expressible,
    same_answer,
)
from specserve.conform.probe import NotExpressible, Probe, Reply

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "ok": {"type": "boolean"}},
    "required": ["name", "ok"], "additionalProperties": False,
}
REGEX = r"[a-z]{3}-[0-9]{2}"


def schema_valid(text: str) -> bool:
    """``text`` is an instance of :data:`SCHEMA` (its exact shape, checked by hand)."""
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return (isinstance(v, dict) and set(v) == {"name", "ok"} and isinstance(v["name"], str)
            and len(v["name"]) <= 12 and isinstance(v["ok"], bool))


def object_valid(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def regex_valid(text: str) -> bool:
    return re.fullmatch(REGEX, text) is not None


def finished(r: Reply, max_tokens: int) -> bool:
    """The answer ended on its own (not cut at ``max_tokens``): its finish reason, or where the
    protocol has none (Triton) fewer tokens than ``max_tokens``."""
    reason = r.first.finish_reason
    if reason is not None:
        return reason != "length"
    return r.completion_tokens is not None and r.completion_tokens < max_tokens


async def _structured(ctx: Context, make: Callable[[Probe], Probe],
                      valid: Callable[[str], bool], what: str) -> Outcome:
    """Over completions; where an OpenAI server refuses that (Dynamo's frontend takes
    ``response_format`` on chat only), over chat, saying so."""
    first = await _structured_on(ctx, make, valid, what, chat=False)
    if first.verdict != "refused" or ctx.spec.protocol != "openai":
        return first
    second = await _structured_on(ctx, make, valid, what, chat=True)
    if second.verdict == "refused":
        return first
    return Outcome(second.verdict, f"{second.detail} (over chat: completions refused: "
                   f"{first.detail[:80]})", second.evidence)


async def _structured_on(ctx: Context, make: Callable[[Probe], Probe],
                         valid: Callable[[str], bool], what: str, chat: bool) -> Outcome:
    n_valid = 0
    try:
        for prompt in PROMPTS[:2]:
            for stream in (False, True):
                p = make(Probe(prompt, 64, stream=stream, chat=chat))
                s, b = await ctx.both(p)
                if (bad := error_outcome(s, b)) is not None:
                    return bad
                done = finished(s, p.max_tokens)
                if done and not valid(s.first.text):
                    return Outcome("fail", f"{what}: invalid answer {s.first.text[:60]!r}",
                                   evidence(s, b))
                n_valid += done
                if (why := same_answer(s, b)) is not None:
                    return Outcome("fail", f"{what}: {why}", evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", f"{what}: equal to the baseline, {n_valid} finished answers valid")


@check("json-schema", 8, "response_format json_schema")
async def json_schema(ctx: Context) -> Outcome:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    return await _structured(ctx, lambda p: p.but(response_format=fmt), schema_valid,
                             "json_schema")


@check("json-object", 8, "response_format json_object")
async def json_object(ctx: Context) -> Outcome:
    return await _structured(ctx, lambda p: p.but(response_format={"type": "json_object"}),
                             object_valid, "json_object")


@check("regex", 8, "regex-constrained output")
async def regex(ctx: Context) -> Outcome:
    return await _structured(ctx, lambda p: p.but(regex=REGEX), regex_valid, "regex")
