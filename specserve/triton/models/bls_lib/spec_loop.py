"""The draft-target loop of ``tensorrt_llm_bls`` (speculative decoding driven from the BLS), pure.

Self-contained (standard library only, no Triton import): copied into a repository as
``tensorrt_llm_bls/1/lib/spec_loop.py``; the BLS model injects two callables that call the Triton
models, the unit tests inject scripted ones (``tests/triton/test_bls_spec_loop.py``).

Upstream contract (read, not copied): NVIDIA/TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py``
``Decoder._spec_generate`` @ 4db68284ec5583177f1cf72c109a479f8733b848 and ``lib/triton_decoder.py``
``_draft_generate_non_streaming`` / ``_get_llm_tensors_from_request`` @
07f3e442717f402fba3ef7b6471363747e31e3e1 (the same loop as triton-inference-server/
tensorrtllm_backend ``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py`` @
89ee0f20d5066dc9e2da9af33f0825841eb7d906, v0.19.0). Facts taken from there:

- one request (batch 1) at a time; preprocessing once, then per iteration ``k = min(K,
  prompt_len + max_tokens - len(context) - 1)``;
- the draft model gets the context as ``input_ids``, ``request_output_len = k``,
  ``min_tokens = k`` and ``return_generation_logits = use_draft_logits``; its new tokens are the
  drafts, its ``generation_logits`` ``[1, 1, k, V]`` the draft logits;
- the target gets the context, ``draft_input_ids`` (+ ``draft_logits`` when ``use_draft_logits``)
  and ``request_output_len = len(drafts) + 1`` (1 when there are no drafts); both calls are
  non-streaming, the target's output becomes the next context;
- the loop ends at the length limit, when the target's output equals the draft's (no token of
  its own), when the output stops changing (no progress), or at a stop word.

specserve's own rules on top (documented in docs/architecture.md, "Triton contract"):

- **Seeds.** Upstream sends the request's seed unchanged to every call, so at temperature > 0
  every iteration (and the draft and the target of one iteration) would reuse the same random
  numbers; the verify step's uniforms must be independent of the drafts for rejection sampling to
  be lossless. Here call ``role`` of iteration ``i`` gets :func:`iteration_seed` ``(seed, i,
  role)``: splitmix64 of splitmix64(seed) + 2i + (1 draft | 2 target), distinct for every call of
  a request (splitmix64 is a bijection of 64-bit integers). No seed stays no seed.
- **Stops** are decided here, as the reference decoder decides them
  (``runtime/batch.py`` ``Batch.emit``): ``end_id`` and single-token stop words end the output
  and are not part of it,
  multi-token stop words end it and are kept, none of them counts before ``min_tokens`` tokens,
  ``max_tokens`` caps it. A target that stops by itself (its own end id, stop word or length)
  answers with no token of its own: every token it returned equals the draft at that position
  (accepted drafts only; upstream's "draft == target" and "no progress"): the loop ends there,
  because asking again with a new seed could continue a sequence the target had ended.
- The draft gets ``end_id = -1`` and no stop words (it always proposes k tokens); ``min_tokens``
  for the target is what is left of the request's ``min_tokens``, at most that call's
  ``request_output_len`` (``len(drafts) + 1``; the model refuses a larger one).
- **Drafting ahead** (``ahead``, optional): from the second iteration on (the first target
  call prefills the prompt and runs alone, so the time to the first token is the loop's
  without it), each draft call asks for one token more than it sends to the target, a guess
  of the target's own next token. While the target verifies, the
  next iteration's draft call runs beside it on the context the loop would have if every
  draft is accepted and the target's token equals the guess (PEARL's "post-verify", Liu et al.
  2024, "PEARL: Parallel Speculative Decoding with Adaptive Draft Length"). The next
  iteration uses that answer only when its context is exactly that one; otherwise it
  drafts afresh and the answer is dropped. The drafts a target sees are then the ones a call
  on that context would have made (the same call, seed included), so outputs and figures are
  those of the loop without it, for a draft whose first k tokens do not depend on how many it
  is asked for (a sequential sampler's do; greedy ones always): only the draft call's wait
  leaves the critical path. Lossless either way: the target verifies whatever it is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

MASK64 = (1 << 64) - 1
_ROLES = {"draft": 1, "target": 2}


def splitmix64(x: int) -> int:
    """One step of the splitmix64 mixer (Steele, Lea, Flood 2014), a bijection on 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def iteration_seed(seed: int | None, iteration: int, role: str) -> int | None:
    """The seed of call ``role`` ("draft" or "target") of iteration ``iteration`` (0-based)."""
    if seed is None:
        return None
    return splitmix64((splitmix64(seed & MASK64) + 2 * iteration + _ROLES[role]) & MASK64)


