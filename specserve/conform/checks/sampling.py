"""Conformance checks 4-6: seeds reproduce at T > 0; the sampled distribution equals the
baseline's (two-sample chi-square, ``specserve.conform.stats``: speculative sampling is exact,
Leviathan et al. 2023 Theorem 1, so any difference is a fault); ``n > 1`` choices valid,
independent, each with its finish reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from specserve.conform.checks.base import (
    NOT_RUN,
    PROMPTS,
    Context,
    Outcome,
    check,
    error_outcome,
    evidence,
    not_expressible,
)
from specserve.conform.probe import NotExpressible, Probe, Reply
from specserve.conform.stats import chi_square_two_sample, detectable_tv

DIST_PREFIXES = (PROMPTS[0], PROMPTS[1])
DIST_TEMPERATURE = 1.0
# top-k keeps every position's support small (a real LM at T = 1 over its whole vocabulary
# gives all-distinct samples: no test has any power); speculative sampling stays exact under
# top-k (the verify step's target distribution is the top-k-filtered one)
DIST_TOP_K = 4


@check("seed", 4, "same seed, same text at T > 0")
async def seed(ctx: Context) -> Outcome:
    st = ctx.settings
    try:
        for i, prompt in enumerate(PROMPTS[:2]):
            p = Probe(prompt, st.max_tokens, temperature=1.0, seed=st.seed + i, ignore_eos=True)
            for name, target in (("speculative", ctx.spec), ("baseline", ctx.base)):
                a = await ctx.send(target, p)
                b = await ctx.send(target, p)
                c = await ctx.send(target, p.but(stream=True))
                for r in (a, b, c):
                    if (bad := error_outcome(r)) is not None:
                        bad.detail = f"{name}: {bad.detail}"
                        return bad
                texts = [a.first.text, b.first.text, c.first.text]
                if len(set(texts)) > 1:
                    return Outcome("fail", f"{name} server: seed {p.seed} gave different texts "
                                   f"(twice non-streamed, once streamed): "
                                   f"{[t[:20] for t in texts]}", evidence(a, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", "each seed repeats its text (twice non-streamed, once streamed), "
                   "speculative and baseline")


def views(r: Reply, k: int) -> list[Hashable]:
    """What each sample is compared on: the whole continuation, then (with token ids) the token
    at each position after the first (those come from verify steps; fewer categories, more
    power)."""
    c = r.first
    if c.token_ids is None:
        return [c.text]
    ids = c.token_ids
    return [tuple(ids), *(ids[i] if i < len(ids) else None for i in range(1, k))]


@check("distribution", 5, "chi-square: sampled continuations vs baseline")
async def distribution(ctx: Context) -> Outcome:
    st = ctx.settings
    results = []
    samples: dict[tuple[int, str], list[list[Hashable]]] = {}
    for j, prefix in enumerate(DIST_PREFIXES):
        for side, target, offset in (("spec", ctx.spec, 0), ("base", ctx.base, 1_000_003)):
            probes = [Probe(prefix, st.dist_tokens, temperature=DIST_TEMPERATURE,
                            top_k=DIST_TOP_K, seed=st.seed + offset + 10_000 * j + i,
                            ignore_eos=True)
                      for i in range(st.samples)]
            try:
                replies = await ctx.many(target, probes, 2 * st.concurrency)
            except NotExpressible as e:
                return not_expressible(e)
            for r in replies:
                if (bad := error_outcome(r)) is not None:
                    bad.detail = f"{side}: {bad.detail}"
                    return bad
            samples[(j, side)] = [views(r, st.dist_tokens) for r in replies]
    tests = [(j, v) for j in range(len(DIST_PREFIXES))
             for v in range(min(len(samples[(j, "spec")][0]), len(samples[(j, "base")][0])))]
    alpha = st.alpha / len(tests)   # Bonferroni over prefixes and views
    for j, v in tests:
        a = [s[v] for s in samples[(j, "spec")]]
        b = [s[v] for s in samples[(j, "base")]]
        res = chi_square_two_sample(a, b, alpha=alpha)
        results.append(res)
        if res.reject:
            ca, cb = Counter(a), Counter(b)
            table = [{"value": str(k), "spec": ca[k], "baseline": cb[k]}
                     for k, _ in (ca + cb).most_common(8)]
            what = "the whole continuation" if v == 0 else f"token {v}"
            return Outcome("fail", f"prefix {j}, {what}: chi2 {res.statistic:.1f}, dof "
                           f"{res.dof}, p {res.p_value:.2g} < {alpha:.2g} (TV {res.tv:.3f})",
                           {"request": replies[0].wire, "seeds": "seed + i per sample",
                            "test": res.to_dict(), "most_common": table,
                            "samples_per_side": st.samples, "temperature": DIST_TEMPERATURE})
    bound = detectable_tv(st.samples, alpha)
    if all(r.dof == 0 for r in results):
        return Outcome(NOT_RUN, "inconclusive: every test pooled to one category (no power)",
                       {"tests": [r.to_dict() for r in results]})
    return Outcome("pass", f"{len(DIST_PREFIXES)} prefixes x {st.samples} samples per side at "
                   f"T {DIST_TEMPERATURE}, top-k {DIST_TOP_K}, {len(results)} tests: min p "
                   f"{min(r.p_value for r in results):.2g}, categories "
                   f"{'/'.join(str(r.categories) for r in results)} (alpha {alpha:.2g}; "
                   f"TV ~{bound:.2f} detectable)", {"tests": [r.to_dict() for r in results]})


def choices_problem(r: Reply, n: int, finish_reasons: bool = True) -> str | None:
    """Why ``r`` is not ``n`` valid choices (None: it is). ``finish_reasons``: the protocol
    carries one per choice (OpenAI; the Triton generate contract has none)."""
    idx = [c.index for c in r.choices]
    if sorted(idx) != list(range(n)):
        return f"choice indices {idx}, expected 0..{n - 1}"
    if finish_reasons and any(c.finish_reason is None for c in r.choices):
        return "a choice without its finish_reason"
    if len({c.text for c in r.choices}) == 1:
        return f"all {n} choices identical at T = 1 ({r.choices[0].text[:24]!r})"
    return None


@check("n", 6, "n > 1 choices")
async def n_choices(ctx: Context) -> Outcome:
    n, openai = 3, ctx.spec.protocol == "openai"
    try:
        for stream in (False, True):
            p = Probe(PROMPTS[0], ctx.settings.max_tokens, temperature=1.0, n=n,
                      seed=ctx.settings.seed, stream=stream)
            s, b = await ctx.both(p)
            if (bad := error_outcome(s, b)) is not None:
                return bad
            why = choices_problem(s, n, openai)
            if why is not None:
                return Outcome("fail", f"stream={stream}: {why}", evidence(s, b))
    except NotExpressible as e:
        return not_expressible(e)
    return Outcome("pass", f"n = {n}: every choice present, distinct"
                   + (", with its finish reason" if openai else
                      " (the Triton contract has no finish reason)"))
