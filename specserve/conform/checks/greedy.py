"""Conformance checks 1 and 2: greedy answers equal to the baseline's (completions and chat,
streamed and not, 1 and 8 concurrent), and streamed text byte-equal to the non-streamed text
(multi-byte characters split across chunks included: vLLM's incremental detokenization holds
back an unfinished character, ``vllm/v1/engine/detokenizer.py``; a server that decodes each
chunk alone sends U+FFFD)."""

from __future__ import annotations

from specserve.conform.checks.base import (
    PROMPTS,
    UNICODE_PROMPT,
    Context,
    Outcome,
    check,
    error_outcome,
    evidence,
    not_expressible,
    same_answer,
    shrink,
)
from specserve.conform.probe import NotExpressible, Probe, Reply

REPLACEMENT = "\ufffd"


async def _greedy(ctx: Context, chat: bool) -> Outcome:
    st = ctx.settings
    probes = [Probe(p, st.max_tokens, chat=chat, temperature=0.0) for p in PROMPTS[:3]]
    try:
        bases = [await ctx.send(ctx.base, p) for p in probes]
    except NotExpressible as e:
        return not_expressible(e)
    cases = 0
    for stream in (False, True):
        for conc in (1, st.concurrency):
            wave = [probes[i % len(probes)].but(stream=stream) for i in range(conc)]
            replies = await ctx.many(ctx.spec, wave, conc)
            for i, s in enumerate(replies):
                b = bases[i % len(probes)]
                bad = error_outcome(s, b)
                if bad is not None:
                    bad.detail = f"stream={stream}, {conc} concurrent: {bad.detail}"
                    return bad
                why = same_answer(s, b)
                cases += 1
                if why is not None:
                    p, s2, b2 = await shrink(ctx, wave[i], same_answer)
                    why2 = same_answer(s2, b2) or why
                    return Outcome("fail", f"stream={stream}, {conc} concurrent, max_tokens "
                                   f"{p.max_tokens}: {why2}", evidence(s2, b2))
    return Outcome("pass", f"{cases} answers equal to the baseline's (stream and not, 1 and "
                   f"{st.concurrency} concurrent)")


@check("greedy-completions", 1, "greedy text/ids equal, completions")
async def greedy_completions(ctx: Context) -> Outcome:
    return await _greedy(ctx, chat=False)


@check("greedy-chat", 1, "greedy text/ids equal, chat")
async def greedy_chat(ctx: Context) -> Outcome:
    return await _greedy(ctx, chat=True)


def stream_differs(streamed: Reply, whole: Reply) -> str | None:
    """Why a streamed answer is not byte-equal to the non-streamed one, or None."""
    a, b = streamed.first.text.encode(), whole.first.text.encode()
    if a == b:
        return None
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
             min(len(a), len(b)))
    extra = " (U+FFFD in the stream: a character split across chunks)" \
        if REPLACEMENT in streamed.first.text and REPLACEMENT not in whole.first.text else ""
    return f"streamed bytes differ from byte {i}: {a[i:i + 16]!r} vs {b[i:i + 16]!r}{extra}"


async def _other_sample(ctx: Context, p: Probe, whole: Reply, streamed: Reply) -> bool:
    """A seeded pair compares bytes only where the seed reproduces: not when a second
    non-streamed answer differs, nor when the streamed answer's token ids differ from the
    non-streamed ones (another sample, not a byte split: seeds that do not reproduce under
    speculation made vLLM's pairs differ here)."""
    again = await ctx.send(ctx.spec, p)
    if again.ok and again.first.text != whole.first.text:
        return True
    a, b = streamed.first.token_ids, whole.first.token_ids
    return a is not None and b is not None and a != b


@check("stream-bytes", 2, "streamed text byte-equal to non-streamed")
async def stream_bytes(ctx: Context) -> Outcome:
    st = ctx.settings
    probes = [Probe(UNICODE_PROMPT, st.max_tokens, temperature=0.0)]
    # T = 2: byte-level tokens of unfinished characters come often (invalid or multi-byte)
    probes += [Probe(UNICODE_PROMPT, st.max_tokens, temperature=2.0, seed=st.seed + i)
               for i in range(3)]
    probes += [Probe(p, st.max_tokens, temperature=0.0) for p in PROMPTS[:2]]
    compared, multibyte, skipped = 0, 0, 0
    try:
        for p in probes:
            whole = await ctx.send(ctx.spec, p)
            streamed = await ctx.send(ctx.spec, p.but(stream=True))
            bad = error_outcome(streamed) or error_outcome(whole)
            if bad is not None:
                return bad
            if p.seed is not None and await _other_sample(ctx, p, whole, streamed):
                skipped += 1
                continue
            compared += 1
            multibyte += sum(1 for ch in whole.first.text if len(ch.encode()) > 1)  # U+FFFD too
            why = stream_differs(streamed, whole)
            if why is not None:
                return Outcome("fail", why, evidence(streamed, whole,
                                                     chunks=streamed.first.chunks))
    except NotExpressible as e:
        return not_expressible(e)
    note = f"; {skipped} seeded pairs not reproducible, left out" if skipped else ""
    return Outcome("pass", f"{compared} streamed answers byte-equal to the non-streamed ones, "
                   f"{multibyte} multi-byte characters (U+FFFD included) in them{note}")