@dataclass(frozen=True)
class Sampling:
    """What a draft or target call samples with (``min_tokens`` relative to that call).
    ``temperature`` / ``top_k`` / ``top_p`` None: the client did not set it, and the call leaves
    the tensor out (the executor's own default, as upstream's ``create_triton_tensors`` skips
    ``None`` fields), never a stand-in value such as T = 0."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    min_tokens: int = 0


@dataclass(frozen=True)
class SpecRequest:
    """One request of the loop. ``end_id`` None or negative: never stop on a token."""

    prompt: tuple[int, ...]
    max_tokens: int
    num_draft_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    min_tokens: int = 0

    def validate(self) -> None:
        if not self.prompt:
            raise ValueError("empty prompt")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(not w for w in self.stop_words):
            raise ValueError("empty stop word")


# draft(context, k, sampling) -> (k tokens or fewer, logits [k, V] or None)
DraftFn = Callable[[list[int], int, Sampling], tuple[list[int], Any]]
# target(context, drafts, draft logits or None, sampling) -> (new tokens, accepted, drafted)
TargetFn = Callable[[list[int], list[int], Any, Sampling], tuple[list[int], int, int]]
# ahead(job) -> wait: starts the draft call ``job`` beside the caller; ``wait()`` returns its
# answer (or raises its error)
DraftAnswer = tuple[list[int], Any]
AheadFn = Callable[[Callable[[], DraftAnswer]], Callable[[], DraftAnswer]]


@dataclass(frozen=True)
class Iteration:
    """One draft + verify round: the tokens it added to the output (after the stop rules)."""

    index: int
    drafts: list[int]
    target_tokens: list[int]
    new_tokens: list[int]
    drafted: int
    accepted: int
    time_ns: int


@dataclass
class LoopResult:
    """The generated tokens and the request's speculation figures."""

    tokens: list[int]
    finish_reason: str  # "length" | "end_id" | "stop_words" | "target_end"
    iterations: list[Iteration]
    drafted: int = 0
    accepted: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (TensorRT-LLM's ``acceptance_rate``); 0 when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def stats_dict(self) -> dict[str, Any]:
        """The request's figures in the shape of specserve's ``AcceptanceStats.to_dict()`` (the
        ``spec_stats_json`` output): one verify step per iteration."""
        depth = max((it.drafted for it in self.iterations), default=0)
        per_drafted = [sum(it.drafted > i for it in self.iterations) for i in range(depth)]
        per_accepted = [sum(it.accepted > i for it in self.iterations) for i in range(depth)]
        hist = [0] * (max((it.accepted for it in self.iterations), default=0) + 1)
        for it in self.iterations:
            hist[it.accepted] += 1
        steps = len(self.iterations)
        emitted = sum(len(it.new_tokens) for it in self.iterations)
        return {
            "draft_tokens": self.drafted, "accepted_tokens": self.accepted,
            "emitted_tokens": emitted, "steps": steps,
            "acceptance_rate": self.acceptance_rate, "tau": emitted / steps if steps else 0.0,
            "per_position_drafted": per_drafted, "per_position_accepted": per_accepted,
            "per_position_acceptance": [a / d if d else 0.0
                                        for a, d in zip(per_accepted, per_drafted, strict=True)],
            "accept_hist": hist if steps else [], "accepted_nodes": {},
        }


class SpecLoopError(RuntimeError):
    """A draft or target call answered outside the contract."""


def accepted_prefix(drafts: Sequence[int], tokens: Sequence[int]) -> int:
    """How many leading target tokens equal the drafts (the accepted drafts, when the target
    reports no count: a rejected position's token never equals its draft)."""
    n = 0
    for d, t in zip(drafts, tokens, strict=False):
        if d != t:
            break
        n += 1
    return n


class _Output:
    """The output so far and the stop rules (the reference decoder's ``emit``)."""

    def __init__(self, req: SpecRequest) -> None:
        self.req = req
        self.tokens: list[int] = []
        self.single = {w[0] for w in req.stop_words if len(w) == 1}
        if req.end_id is not None and req.end_id >= 0:
            self.single.add(req.end_id)
        self.multi = [list(w) for w in req.stop_words if len(w) > 1]
        self.finish = ""

    def add(self, tokens: list[int]) -> list[int]:
        new: list[int] = []
        for t in tokens:
            armed = len(self.tokens) >= self.req.min_tokens
            if t in self.single and armed:
                self.finish = "end_id" if t == self.req.end_id else "stop_words"
                break
            self.tokens.append(t)
            new.append(t)
            if len(self.tokens) >= self.req.max_tokens:
                self.finish = "length"
                break
            if armed and any(self.tokens[-len(w):] == w for w in self.multi):
                self.finish = "stop_words"
                break
        return new


@dataclass(frozen=True)
class _Ahead:
    """A draft call started ahead: the context it assumed (which also fixes its ``k``), and
    its answer's wait."""

    context: list[int]
    wait: Callable[[], DraftAnswer]


def _draft_sampling(req: SpecRequest, index: int, n: int) -> Sampling:
    return replace(req.sampling, seed=iteration_seed(req.sampling.seed, index, "draft"),
                   min_tokens=n)


def _checked(answer: DraftAnswer, k: int, asked: int) -> tuple[list[int], Any, int | None]:
    """(the first ``k`` drafts, their logits or None, the guess after them or None) of a draft
    call asked for ``asked`` (k or k + 1) tokens."""
    tokens, logits = [int(t) for t in answer[0]], answer[1]
    if len(tokens) > asked:
        raise SpecLoopError(f"draft returned {len(tokens)} tokens, asked for {asked}")
    drafts, guess = tokens[:k], (tokens[k] if len(tokens) > k else None)
    if not drafts:
        return [], None, guess
    if logits is not None and len(logits) < len(tokens):
        raise SpecLoopError(f"draft returned logits for {len(logits)} positions and "
                            f"{len(tokens)} tokens")
    if logits is not None:
        logits = logits[len(logits) - len(tokens):][:len(drafts)]
    return drafts, logits, guess


def run(req: SpecRequest, draft: DraftFn, target: TargetFn,
        on_iteration: Callable[[Iteration], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns, ahead: AheadFn | None = None
        ) -> LoopResult:
    """Generate ``req`` by draft + verify rounds until a stop rule fires (see the module
    docstring). ``on_iteration`` sees every iteration (streaming: its ``new_tokens``);
    ``ahead``: draft the next iteration while the target verifies (module docstring).

    Terminates: an iteration that does not end the loop added at least one token (the target's
    own token), and ``max_tokens`` ends it."""
    req.validate()
    out = _Output(req)
    result = LoopResult(tokens=out.tokens, finish_reason="", iterations=[])
    index = 0
    pending: _Ahead | None = None
    while True:
        context = [*req.prompt, *out.tokens]
        remaining = req.max_tokens - len(out.tokens)
        k = min(req.num_draft_tokens, remaining - 1)
        drafts: list[int] = []
        logits: Any = None
        guess: int | None = None
        # the first target call prefills the prompt: it runs alone (TTFT as without ``ahead``)
        extra = int(ahead is not None and index > 0)
        if k > 0:
            if pending is not None and pending.context == context:
                answer = pending.wait()
            else:
                answer = draft(context, k + extra, _draft_sampling(req, index, k + extra))
            drafts, logits, guess = _checked(answer, k, k + extra)
        pending = None
        if ahead is not None and guess is not None:
            pending = _start_ahead(req, draft, ahead, [*context, *drafts, guess], index + 1)
        # what is left of min_tokens, at most this call's output length (drafts + 1): a
        # prompt-lookup draft may propose fewer than k tokens, or none
        target_sampling = replace(req.sampling,
                                  seed=iteration_seed(req.sampling.seed, index, "target"),
                                  min_tokens=min(max(0, req.min_tokens - len(out.tokens)),
                                                 len(drafts) + 1))
        tokens, accepted, drafted = target(context, drafts, logits, target_sampling)
        tokens = [int(t) for t in tokens]
        if len(tokens) > len(drafts) + 1:
            raise SpecLoopError(f"target returned {len(tokens)} tokens for {len(drafts)} drafts "
                                f"(at most {len(drafts) + 1})")
        if not 0 <= accepted <= drafted <= len(drafts):
            raise SpecLoopError(f"target reported {accepted} accepted of {drafted} drafted for "
                                f"{len(drafts)} drafts")
        new = out.add(tokens)
        now = clock()
        if new:
            result.first_token_ns = result.first_token_ns or now
            result.last_token_ns = now
        it = Iteration(index=index, drafts=drafts, target_tokens=tokens, new_tokens=new,
                       drafted=drafted, accepted=accepted, time_ns=now)
        result.iterations.append(it)
        result.drafted += drafted
        result.accepted += accepted
        if on_iteration is not None:
            on_iteration(it)
        if not out.finish and len(tokens) <= accepted_prefix(drafts, tokens):
            out.finish = "target_end"  # no token of the target's own: it has ended
        if out.finish:
            result.finish_reason = out.finish
            return result
        index += 1
        if index >= req.max_tokens:  # cannot happen (see above): never spin on a broken rule
            raise SpecLoopError(f"{index} iterations without finishing {req.max_tokens} tokens")


def _start_ahead(req: SpecRequest, draft: DraftFn, ahead: AheadFn, context: list[int],
                 index: int) -> _Ahead | None:
    """Iteration ``index``'s draft call on ``context`` (every draft accepted and the guess
    right), started now; None when that iteration would draft nothing."""
    k = min(req.num_draft_tokens, req.max_tokens - (len(context) - len(req.prompt)) - 1)
    if k <= 0:
        return None
    sampling = _draft_sampling(req, index, k + 1)
    return _Ahead(context, ahead(lambda: draft(context, k + 1, sampling)))
