"""What every check shares: the :class:`Context` (both targets, the run's settings), the
:class:`Outcome` of a check, the registry, and the comparison helpers.

Verdicts: ``pass``; ``fail`` (evidence: the smallest request that shows it);
``refused`` (the server said no cleanly, or the protocol cannot express the request); ``broken``
(crash, hang, 5xx, wrong shape). A check compares the speculative target with the baseline on
the same probe; where the baseline itself refuses, the row says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specserve.conform.probe import NotExpressible, Probe, Reply
from specserve.conform.targets import Target

VERDICTS = ("pass", "fail", "refused", "broken")
NOT_RUN = "not run"

# Code prompts for small code models (the demo pair is trained on Python's standard library).
PROMPTS = (
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        self.",
    "for i in range(10):\n    print(",
)
UNICODE_PROMPT = '# café, naïve, 日本語\nname = "café"\nother = "naïve"\nthird = "'


@dataclass(frozen=True)
class Settings:
    """Knobs of a run (CLI options of the same names)."""

    max_tokens: int = 32
    timeout_s: float = 120.0
    seed: int = 1234
    samples: int = 300          # check 5: samples per side per prefix
    dist_tokens: int = 3        # check 5: tokens per sample (the category is the continuation)
    alpha: float = 1e-3         # check 5: family-wise level (Bonferroni over the prefixes)
    logprob_tol: float = 0.02   # check 7: |logprob spec - baseline| bound, nats
    top_logprobs: int = 5
    context_limit: int | None = None   # check 9: prompt + output tokens; None = ask the server
    concurrency: int = 8
    tokenizer: str | None = None       # tokenizer.json (or its directory): ids for stop ids


@dataclass
class Outcome:
    """A check's verdict, one line of detail, and JSON evidence (for fail/refused/broken, and
    the statistics of a pass)."""

    verdict: str
    detail: str
    evidence: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS + (NOT_RUN,):
            raise ValueError(f"unknown verdict {self.verdict!r}")


@dataclass
class Context:
    """Both targets and the run's settings; ``deadline`` is this check's monotonic end."""

    spec: Target
    base: Target
    settings: Settings = field(default_factory=Settings)
    deadline: float = float("inf")
    context_limit: int | None = None
    requests: int = 0

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    async def send(self, target: Target, probe: Probe) -> Reply:
        self.requests += 1
        return await target.send(probe, self.settings.timeout_s)

    async def both(self, probe: Probe) -> tuple[Reply, Reply]:
        """The same probe to the speculative target and to the baseline."""
        s, b = await asyncio.gather(self.send(self.spec, probe), self.send(self.base, probe))
        return s, b

    async def many(self, target: Target, probes: Sequence[Probe], concurrency: int = 1
                   ) -> list[Reply]:
        """``probes`` with at most ``concurrency`` in flight; answers in probe order."""
        sem = asyncio.Semaphore(max(concurrency, 1))

        async def one(p: Probe) -> Reply:
            async with sem:
                return await self.send(target, p)
        return list(await asyncio.gather(*(one(p) for p in probes)))


CheckFn = Callable[[Context], Awaitable[Outcome]]


@dataclass(frozen=True)
class Check:
    """One registered check: ``group`` is the check's number (1..9)."""

    name: str
    group: int
    title: str
    fn: CheckFn


REGISTRY: dict[str, Check] = {}


def check(name: str, group: int, title: str) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as check ``name``."""
    def deco(fn: CheckFn) -> CheckFn:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY[name] = Check(name, group, title, fn)
        return fn
    return deco


def token_ids(ctx: Context, reply: Reply) -> tuple[list[int] | None, str]:
    """The first choice's token ids: from the answer, else the text encoded with
    ``--tokenizer`` (a re-encoding: close to, not always, the generated ids); and the source."""
    if reply.first.token_ids is not None:
        return reply.first.token_ids, "answer"
    if ctx.settings.tokenizer is None:
        return None, "none"
    from pathlib import Path

    from tokenizers import Tokenizer

    path = Path(ctx.settings.tokenizer)
    tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    return list(tok.encode(reply.first.text, add_special_tokens=False).ids), "tokenizer"


def evidence(probe_reply: Reply, base: Reply | None = None, **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"request": probe_reply.wire, "spec": probe_reply.to_dict()}
    if base is not None:
        out["baseline"] = base.to_dict()
    out.update(more)
    return out


def error_outcome(spec: Reply, base: Reply | None = None) -> Outcome | None:
    """The verdict when either answer is an error (None when both are answers)."""
    if spec.broken:
        return Outcome("broken", f"speculative server: {spec.error}", evidence(spec, base))
    if spec.refused:
        also = ("" if base is None else " (the baseline refuses it too)" if base.refused
                else " (the baseline serves it)")
        return Outcome("refused", f"{spec.error}{also}", evidence(spec, base))
    if base is not None and not base.ok:
        what = "broken" if base.broken else "refuses it"
        return Outcome("refused", f"the baseline {what} ({base.error}); nothing to compare",
                       evidence(spec, base))
    return None


def not_expressible(e: NotExpressible) -> Outcome:
    return Outcome("refused", f"not expressible: {e}")


def same_answer(spec: Reply, base: Reply) -> str | None:
    """Why two answers differ (text, token ids, completion tokens, finish reason), or None."""
    a, b = spec.first, base.first
    if a.text != b.text:
        i = next((k for k, (x, y) in enumerate(zip(a.text, b.text, strict=False)) if x != y),
                 min(len(a.text), len(b.text)))
        return (f"text differs from character {i}: spec {a.text[i:i + 24]!r} vs baseline "
                f"{b.text[i:i + 24]!r}")
    if a.token_ids is not None and b.token_ids is not None and a.token_ids != b.token_ids:
        return f"token ids differ: {a.token_ids[:16]} vs {b.token_ids[:16]}"
    if spec.completion_tokens != base.completion_tokens:
        return (f"completion_tokens {spec.completion_tokens} vs baseline "
                f"{base.completion_tokens}")
    if a.finish_reason != b.finish_reason:
        return f"finish_reason {a.finish_reason!r} vs baseline {b.finish_reason!r}"
    return None


async def shrink(ctx: Context, probe: Probe,
                 differs: Callable[[Reply, Reply], str | None]) -> tuple[Probe, Reply, Reply]:
    """The smallest ``max_tokens`` (halving) at which ``differs`` still holds for ``probe``
    on both targets; returns that probe and its two answers (the original when none fails)."""
    best: tuple[Probe, Reply, Reply] | None = None
    m = probe.max_tokens
    while m >= 1 and ctx.time_left() > ctx.settings.timeout_s:
        p = probe.but(max_tokens=m)
        s, b = await ctx.both(p)
        if not (s.ok and b.ok) or differs(s, b) is None:
            break
        best = (p, s, b)
        m //= 2
    if best is None:
        s, b = await ctx.both(probe)
        return probe, s, b
    return best


def worst(outcomes: Sequence[Outcome]) -> Outcome:
    """broken > fail > refused > pass: the first outcome of the worst kind."""
    for v in ("broken", "fail", "refused"):
        for o in outcomes:
            if o.verdict == v:
                return o
    return outcomes[0]
