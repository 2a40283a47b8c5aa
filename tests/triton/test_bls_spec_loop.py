"""The BLS draft-target loop and the n-gram proposer without Triton (``bls_lib/spec_loop.py``,
``bls_lib/ngram.py``), driven by scripted draft and target callables.

The scripted target is a deterministic "model" ``nxt(ctx)``; greedy speculation through the loop
must reproduce ``nxt`` applied token by token, whatever the drafts. At temperature 1 a scripted
rejection sampler over a 3-token vocabulary checks that the loop's per-call seeds keep the output
distribution (with a negative control: one seed for every call is detected).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specserve.triton.models.bls_lib import ngram, spec_loop
from specserve.triton.models.bls_lib.spec_loop import (
    Iteration,
    Sampling,
    SpecLoopError,
    SpecRequest,
    iteration_seed,
    run,
)

V = 50


def nxt(ctx: list[int]) -> int:
    """The scripted target's greedy next token."""
    return (sum(ctx) * 7 + len(ctx) * 3 + ctx[-1]) % V


def greedy(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(nxt(seq))
    return seq[len(prompt):]


class Target:
    """Greedy verify of the drafts against :func:`nxt`: accepted drafts + 1 token. ``stops``:
    tokens the target stops at by itself; ``include_stop``: returned (TensorRT-LLM style) or
    not (specserve's reference decoder)."""

    def __init__(self, stops: frozenset[int] = frozenset(), include_stop: bool = False,
                 report: bool = True) -> None:
        self.stops, self.include_stop, self.report = stops, include_stop, report
        self.calls: list[tuple[list[int], list[int], Any, Sampling]] = []

    def __call__(self, ctx: list[int], drafts: list[int], logits: Any,
                 s: Sampling) -> tuple[list[int], int, int]:
        self.calls.append((list(ctx), list(drafts), logits, s))
        seq, out, accepted = list(ctx), [], 0
        for i in range(len(drafts) + 1):
            t = nxt(seq)
            if t in self.stops and len(out) >= s.min_tokens:
                if self.include_stop:
                    out.append(t)
                break
            out.append(t)
            seq.append(t)
            if i == len(drafts) or drafts[i] != t:
                break
            accepted += 1
        if not self.report:
            return out, spec_loop.accepted_prefix(drafts, out), len(drafts)
        return out, accepted, len(drafts)


class Draft:
    """Proposes :func:`nxt` except where ``wrong(position in the whole sequence)``."""

    def __init__(self, wrong: Callable[[int], bool] = lambda i: False,
                 logits: bool = False) -> None:
        self.wrong, self.logits = wrong, logits
        self.calls: list[tuple[int, int, Sampling]] = []

    def __call__(self, ctx: list[int], k: int, s: Sampling) -> tuple[list[int], Any]:
        self.calls.append((len(ctx), k, s))
        seq = list(ctx)
        for _ in range(k):
            t = nxt(seq)
            seq.append((t + 1) % V if self.wrong(len(seq)) else t)
        drafts = seq[len(ctx):]
        return drafts, ([[float(t)] * V for t in drafts] if self.logits else None)


def request(prompt: list[int], max_tokens: int, k: int, **kw: Any) -> SpecRequest:
    return SpecRequest(prompt=tuple(prompt), max_tokens=max_tokens, num_draft_tokens=k, **kw)


PROMPTS = [[1, 2, 3], [7], [4, 4, 4, 4, 9, 4, 4]]


@pytest.mark.parametrize("k", [0, 1, 3, 6])
@pytest.mark.parametrize("wrong", [lambda i: False, lambda i: i % 3 == 0, lambda i: True],
                         ids=["perfect", "every-3rd-wrong", "all-wrong"])
def test_greedy_output_is_the_targets(k: int, wrong: Callable[[int], bool]) -> None:
    for prompt in PROMPTS:
        for n in (1, 2, 5, 17):
            target, draft = Target(), Draft(wrong)
            res = run(request(prompt, n, k), draft, target)
            assert res.tokens == greedy(prompt, n), (prompt, n)
            assert res.finish_reason == "length"
            assert sum(len(it.new_tokens) for it in res.iterations) == n


def test_draft_length_follows_upstream_rule() -> None:
    """k = min(K, remaining - 1) per iteration; the target is asked for drafts + 1 tokens,
    never past max_tokens; no draft call when k would be 0."""
    prompt, n, k = [1, 2, 3], 10, 4
    draft, target = Draft(), Target()
    res = run(request(prompt, n, k), draft, target)
    produced = 0
    for (ctx_len, asked, s), it in zip(draft.calls, res.iterations, strict=False):
        assert ctx_len == len(prompt) + produced
        assert asked == min(k, n - produced - 1)
        assert s.min_tokens == asked  # upstream: min_tokens = num_draft_tokens for the draft
        produced += len(it.new_tokens)
    # perfect drafts: 5 + 5 tokens; the last iteration has 10-5-1 = 4 drafts
    assert [len(it.new_tokens) for it in res.iterations] == [5, 5]
    assert [len(c[1]) for c in target.calls] == [4, 4]
    res1 = run(request(prompt, 1, k), Draft(), Target())
    assert res1.iterations[0].drafts == [] and res1.tokens == greedy(prompt, 1)


def test_draft_called_only_when_k_positive() -> None:
    draft = Draft()
    run(request([5], 1, 3), draft, Target())
    assert draft.calls == []


def test_accepted_and_drafted_counts() -> None:
    prompt = [3, 1, 4]
    res = run(request(prompt, 20, 3), Draft(lambda i: i % 4 == 0), Target())
    assert res.tokens == greedy(prompt, 20)
    assert res.drafted == sum(it.drafted for it in res.iterations) > 0
    assert res.accepted == sum(it.accepted for it in res.iterations)
    assert 0 < res.accepted < res.drafted
    for it in res.iterations:  # greedy: accepted drafts, then the target's own token
        assert it.target_tokens[:it.accepted] == it.drafts[:it.accepted]
        assert len(it.target_tokens) == it.accepted + 1
    assert res.acceptance_rate == pytest.approx(res.accepted / res.drafted)
    stats = res.stats_dict()
    assert stats["steps"] == len(res.iterations)
    assert stats["emitted_tokens"] == 20
    assert stats["tau"] == pytest.approx(20 / len(res.iterations))
    assert stats["per_position_drafted"][0] == sum(1 for it in res.iterations if it.drafted)
    assert sum(stats["per_position_accepted"]) == res.accepted
    assert sum(stats["accept_hist"]) == len(res.iterations)
    perfect = run(request(prompt, 20, 3), Draft(), Target())
    assert perfect.acceptance_rate == 1.0
    none = run(request(prompt, 20, 3), Draft(lambda i: True), Target())
    assert none.accepted == 0 and none.acceptance_rate == 0.0 and len(none.iterations) == 20


def test_per_position_figures_are_exact() -> None:
    """max_tokens 8, K 4, perfect drafts: the iterations draft 4, then 2 (k = min(4, 8 - 5 -
    1)), so positions 0-1 were drafted twice and 2-3 once, and every draft was accepted. With
    the draft wrong at sequence position 4 (the first iteration's second draft): 4 drafted, 1
    accepted; then 4 and 4; then none (k = min(4, 8 - 7 - 1) = 0), which counts at no
    position."""
    s = run(request([1, 2, 3], 8, 4), Draft(), Target()).stats_dict()
    assert (s["per_position_drafted"], s["per_position_accepted"]) == ([2, 2, 1, 1], [2, 2, 1, 1])
    assert s["per_position_acceptance"] == [1.0, 1.0, 1.0, 1.0]
    assert (s["accept_hist"], s["steps"], s["emitted_tokens"]) == ([0, 0, 1, 0, 1], 2, 8)
    res = run(request([1, 2, 3], 8, 4), Draft(lambda i: i == 4), Target())
    assert [(it.drafted, it.accepted) for it in res.iterations] == [(4, 1), (4, 4), (0, 0)]
    s = res.stats_dict()
    assert (s["per_position_drafted"], s["per_position_accepted"]) == ([2, 2, 2, 2], [2, 1, 1, 1])
    assert s["per_position_acceptance"] == [1.0, 0.5, 0.5, 0.5]
    assert (s["accept_hist"], s["steps"], s["tau"]) == ([1, 1, 0, 0, 1], 3, 8 / 3)


@pytest.mark.parametrize("k", [0, 1, 3, 4])
@pytest.mark.parametrize("wrong", [lambda i: False, lambda i: i % 3 == 0, lambda i: True,
                                   lambda i: i % 5 > 1], ids=["perfect", "every-3rd-wrong",
                                                              "all-wrong", "mostly-wrong"])
def test_stats_dict_is_acceptance_stats_to_dict(k: int, wrong: Callable[[int], bool]) -> None:
    """The BLS loop's spec_stats_json has the keys and per-position meaning of the reference
    engine's (specserve.spec.stats.AcceptanceStats.to_dict) for the same verify steps, so the
    client merges both alike; a stop word cuts a step's emitted tokens (8 then 13 tokens)."""
    from specserve.spec.stats import AcceptanceStats

    for prompt in PROMPTS:
        full = greedy(prompt, 13)
        for n, stops in ((8, ()), (13, ((full[9],),)), (13, ((full[5], full[6]),))):
            res = run(request(prompt, n, k, stop_words=stops), Draft(wrong), Target())
            want = AcceptanceStats()
            for it in res.iterations:
                want.observe(it.drafted, it.accepted, len(it.new_tokens))
            assert res.stats_dict() == want.to_dict(), (prompt, n, stops)


def test_accepted_from_tokens_when_the_target_reports_none() -> None:
    prompt = [3, 1, 4]
    a = run(request(prompt, 20, 3), Draft(lambda i: i % 4 == 0), Target())
    b = run(request(prompt, 20, 3), Draft(lambda i: i % 4 == 0), Target(report=False))
    assert (a.tokens, a.accepted, a.drafted) == (b.tokens, b.accepted, b.drafted)


def _first_hit(prompt: list[int], n: int, pred: Callable[[int], bool]) -> int:
    out = greedy(prompt, n)
    return next(i for i, t in enumerate(out) if pred(t))


@pytest.mark.parametrize("include_stop", [False, True], ids=["target-stops", "target-returns"])
@pytest.mark.parametrize("k", [0, 2, 5])
def test_end_id_ends_and_is_not_output(include_stop: bool, k: int) -> None:
    prompt = [1, 2, 3]
    full = greedy(prompt, 40)
    eos = full[7]
    first = full.index(eos)
    target = Target(stops=frozenset({eos}), include_stop=include_stop)
    res = run(request(prompt, 40, k, end_id=eos), Draft(), target)
    assert res.tokens == full[:first]
    assert res.finish_reason == ("end_id" if include_stop else "target_end")
    # the loop does not ask again after the target ended (a new seed could continue it)
    assert max(len(c[0]) for c in target.calls) <= len(prompt) + first
    # a target that knows no end id returns it as a token: the loop cuts there
    res = run(request(prompt, 40, k, end_id=eos), Draft(), Target())
    assert res.tokens == full[:first] and res.finish_reason == "end_id"


def test_end_id_negative_or_none_never_stops() -> None:
    prompt = [1, 2, 3]
    for end in (None, -1):
        res = run(request(prompt, 30, 3, end_id=end), Draft(), Target())
        assert res.tokens == greedy(prompt, 30) and res.finish_reason == "length"


def test_min_tokens_keeps_early_stop_tokens() -> None:
    prompt = [1, 2, 3]
    full = greedy(prompt, 40)
    eos = full[2]
    later = [i for i, t in enumerate(full) if t == eos and i >= 6]
    target = Target(stops=frozenset({eos}))
    res = run(request(prompt, 40, 3, end_id=eos, min_tokens=6), Draft(), target)
    expected = full[:later[0]] if later else full
    assert res.tokens == expected
    assert all(c[3].min_tokens == min(max(0, 6 - (len(c[0]) - len(prompt))), len(c[1]) + 1)
               for c in target.calls)


def test_min_tokens_never_exceeds_the_target_calls_length() -> None:
    """A prompt-lookup draft that proposes nothing: each target call asks for one token, so its
    min_tokens is at most 1 (the model refuses min_tokens > request_output_len; seen through
    ``specserve conform``'s min-tokens check on the n-gram BLS), and early stops still wait."""
    prompt = [1, 2, 3]
    full = greedy(prompt, 40)
    eos = full[2]
    later = [i for i, t in enumerate(full) if t == eos and i >= 6]
    target = Target(stops=frozenset({eos}))
    res = run(request(prompt, 40, 4, end_id=eos, min_tokens=6), lambda c, k, s: ([], None),
              target)
    assert res.tokens == (full[:later[0]] if later else full)
    assert all(c[3].min_tokens <= len(c[1]) + 1 for c in target.calls)
    assert [c[3].min_tokens for c in target.calls][:7] == [1] * 6 + [0]


def test_stop_words_single_excluded_multi_included() -> None:
    prompt = [2, 7, 1]
    full = greedy(prompt, 60)
    single = full[9]
    res = run(request(prompt, 60, 4, stop_words=((single,),)), Draft(), Target())
    assert res.tokens == full[:full.index(single)]
    assert res.finish_reason == "stop_words"
    # a two-token stop word: kept in the output, found across iteration boundaries too
    for k in (0, 1, 2, 3, 5):
        word = (full[10], full[11])
        at = next(i for i in range(1, 60) if (full[i - 1], full[i]) == word)
        res = run(request(prompt, 60, k, stop_words=(word,)), Draft(), Target())
        assert res.tokens == full[:at + 1], k
        assert res.finish_reason == "stop_words"


def test_target_without_its_own_token_ends_the_loop() -> None:
    """No progress (nothing returned) or only accepted drafts (upstream's draft == target):
    the target has ended; the loop stops instead of asking again."""
    calls: list[int] = []

    def empty_target(ctx: list[int], drafts: list[int], logits: Any,
                     s: Sampling) -> tuple[list[int], int, int]:
        calls.append(1)
        return [], 0, len(drafts)

    res = run(request([1, 2], 10, 3), Draft(), empty_target)
    assert res.tokens == [] and res.finish_reason == "target_end" and len(calls) == 1

    def drafts_only(ctx: list[int], drafts: list[int], logits: Any,
                    s: Sampling) -> tuple[list[int], int, int]:
        return list(drafts[:2]), 2, len(drafts)

    res = run(request([1, 2], 10, 3), Draft(), drafts_only)
    assert res.tokens == greedy([1, 2], 2) and res.finish_reason == "target_end"
    assert len(res.iterations) == 1


def test_contract_violations_fail_loudly() -> None:
    def too_many(ctx: list[int], drafts: list[int], logits: Any,
                 s: Sampling) -> tuple[list[int], int, int]:
        return [1] * (len(drafts) + 2), 0, len(drafts)

    with pytest.raises(SpecLoopError, match="at most"):
        run(request([1], 10, 3), Draft(), too_many)

    def bad_count(ctx: list[int], drafts: list[int], logits: Any,
                  s: Sampling) -> tuple[list[int], int, int]:
        return [1], len(drafts) + 1, len(drafts)

    with pytest.raises(SpecLoopError, match="accepted"):
        run(request([1], 10, 3), Draft(), bad_count)

    def long_draft(ctx: list[int], k: int, s: Sampling) -> tuple[list[int], Any]:
        return [1] * (k + 1), None

    with pytest.raises(SpecLoopError, match="asked for"):
        run(request([1], 10, 3), long_draft, Target())
    for bad in (dict(max_tokens=0), dict(num_draft_tokens=-1), dict(min_tokens=11),
                dict(prompt=()), dict(stop_words=((),))):
        fields: dict[str, Any] = {"prompt": (1,), "max_tokens": 10, "num_draft_tokens": 2,
                                  **bad}
        with pytest.raises(ValueError):
            run(SpecRequest(**fields), Draft(), Target())


def test_draft_logits_reach_the_target_row_for_row() -> None:
    target = Target()
    run(request([1, 2, 3], 9, 3), Draft(logits=True), target)
    for _, drafts, logits, _ in target.calls:
        if drafts:
            assert [row[0] for row in logits] == [float(t) for t in drafts]
        else:
            assert logits is None


def test_seeds_distinct_per_call_and_derived_from_the_request_seed() -> None:
    seen: set[int] = set()
    for seed in (0, 1, 2, 2**64 - 1, 12345):
        for i in range(50):
            for role in ("draft", "target"):
                s = iteration_seed(seed, i, role)
                assert s is not None and 0 <= s < 2**64
                assert s not in seen
                seen.add(s)
    assert iteration_seed(7, 3, "draft") == iteration_seed(7, 3, "draft")
    assert iteration_seed(None, 3, "target") is None
    draft, target = Draft(lambda i: i % 2 == 0), Target()
    run(request([1, 2], 12, 2, sampling=Sampling(temperature=1.0, seed=99)), draft, target)
    dseeds = [c[2].seed for c in draft.calls]
    tseeds = [c[3].seed for c in target.calls]
    assert dseeds == [iteration_seed(99, i, "draft") for i in range(len(dseeds))]
    assert tseeds == [iteration_seed(99, i, "target") for i in range(len(tseeds))]
    assert len(set(dseeds + tseeds)) == len(dseeds) + len(tseeds) > 4
    assert all(c[2].temperature == 1.0 for c in draft.calls)
    draft, target = Draft(), Target()
    run(request([1, 2], 12, 2), draft, target)
    assert all(c[2].seed is None for c in draft.calls) and all(c[3].seed is None
                                                                for c in target.calls)


def test_iterations_stream_in_order_with_times() -> None:
    ticks = iter(range(100, 10**6, 10))
    seen: list[Iteration] = []
    res = run(request([4, 5], 11, 3), Draft(lambda i: i % 3 == 0), Target(),
              on_iteration=seen.append, clock=lambda: next(ticks))
    assert seen == res.iterations
    assert [t for it in seen for t in it.new_tokens] == res.tokens
    assert res.first_token_ns == seen[0].time_ns and res.last_token_ns == seen[-1].time_ns
    assert res.first_token_ns < res.last_token_ns


# --- drafting ahead: the next draft call beside the target's ---

class Ahead:
    """An ``ahead`` that runs each job on a thread and records what it was asked and which
    answers the loop waited for."""

    def __init__(self) -> None:
        self.started = 0
        self.waited = 0

    def __call__(self, job: Callable[[], Any]) -> Callable[[], Any]:
        import concurrent.futures

        self.started += 1
        pool = concurrent.futures.ThreadPoolExecutor(1)
        future = pool.submit(job)
        pool.shutdown(wait=False)

        def wait() -> Any:
            self.waited += 1
            return future.result()
        return wait


WRONG = {"perfect": lambda i: False, "every-3rd-wrong": lambda i: i % 3 == 0,
         "every-7th-wrong": lambda i: i % 7 == 0, "all-wrong": lambda i: True}


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("wrong", list(WRONG.values()), ids=list(WRONG))
def test_draft_ahead_changes_nothing_but_the_wait(k: int, wrong: Callable[[int], bool]) -> None:
    """With ``ahead`` the tokens, the iterations (drafts, target tokens, counts) and every
    target call equal the loop's without it, stops and end ids included; a draft call was
    started ahead after every iteration with a guess, and used only where its context came
    true (perfect drafts: every iteration after the second; the first target call, which
    prefills the prompt, runs alone)."""
    for prompt in PROMPTS:
        full = greedy(prompt, 17)
        for n, kw in ((1, {}), (5, {}), (17, {}), (17, {"stop_words": ((full[9],),)}),
                      (17, {"end_id": full[12]})):
            plain_t, ahead_t, ahead = Target(), Target(), Ahead()
            want = run(request(prompt, n, k, **kw), Draft(wrong), plain_t)
            got = run(request(prompt, n, k, **kw), Draft(wrong), ahead_t, ahead=ahead)
            assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
            strip = [(it.drafts, it.target_tokens, it.new_tokens, it.drafted, it.accepted)
                     for it in want.iterations]
            assert [(it.drafts, it.target_tokens, it.new_tokens, it.drafted, it.accepted)
                    for it in got.iterations] == strip, (prompt, n, kw)
            assert [c[:2] for c in ahead_t.calls] == [c[:2] for c in plain_t.calls]
            if wrong is WRONG["perfect"] and not kw:
                drafting = sum(1 for it in got.iterations if it.drafts)
                assert ahead.waited == max(0, drafting - 2), (prompt, n)
    # perfect drafts, 40 tokens, K 4: 8 iterations of 5 tokens, the last 6 drafted ahead and
    # none started past the end; only the first two draft calls are on the loop's own path
    ahead, draft = Ahead(), Draft()
    res = run(request([1, 2, 3], 40, 4), draft, Target(), ahead=ahead)
    assert len(res.iterations) == 8 and ahead.started == ahead.waited == 6
    assert len(draft.calls) == 8


def test_draft_ahead_asks_one_more_token_with_the_iterations_seed() -> None:
    """Every draft call after the first (in the loop or ahead) asks for k + 1 tokens with
    min_tokens k + 1, the first for k; each with the seed of the iteration that uses it; the
    target gets the first k."""
    draft, target = Draft(), Target()
    res = run(request([1, 2], 21, 3, sampling=Sampling(temperature=1.0, seed=5)), draft,
              target, ahead=Ahead())
    by_len = {ctx_len: (asked, s) for ctx_len, asked, s in draft.calls}
    produced = 0
    for i, it in enumerate(res.iterations):
        assert len(target.calls[i][1]) == max(0, min(3, 21 - produced - 1))
        if it.drafts:
            asked, s = by_len[2 + produced]
            assert asked == len(it.drafts) + (i > 0) and s.min_tokens == asked
            assert s.seed == iteration_seed(5, i, "draft")
        produced += len(it.new_tokens)


def test_draft_ahead_sends_the_logits_of_the_drafts_only() -> None:
    """A draft call asked for k + 1 tokens answers k + 1 logit rows; the target gets the rows
    of its k drafts, in order, never the guess's (planted: all k + 1 rows fails)."""
    for wrong in (WRONG["perfect"], WRONG["every-3rd-wrong"]):
        target, ahead = Target(), Ahead()
        run(request([1, 2, 3], 23, 4), Draft(wrong, logits=True), target, ahead=ahead)
        assert ahead.started > 0
        for _, drafts, logits, _ in target.calls:
            if drafts:
                assert [row[0] for row in logits] == [float(t) for t in drafts]


def test_draft_ahead_errors_surface_only_when_used() -> None:
    """A draft call started ahead that fails fails the request where its answer is used, and
    is dropped unseen where the loop drafted afresh instead."""
    class Failing(Draft):
        def __init__(self, fail_at: int, wrong: Callable[[int], bool]) -> None:
            super().__init__(wrong)
            self.fail_at = fail_at

        def __call__(self, ctx: list[int], k: int, s: Sampling) -> tuple[list[int], Any]:
            if len(self.calls) == self.fail_at:
                self.calls.append((len(ctx), k, s))
                raise RuntimeError("draft model gone")
            return super().__call__(ctx, k, s)

    # call 2 is the first started ahead (beside iteration 1's target call)
    with pytest.raises(RuntimeError, match="draft model gone"):
        run(request([1, 2, 3], 30, 4), Failing(2, lambda i: False), Target(), ahead=Ahead())
    # wrong at sequence positions 5 and 10: iteration 0 keeps 2 drafts (context 6), iteration
    # 1's guess (position 10) is wrong, so the call started ahead beside it is dropped
    wrong = lambda i: i in (5, 10)  # noqa: E731
    ahead = Ahead()
    res = run(request([1, 2, 3], 30, 4), Failing(2, wrong), Target(), ahead=ahead)
    assert res.tokens == greedy([1, 2, 3], 30)
    assert ahead.started == ahead.waited + 1  # the failed one, dropped


# --- temperature 1: the loop's seeds keep speculative sampling lossless ---

P_TABLE = [[0.2, 0.3, 0.5], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]]  # target p(next | last token)
Q_TABLE = [[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.4, 0.4, 0.2]]  # draft q(next | last token)


