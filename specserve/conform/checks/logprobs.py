"""Conformance check 7: logprobs and top-logprobs under speculation equal the baseline's: the
chosen token's logprob within ``logprob_tol`` nats, and the same top-k sets (a token may swap
in or out only at a tie within the tolerance of the k-th value). Four rows, so that an
engine serving part of it shows which part: the chosen tokens' logprobs (OpenAI
``logprobs: 0``; Triton ``return_log_probs``) non-streamed and streamed, top-k on completions,
and chat. TensorRT-LLM refuses them with speculation (PR #18401); vLLM's were wrong in 0.12
(#34497)."""

from __future__ import annotations

from specserve.conform.checks.base import (
    PROMPTS,
    Context,
    Outcome,
    check,
    error_outcome,
    evidence,
    not_expressible,
)
from specserve.conform.probe import NotExpressible, Probe, Reply, TokenLogprob


def logprob_problem(s: Reply, b: Reply, tol: float, k: int) -> str | None:
    """Why the spec answer's logprobs are not the baseline's, or None (``k`` = 0: the chosen
    tokens' logprobs only)."""
    ls, lb = s.first.logprobs, b.first.logprobs
    if ls is None:
        return "no logprobs in the answer"
    if lb is None:
        return None
    if len(ls) != len(lb):
        return f"{len(ls)} logprob entries vs baseline {len(lb)}"
    for i, (x, y) in enumerate(zip(ls, lb, strict=True)):
        if x.token != y.token:
            return f"token {i}: {x.token!r} vs baseline {y.token!r}"
        if x.logprob is None:
            return f"token {i} ({x.token!r}): logprob missing"
        if y.logprob is not None and abs(x.logprob - y.logprob) > tol:
            return f"token {i} ({x.token!r}): logprob {x.logprob:.4f} vs {y.logprob:.4f}"
        if k > 0 and (why := _top_problem(x, y, tol, k)) is not None:
            return f"token {i}: {why}"
    return None


def _top_problem(x: TokenLogprob, y: TokenLogprob, tol: float, k: int) -> str | None:
    """The top-k sets differ (a token may swap in or out only at a tie within ``tol`` of the
    baseline's k-th value), or the answer has fewer than k."""
    if x.top is None or len(x.top) < min(k, len(y.top or {})):
        return f"{len(x.top or {})} top logprobs, expected {k}"
    if y.top is not None and set(x.top) != set(y.top):
        edge = min(y.top.values()) if y.top else 0.0
        odd = set(x.top) ^ set(y.top)
        vals = [x.top.get(t, y.top.get(t, edge)) for t in odd]
        if any(abs(v - edge) > tol for v in vals):
            return f"top-{k} sets differ by {sorted(odd)}"
    return None


async def _logprobs(ctx: Context, chat: bool, streams: tuple[bool, ...], k: int) -> Outcome:
    st = ctx.settings
    try:
        for prompt in PROMPTS[:2]:
            for stream in streams:
                p = Probe(prompt, st.max_tokens // 2, chat=chat, logprobs=k,
                          ignore_eos=True, stream=stream)
                s, b = await ctx.both(p)
                if (bad := error_outcome(s, b)) is not None:
                    return bad
                why = logprob_problem(s, b, st.logprob_tol, k)
                if why is not None:
                    return Outcome("fail", f"stream={stream}: {why}", evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    what = f"same top-{k} sets" if k else "the chosen tokens' logprobs only"
    return Outcome("pass", f"{2 * len(streams)} answers: logprobs within {st.logprob_tol} "
                   f"nats of the baseline's, {what}")


@check("logprobs", 7, "chosen tokens' logprobs equal, completions, non-streamed")
async def logprobs_completions(ctx: Context) -> Outcome:
    return await _logprobs(ctx, chat=False, streams=(False,), k=0)


@check("logprobs-stream", 7, "chosen tokens' logprobs equal, completions, streamed")
async def logprobs_stream(ctx: Context) -> Outcome:
    return await _logprobs(ctx, chat=False, streams=(True,), k=0)


@check("top-logprobs", 7, "top-k logprobs equal, completions")
async def top_logprobs(ctx: Context) -> Outcome:
    return await _logprobs(ctx, chat=False, streams=(False, True), k=ctx.settings.top_logprobs)


@check("logprobs-chat", 7, "logprobs/top-logprobs equal, chat")
async def logprobs_chat(ctx: Context) -> Outcome:
    return await _logprobs(ctx, chat=True, streams=(False, True), k=ctx.settings.top_logprobs)
