"""Conformance check 3: stops and lengths under speculation. A stop string that completes
inside an accepted run of drafts (one streamed chunk of several tokens, vLLM
``vllm/v1/core/sched/utils.py`` ``check_stop`` / ``vllm/v1/engine/detokenizer.py``: text after
the stop is never sent), stop token ids, ``max_tokens`` exact, ``min_tokens``, ``ignore_eos``,
finish reasons and ``usage`` counts, each compared with the baseline on the same request.

OpenAI stops are strings (the stop is not in the text); the Triton ensemble's ``stop_words``
are token-level (TensorRT-LLM semantics), so there the answer is compared with the baseline
only."""

from __future__ import annotations

from specserve.conform.checks.base import (
    PROMPTS,
    Context,
    Outcome,
    check,
    error_outcome,
    evidence,
    not_expressible,
    same_answer,
    token_ids,
    worst,
)
from specserve.conform.probe import NotExpressible, Probe, Reply


def pick_stop(full: str, chunks: list[str], counts: list[int | None]
              ) -> tuple[str, bool] | None:
    """A one-character stop string that completes inside an accepted run: the first
    character of a streamed chunk of two or more tokens (so it lies in the chunk's first token
    and accepted tokens follow it in the same step), seen there first; else any mid-text
    character seen first there. (stop, inside_a_run) or None."""
    pos = 0
    for ch, n in zip(chunks, counts, strict=False):
        c = ch[:1]
        if n is not None and n >= 2 and c and not c.isspace() and full.find(c) == pos > 0:
            return c, True
        pos += len(ch)
    for at in range(len(full) // 3, len(full) - 1):
        c = full[at]
        if not c.isspace() and full.find(c) == at:
            return c, False
    return None


def stop_text_ok(text: str, full: str, stop: str) -> bool:
    """Nothing after the first ``stop`` (the stop itself left out, as OpenAI, or kept)."""
    i = full.find(stop)
    return text in (full[:i], full[:i + len(stop)])


@check("stop-string", 3, "stop string, incl. inside an accepted draft run")
async def stop_string(ctx: Context) -> Outcome:
    st = ctx.settings
    outcomes: list[Outcome] = []
    try:
        for prompt in PROMPTS[:3]:
            p = Probe(prompt, st.max_tokens, ignore_eos=True)
            ref = await ctx.send(ctx.spec, p.but(stream=True))
            if (bad := error_outcome(ref)) is not None:
                return bad
            picked = pick_stop(ref.first.text, ref.first.chunks, ref.first.chunk_tokens)
            if picked is None:
                continue
            stop, inside = picked
            where = "inside an accepted run" if inside else "mid-text"
            for stream in (False, True):
                q = p.but(stop=(stop,), stream=stream)
                s, b = await ctx.both(q)
                if (bad := error_outcome(s, b)) is not None:
                    outcomes.append(bad)
                    continue
                if ctx.spec.protocol == "openai" and not stop_text_ok(s.first.text,
                                                                      ref.first.text, stop):
                    outcomes.append(Outcome(
                        "fail", f"stop {stop!r} ({where}): text goes on after it: "
                        f"{s.first.text[-24:]!r}", evidence(s, b, unstopped=ref.to_dict())))
                elif (why := same_answer(s, b)) is not None:
                    outcomes.append(Outcome("fail", f"stop {stop!r} ({where}): {why}",
                                            evidence(s, b)))
                else:
                    outcomes.append(Outcome("pass", f"stop {stop!r} {where}"))
    except NotExpressible as e:
        return not_expressible(e)
    if not outcomes:
        return Outcome("refused", "no usable stop character in any answer")
    runs = sum(1 for o in outcomes if o.verdict == "pass" and "inside" in o.detail)
    w = worst(outcomes)
    if w.verdict == "pass":
        return Outcome("pass", f"{len(outcomes)} stopped answers equal to the baseline's, "
                       f"{runs} with the stop inside an accepted run")
    return w


async def _stop_id_case(ctx: Context) -> tuple[Probe, int, int, str] | Outcome:
    """A prompt, a token id first generated at position k >= 2, and the id source."""
    for prompt in PROMPTS[:3]:
        p = Probe(prompt, ctx.settings.max_tokens, ignore_eos=True)
        ref = await ctx.send(ctx.base, p)
        if (bad := error_outcome(ref)) is not None:
            return bad
        ids, source = token_ids(ctx, ref)
        if ids is None:
            raise NotExpressible("the answers carry no token ids (OpenAI: --extra-body "
                                 "'{\"return_token_ids\": true}'; else --tokenizer)")
        for k in range(2, len(ids) - 2):
            if ids.index(ids[k]) == k:
                return p.but(ignore_eos=False), ids[k], k, source
    return Outcome("refused", "no token id to stop on in the baseline's answers")


@check("stop-token-ids", 3, "stop token ids")
async def stop_token_ids(ctx: Context) -> Outcome:
    try:
        case = await _stop_id_case(ctx)
        if isinstance(case, Outcome):
            return case
        p, tid, k, source = case
        outcomes = []
        for stream in (False, True):
            s, b = await ctx.both(p.but(stop_token_ids=(tid,), stream=stream))
            if (bad := error_outcome(s, b)) is not None:
                outcomes.append(bad)
            elif (why := same_answer(s, b)) is not None:
                outcomes.append(Outcome("fail", f"stop id {tid}: {why}", evidence(s, b)))
            elif s.first.token_ids is not None and tid in s.first.token_ids[:-1]:
                outcomes.append(Outcome("fail", f"tokens after stop id {tid}", evidence(s, b)))
            else:
                outcomes.append(Outcome("pass", ""))
    except NotExpressible as e:
        return not_expressible(e)
    w = worst(outcomes)
    return w if w.verdict != "pass" else Outcome(
        "pass", f"stop id {tid} (first at token {k}, ids from the {source}) ends both alike")


def length_ok(s: Reply, n: int) -> str | None:
    if s.completion_tokens != n:
        return f"completion_tokens {s.completion_tokens}, expected {n}"
    ids = s.first.token_ids
    if ids is not None and len(ids) != n:
        return f"{len(ids)} token ids, expected {n}"
    if s.first.finish_reason not in (None, "length"):
        return f"finish_reason {s.first.finish_reason!r}, expected 'length'"
    return None


@check("max-tokens", 3, "max_tokens exact")
async def max_tokens(ctx: Context) -> Outcome:
    try:
        for n in (1, 2, 7, ctx.settings.max_tokens + 1):
            for stream in (False, True):
                p = Probe(PROMPTS[0], n, ignore_eos=True, stream=stream)
                s, b = await ctx.both(p)
                if (bad := error_outcome(s, b)) is not None:
                    return bad
                why = length_ok(s, n) or same_answer(s, b)
                if why is not None:
                    return Outcome("fail", f"max_tokens {n}, stream={stream}: {why}",
                                   evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", "max_tokens 1, 2, 7 and "
                   f"{ctx.settings.max_tokens + 1} give exactly that many tokens")


@check("min-tokens", 3, "min_tokens")
async def min_tokens(ctx: Context) -> Outcome:
    try:
        case = await _stop_id_case(ctx)
        if isinstance(case, Outcome):
            return case
        p, tid, k, _ = case
        m = k + 3
        q = p.but(stop_token_ids=(tid,), min_tokens=m)
        s, b = await ctx.both(q)
        if (bad := error_outcome(s, b)) is not None:
            return bad
        if s.completion_tokens is not None and s.completion_tokens < m:
            return Outcome("fail", f"min_tokens {m}: only {s.completion_tokens} tokens",
                           evidence(s, b))
        if (why := same_answer(s, b)) is not None:
            return Outcome("fail", f"min_tokens {m} with stop id {tid}: {why}", evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", f"min_tokens {m} holds past stop id {tid} (first at token {k})")


@check("ignore-eos", 3, "ignore_eos")
async def ignore_eos(ctx: Context) -> Outcome:
    n = 2 * ctx.settings.max_tokens
    try:
        for prompt in PROMPTS[:2]:
            s, b = await ctx.both(Probe(prompt, n, ignore_eos=True))
            if (bad := error_outcome(s, b)) is not None:
                return bad
            why = length_ok(s, n) or same_answer(s, b)
            if why is not None:
                return Outcome("fail", f"ignore_eos, max_tokens {n}: {why}", evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", f"ignore_eos runs to max_tokens {n}, equal to the baseline")


@check("finish-reason", 3, "finish reasons")
async def finish_reason(ctx: Context) -> Outcome:
    if ctx.spec.protocol != "openai":
        return not_expressible(NotExpressible("the Triton ensemble has no finish-reason "
                                              "output"))
    seen = []
    for prompt in PROMPTS:
        for stream in (False, True):
            s, b = await ctx.both(Probe(prompt, 2 * ctx.settings.max_tokens, stream=stream))
            if (bad := error_outcome(s, b)) is not None:
                return bad
            fr = s.first.finish_reason
            if fr not in ("stop", "length"):
                return Outcome("fail", f"finish_reason {fr!r} (stream={stream})",
                               evidence(s, b))
            if (why := same_answer(s, b)) is not None:
                return Outcome("fail", f"stream={stream}: {why}", evidence(s, b))
            seen.append(fr)
    kinds = ", ".join(sorted(set(seen)))
    return Outcome("pass", f"finish reasons equal to the baseline's ({kinds})")


@check("usage", 3, "usage counts")
async def usage(ctx: Context) -> Outcome:
    try:
        for prompt in PROMPTS[:2]:
            p = Probe(prompt, ctx.settings.max_tokens, ignore_eos=True)
            s, b = await ctx.both(p)
            ss = await ctx.send(ctx.spec, p.but(stream=True))
            if (bad := error_outcome(s, b) or error_outcome(ss)) is not None:
                return bad
            for name in ("prompt_tokens", "completion_tokens"):
                vals = {getattr(r, name) for r in (s, ss, b)}
                if None in vals:
                    return Outcome("fail", f"usage {name} missing (non-streamed / streamed / "
                                   f"baseline: {[getattr(r, name) for r in (s, ss, b)]})",
                                   evidence(s, b, streamed=ss.to_dict()))
                if len(vals) > 1:
                    return Outcome("fail", f"usage {name} differs (non-streamed / streamed / "
                                   f"baseline: {[getattr(r, name) for r in (s, ss, b)]})",
                                   evidence(s, b, streamed=ss.to_dict()))
            ids = s.first.token_ids
            if ids is not None and len(ids) != s.completion_tokens:
                return Outcome("fail", f"completion_tokens {s.completion_tokens} but {len(ids)}"
                               " token ids", evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", "prompt and completion token counts equal (streamed, not, baseline)")
