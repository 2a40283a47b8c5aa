"""Conformance check 9: prompt edges under speculation: a prompt near the context limit (and
one past it, which both servers must refuse cleanly), an empty prompt and a one-token
prompt. Equal answers pass; both refusing is a clean refusal; a crash is broken."""

from __future__ import annotations

from specserve.conform.checks.base import (
    Context,
    Outcome,
    check,
    error_outcome,
    evidence,
    not_expressible,
    same_answer,
)
from specserve.conform.probe import NotExpressible, Probe

UNIT = "x = 1\n"
OUT_TOKENS = 8


async def _prompt_tokens(ctx: Context, reps: int) -> int | None:
    r = await ctx.send(ctx.base, Probe(UNIT * reps, 1, ignore_eos=True))
    return r.prompt_tokens if r.ok else None


async def _pair(ctx: Context, p: Probe, what: str) -> Outcome:
    s, b = await ctx.both(p)
    if s.refused and b.refused:
        return Outcome("refused", f"{what}: both refuse it ({s.error})", evidence(s, b))
    if (bad := error_outcome(s, b)) is not None:
        bad.detail = f"{what}: {bad.detail}"
        return bad
    if (why := same_answer(s, b)) is not None:
        return Outcome("fail", f"{what}: {why}", evidence(s, b))
    return Outcome("pass", f"{what}: equal to the baseline")


@check("long-prompt", 9, "prompt near the context limit")
async def long_prompt(ctx: Context) -> Outcome:
    limit = ctx.settings.context_limit or ctx.context_limit
    if limit is None:
        return not_expressible(NotExpressible("the server states no context limit; give "
                                              "--context-limit"))
    try:
        a, b = await _prompt_tokens(ctx, 10), await _prompt_tokens(ctx, 20)
        if a is None or b is None or b <= a:
            return Outcome("refused", "the baseline reports no prompt_tokens to size the "
                           "prompt with")
        per, fixed = (b - a) / 10, a - 10 * (b - a) / 10
        reps = int((limit - OUT_TOKENS - 4 - fixed) / per)
        near = await _pair(ctx, Probe(UNIT * reps, OUT_TOKENS, ignore_eos=True),
                           f"{int(fixed + reps * per)} prompt tokens (limit {limit})")
        if near.verdict != "pass":
            return near
        over_reps = int((limit + 16 - fixed) / per) + 1
        s, bb = await ctx.both(Probe(UNIT * over_reps, OUT_TOKENS, ignore_eos=True))
    except NotExpressible as e:
        return not_expressible(e)
    if s.broken:
        return Outcome("broken", f"past the limit: {s.error}", evidence(s, bb))
    if s.ok and not bb.ok:
        return Outcome("fail", "past the limit: the speculative server answers, the baseline "
                       f"refuses ({bb.error})", evidence(s, bb))
    return Outcome("pass", f"{near.detail}; past it: "
                   f"{'both refuse' if s.refused else 'both answer'}")


@check("empty-prompt", 9, "empty prompt")
async def empty_prompt(ctx: Context) -> Outcome:
    try:
        return await _pair(ctx, Probe("", OUT_TOKENS), "empty prompt")
    except NotExpressible as e:
        return not_expressible(e)


@check("one-token-prompt", 9, "one-token prompt")
async def one_token_prompt(ctx: Context) -> Outcome:
    try:
        return await _pair(ctx, Probe("#", ctx.settings.max_tokens), "prompt '#'")
    except NotExpressible as e:
        return not_expressible(e)