def _pick(dist: list[float], u: float) -> int:
    acc = 0.0
    for i, x in enumerate(dist):
        acc += x
        if u < acc:
            return i
    return len(dist) - 1


def sampled_draft(ctx: list[int], k: int, s: Sampling) -> tuple[list[int], Any]:
    rng = random.Random(s.seed)
    seq, rows = list(ctx), []
    for _ in range(k):
        q = Q_TABLE[seq[-1]]
        seq.append(_pick(q, rng.random()))
        rows.append(q)
    return seq[len(ctx):], rows


def rejection_target(ctx: list[int], drafts: list[int], logits: Any,
                     s: Sampling) -> tuple[list[int], int, int]:
    """Leviathan et al. 2023 Alg. 1 with q = the draft's rows; its own random.Random(seed)."""
    rng = random.Random(s.seed)
    seq, out = list(ctx), []
    for i, x in enumerate(drafts):
        p, q = P_TABLE[seq[-1]], logits[i]
        if rng.random() < p[x] / q[x]:
            out.append(x)
            seq.append(x)
            continue
        resid = [max(0.0, a - b) for a, b in zip(p, q, strict=True)]
        total = sum(resid)
        out.append(_pick([r / total for r in resid], rng.random()))
        return out, i, len(drafts)
    out.append(_pick(P_TABLE[seq[-1]], rng.random()))
    return out, len(drafts), len(drafts)


