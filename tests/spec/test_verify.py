"""Verification core: exact tables, a slow loop reference, distribution tests with a negative
control, and hypothesis properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from specserve.spec.sampling import logits_to_probs
from specserve.spec.verify import (
    VerifyResult,
    greedy_verify,
    rejection_sample,
    typical_acceptance,
)

NEG = -10.0
POS = 10.0


def logits_for(best: list[list[int]], vocab: int = 6) -> torch.Tensor:
    """[B, K+1, V] logits with +10 at the chosen argmax, -10 elsewhere."""
    t = torch.full((len(best), len(best[0]), vocab), NEG)
    for b, row in enumerate(best):
        for i, tok in enumerate(row):
            t[b, i, tok] = POS
    return t


@pytest.mark.parametrize(
    "draft, best, tokens, n",
    [
        ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]], [4]),  # full accept + bonus
        ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]], [2]),  # early reject, correction
        ([[1, 2, 3]], [[0, 2, 3, 4]], [[0, -1, -1, -1]], [1]),  # first rejected
        ([[1, 2], [1, 2], [3, 3]], [[1, 2, 0], [1, 0, 0], [1, 1, 1]],
         [[1, 2, 0], [1, 0, -1], [1, -1, -1]], [3, 2, 1]),  # rows accept different counts
    ],
)
def test_greedy_table(draft, best, tokens, n) -> None:  # type: ignore[no-untyped-def]
    r = greedy_verify(torch.tensor(draft), logits_for(best))
    assert r.tokens.tolist() == tokens
    assert r.num_emitted.tolist() == n


def test_greedy_empty_draft_emits_argmax() -> None:
    r = greedy_verify(torch.zeros((2, 0), dtype=torch.long), logits_for([[3], [5]]))
    assert r.tokens.tolist() == [[3], [5]]
    assert r.num_emitted.tolist() == [1, 1]


def test_rejection_empty_draft_is_plain_sampling() -> None:
    p = torch.tensor([[[0.0, 1.0, 0.0]]])
    r = rejection_sample(torch.zeros((1, 0), dtype=torch.long), None, p, torch.Generator())
    assert r.tokens.tolist() == [[1]]


def test_rejection_certain_outcomes() -> None:
    """Hand-built: p puts all mass on the drafts (accept all, bonus from p[K]); p with zero
    mass on the draft (reject at 0, residual = p)."""
    g = torch.Generator().manual_seed(0)
    p = torch.zeros(1, 3, 4)
    p[0, 0, 1] = p[0, 1, 2] = p[0, 2, 3] = 1.0
    q = torch.full((1, 2, 4), 0.25)
    r = rejection_sample(torch.tensor([[1, 2]]), q, p, g)
    assert r.tokens.tolist() == [[1, 2, 3]] and r.num_emitted.tolist() == [3]
    p2 = torch.zeros(1, 3, 4)
    p2[0, :, 0] = 1.0
    r2 = rejection_sample(torch.tensor([[1, 2]]), q, p2, g)
    assert r2.tokens.tolist() == [[0, -1, -1]]


def test_q_zero_where_p_positive_accepts_and_p_equals_q_never_divides() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    q = torch.tensor([[[1.0, 0.0, 0.0]]])
    r = rejection_sample(torch.tensor([[1]]), q, p, g)  # q(x)=0, p(x)>0: accept
    assert r.num_emitted.tolist() == [2] and r.tokens[0, 0].item() == 1
    n = 4000  # p == q: every row accepts its draft; the bonus token is drawn from p[K]
    pq = torch.tensor([[[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]]).expand(n, 2, 3)
    r2 = rejection_sample(torch.full((n, 1), 2), pq[:, :1], pq, g)
    assert r2.num_emitted.eq(2).all(), f"{int(r2.num_emitted.ne(2).sum())} of {n} rejected"
    assert r2.tokens[:, 0].eq(2).all()
    freq = torch.bincount(r2.tokens[:, 1], minlength=3).double() / n
    # binomial sd of a frequency over 4000 draws <= 0.008; 0.04 is 5 sd (seeded, so fixed)
    assert torch.allclose(freq, pq[0, 1].double(), atol=0.04), freq.tolist()


def test_seeded_determinism() -> None:
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(16, 4, 8), -1)
    q = torch.softmax(torch.randn(16, 3, 8), -1)
    d = torch.multinomial(q.reshape(-1, 8), 1).reshape(16, 3)
    a = rejection_sample(d, q, p, torch.Generator().manual_seed(7))
    b = rejection_sample(d, q, p, torch.Generator().manual_seed(7))
    assert torch.equal(a.tokens, b.tokens)


# --- slow loop reference (Leviathan Alg. 1 written plainly), same random stream -------------


def loop_reference(draft, q, p, gen) -> VerifyResult:  # type: ignore[no-untyped-def]
    b, k = draft.shape
    u = torch.rand((b, k), generator=gen)
    out = torch.full((b, k + 1), -1, dtype=torch.long)
    dists, n_acc = [], []
    for row in range(b):
        n = 0
        while n < k:
            x = int(draft[row, n])
            qx = 1.0 if q is None else float(q[row, n, x])
            if float(u[row, n]) * qx < float(p[row, n, x]):
                out[row, n] = x
                n += 1
            else:
                break
        if n < k:
            qn = torch.zeros(p.shape[-1]) if q is None else q[row, n]
            if q is None:
                qn[int(draft[row, n])] = 1.0
            res = torch.clamp(p[row, n] - qn, min=0.0)
            dist = res / res.sum() if res.sum() > 0 else p[row, n]
        else:
            dist = p[row, k]
        dists.append(dist)
        n_acc.append(n)
    nxt = torch.multinomial(torch.stack(dists), 1, generator=gen).squeeze(-1)
    for row in range(b):
        out[row, n_acc[row]] = nxt[row]
    return VerifyResult(out, torch.tensor(n_acc) + 1)


@pytest.mark.parametrize("one_hot", [False, True])
def test_vectorized_matches_loop_reference(one_hot: bool) -> None:
    torch.manual_seed(3)
    b, k, v = 64, 4, 6
    p = torch.softmax(torch.randn(b, k + 1, v) * 2, -1)
    q = None if one_hot else torch.softmax(torch.randn(b, k, v) * 2, -1)
    draft = torch.randint(0, v, (b, k))
    fast = rejection_sample(draft, q, p, torch.Generator().manual_seed(11))
    slow = loop_reference(draft, q, p, torch.Generator().manual_seed(11))
    assert torch.equal(fast.tokens, slow.tokens)
    assert torch.equal(fast.num_emitted, slow.num_emitted)


# --- distribution: chi-square of emitted tokens vs p -----------------------------------------

V = 8
N_DRAWS = 120_000
P_THRESHOLD = 1e-3  # a correct verifier fails this with probability 1e-3 per test (seeded)


def _emitted_hist(verifier, p_vec, q_vec, k, seed, position):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    q = q_vec.expand(N_DRAWS, k, V).contiguous()
    p = p_vec.expand(N_DRAWS, k + 1, V).contiguous()
    draft = torch.multinomial(q_vec.expand(N_DRAWS * k, V), 1, replacement=True,
                              generator=gen).reshape(N_DRAWS, k)
    r = verifier(draft, q, p, gen)
    rows = r.num_emitted > position
    toks = r.tokens[rows, position]
    return torch.bincount(toks, minlength=V).double(), int(rows.sum())


def _case(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    if name == "equal":
        p = torch.softmax(torch.randn(V, generator=g), -1)
        return p, p.clone()
    if name == "disjoint":
        p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0])
        return p, torch.tensor([0, 0, 0, 0, 0.25, 0.25, 0.25, 0.25])
    if name == "q_zero_where_p_positive":
        p = torch.tensor([0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
        return p, torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0, 0])
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    return p, q


def _pvalue(hist: torch.Tensor, n: int, p: torch.Tensor) -> float:
    support = p > 0
    assert hist[~support].sum() == 0, "emitted a token with p = 0"
    ps = p[support].double()
    expected = (ps / ps.sum() * n).numpy()
    return float(chisquare(hist[support].numpy(), expected).pvalue)


@pytest.mark.parametrize("case", ["equal", "disjoint", "q_zero_where_p_positive", "random"])
@pytest.mark.parametrize("position", [0, 1])
def test_emitted_tokens_distributed_as_target(case: str, position: int) -> None:
    """Positions are i.i.d. from p here, so the first and second emitted tokens must follow p.
    Bound: chi-square p-value > 1e-3, 120k draws, seed 5."""
    p, q = _case(case)
    hist, n = _emitted_hist(rejection_sample, p, q, k=3, seed=5, position=position)
    if case == "disjoint" and position == 1:
        assert n == 0  # nothing is ever accepted: no row reaches a second emitted token
        return
    assert _pvalue(hist, n, p) > P_THRESHOLD


def skip_residual_verifier(draft, q, p, gen) -> VerifyResult:  # type: ignore[no-untyped-def]
    """Planted bug: on rejection sample from p instead of norm(max(0, p - q))."""
    r = rejection_sample(draft, q, p, gen)
    rows = torch.arange(draft.shape[0])
    n = r.num_accepted
    rejected = n < draft.shape[1]
    resample = torch.multinomial(p[rows, n], 1, generator=gen).squeeze(-1)
    tokens = r.tokens.clone()
    tokens[rejected, n[rejected]] = resample[rejected]
    return VerifyResult(tokens, r.num_emitted)


@pytest.mark.parametrize("case", ["q_zero_where_p_positive", "random"])
def test_planted_wrong_verifier_fails_the_same_test(case: str) -> None:
    """The distribution test has power: the skip-residual bug gives p-value < 1e-6."""
    p, q = _case(case)
    hist, n = _emitted_hist(skip_residual_verifier, p, q, k=3, seed=5, position=0)
    assert _pvalue(hist, n, p) < 1e-6


def test_typical_acceptance_is_lossy_and_named() -> None:
    """Typical acceptance changes the distribution (why it is never the default)."""
    p = torch.tensor([0.6, 0.4, 0, 0, 0, 0, 0, 0])
    q = torch.tensor([0.0, 1.0, 0, 0, 0, 0, 0, 0])

    def typical(d, q_, p_, g):  # type: ignore[no-untyped-def]
        return typical_acceptance(d, p_, g)

    hist, n = _emitted_hist(typical, p, q, k=2, seed=5, position=0)
    assert _pvalue(hist, n, p) < 1e-6


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), k=st.integers(0, 5), v=st.integers(2, 7), seed=st.integers(0, 10**6))
def test_property_bounds_and_padding(b: int, k: int, v: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    draft = torch.randint(0, v, (b, k), generator=g)
    for r in (rejection_sample(draft, q, p, g), greedy_verify(draft, torch.log(p))):
        assert ((r.num_emitted >= 1) & (r.num_emitted <= k + 1)).all()
        for row in range(b):
            n = int(r.num_emitted[row])
            assert (r.tokens[row, :n] >= 0).all() and (r.tokens[row, n:] == -1).all()
            assert r.tokens[row, : n - 1].tolist() == draft[row, : n - 1].tolist()


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), k=st.integers(1, 5), v=st.integers(2, 7), seed=st.integers(0, 10**6))
def test_property_q_equals_p_accepts_everything(b: int, k: int, v: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    draft = torch.multinomial(p[:, :k].reshape(-1, v), 1, generator=g).reshape(b, k)
    r = rejection_sample(draft, p[:, :k], p, g)
    assert (r.num_emitted == k + 1).all()


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), k=st.integers(1, 5), v=st.integers(2, 7), seed=st.integers(0, 10**6))
def test_property_greedy_argmax_draft_accepts_everything(b: int, k: int, v: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g)
    r = greedy_verify(logits[:, :k].argmax(-1), logits)
    assert (r.num_emitted == k + 1).all()
    assert torch.equal(r.tokens, logits.argmax(-1))


def test_temperature_zero_rejection_equals_greedy() -> None:
    """One-hot target probabilities make rejection sampling exactly greedy."""
    torch.manual_seed(9)
    logits = torch.randn(32, 4, 10)
    draft = torch.randint(0, 10, (32, 3))
    greedy = greedy_verify(draft, logits)
    sampled = rejection_sample(draft, None, logits_to_probs(logits, 0.0), torch.Generator())
    assert torch.equal(greedy.tokens, sampled.tokens)