def _sample_loop(n: int, seed0: int) -> Counter[tuple[int, ...]]:
    return Counter(tuple(run(request([0], 3, 2, sampling=Sampling(temperature=1.0,
                                                                   seed=seed0 + i)),
                             sampled_draft, rejection_target).tokens) for i in range(n))


def _exact() -> dict[tuple[int, ...], float]:
    probs: dict[tuple[int, ...], float] = {}
    for a in range(3):
        for b in range(3):
            for c in range(3):
                probs[(a, b, c)] = P_TABLE[0][a] * P_TABLE[a][b] * P_TABLE[b][c]
    return probs


def _pvalue(counts: Counter[tuple[int, ...]], n: int) -> float:
    from scipy.stats import chisquare

    exact = _exact()
    cells = sorted(exact)
    return float(chisquare([counts[c] for c in cells], [exact[c] * n for c in cells]).pvalue)


N_SAMPLED = 6000


def test_sampling_through_the_loop_is_lossless() -> None:
    """Joint law of the first 3 tokens (27 cells) against the exact target-only law."""
    assert _pvalue(_sample_loop(N_SAMPLED, 0), N_SAMPLED) > 1e-4


def test_one_seed_for_every_call_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: upstream's rule (the request seed sent unchanged to every call) reuses
    the draft's uniforms in the verify step, which biases the output; the test above sees it."""
    monkeypatch.setattr(spec_loop, "iteration_seed", lambda seed, i, role: seed)
    assert _pvalue(_sample_loop(N_SAMPLED, 0), N_SAMPLED) < 1e-6


# --- n-gram prompt lookup ---

def test_ngram_longest_suffix_wins() -> None:
    #        0  1  2  3  4  5  6  7  8  9
    ctx = [1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3]
    # the 3-gram [1, 2, 3] occurred at 0 -> what followed: 9, 2, 3
    assert ngram.propose(ctx, 3, max_ngram=3) == [9, 2, 3]
    # with 2-grams only, [2, 3]'s most recent earlier occurrence (at 4) wins: 8, 7, 1
    assert ngram.propose(ctx, 3, max_ngram=2) == [8, 7, 1]
    assert ngram.propose(ctx, 1, max_ngram=2) == [8]


def test_ngram_prefers_recent_full_continuation_then_the_longest() -> None:
    ctx = [5, 6, 5, 6, 5, 6, 5]  # [5]'s occurrences at 0, 2, 4
    assert ngram.propose(ctx, 2, max_ngram=1) == [6, 5]  # the one at 4 has 2 followers
    assert ngram.propose(ctx, 4, max_ngram=1) == [6, 5, 6, 5]  # at 2 (4 at 4 is too short)
    run_ = [4, 4, 4, 4]
    assert ngram.propose(run_, 5, max_ngram=1) == [4, 4, 4]  # none has 5: the earliest (3)


def test_ngram_no_match_and_edge_cases() -> None:
    assert ngram.propose([1, 2, 3, 4], 3) == []
    assert ngram.propose([7], 3) == []
    assert ngram.propose([], 3) == []
    assert ngram.propose([1, 1, 1], 0) == []
    assert ngram.propose([1, 2, 1], 3, max_ngram=0) == []
    assert ngram.propose([1, 2, 1], 3) == [2, 1]


def test_ngram_agrees_with_the_reference_proposer() -> None:
    """The BLS proposes exactly what the engine's own n-gram speculation would."""
    from specserve.runtime.proposers import ngram_lookup

    rng = random.Random(0)
    for _ in range(2000):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 25))]
        k, n = rng.randrange(1, 6), rng.randrange(1, 4)
        assert ngram.propose(ctx, k, max_ngram=n) == ngram_lookup(ctx, k, max_n=n), (ctx, k, n)


def test_ngram_drafts_through_the_loop_are_greedy_exact() -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 3, 1, 4]

    def lookup(ctx: list[int], k: int, s: Sampling) -> tuple[list[int], Any]:
        return ngram.propose(ctx, k), None

    res = run(request(prompt, 30, 4), lookup, Target())
    assert res.tokens == greedy(prompt, 30)


def test_lib_is_self_contained() -> None:
    """bls_lib/*.py run inside NVIDIA's containers without specserve: stdlib imports, numpy (the
    Python backend's own dependency: pb_utils tensors are numpy arrays), the Python backend's
    ``triton_python_backend_utils`` (triton_io.py only) and each other. The one exception is
    the serving core's detokenizer, itself standard library only: the repository writer copies
    it next to them as ``lib/detok.py`` (``BLS_SHARED``), and ``spec_text.py`` imports the
    copy, falling back to ``specserve.serving.detok`` only when imported from the package."""
    import ast
    import sys

    from specserve import serving
    from specserve.triton.repository import BLS_SHARED

    shared = {f"specserve.serving.{name}" for name in BLS_SHARED}
    lib = Path(spec_loop.__file__).parent
    files = sorted(lib.glob("*.py")) + [Path(serving.__file__).parent / f"{name}.py"
                                        for name in BLS_SHARED]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                top = name.split(".")[0]
                relative = isinstance(node, ast.ImportFrom) and node.level > 0
                backend = top == "triton_python_backend_utils" and f.name == "triton_io.py"
                assert relative or backend or name in shared or top in ("__future__", "numpy") \
                    or top in sys.stdlib_module_names, (f.name, name)


def test_lib_in_a_repository_imports_without_specserve(tmp_path: Path) -> None:
    """A repository's ``tensorrt_llm_bls/1/lib`` imports with ``specserve`` unimportable (as in
    NVIDIA's containers): the detokenizer is the copy beside it."""
    import subprocess
    import sys

    from specserve.triton.repository import _bls_lib

    for rel, text in _bls_lib().items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    code = ("import sys; sys.modules['specserve'] = None\n"
            "from lib import spec_text, spec_io, spec_loop, ngram, background, detok\n"
            "assert spec_text.IncrementalDetokenizer is detok.IncrementalDetokenizer\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=tmp_path / "tensorrt_llm_bls" / "1")
