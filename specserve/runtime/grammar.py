"""Structured output: guides compiled with xgrammar for the engine's tokenizer,
one matcher per request, and the per-step work of speculative decoding under a grammar.

Guide types are TensorRT-LLM's (tensorrtllm_backend ``tensorrt_llm/1/model.py``
``get_guided_decoding_params_from_request``: ``json``, ``json_schema``, ``regex``,
``ebnf_grammar``). xgrammar (mlc-ai/xgrammar ``python/xgrammar``; API of the pinned 0.2.8):
``TokenizerInfo.from_huggingface(tokenizer, vocab_size=..., stop_token_ids=...)``,
``GrammarCompiler(info).compile_json_schema / compile_builtin_json_grammar / compile_regex /
compile_grammar``, ``GrammarMatcher(compiled, override_stop_tokens=...)`` with
``fill_next_token_bitmask`` (does not change the state), ``accept_token`` (False when the token
leaves the grammar), ``rollback(n)``, ``is_terminated`` (a stop token was accepted; no mask
after it). ``max_rollback_tokens`` is deprecated there and always unlimited, so it is not set.

Under speculation, per guided row and step (:class:`GuidedStep`): the drafts are walked with the
matcher before the verify forward; the first draft outside the grammar and everything after it
are cut (a stop token accepted ends the walk after it); the walk records the allowed set of
each of the ``kept + 1`` verified positions and leaves the kept drafts accepted. After
verification the matcher rolls back the rejected drafts and accepts the emitted
recovered/bonus token. The math (masks applied to logits, the draft's q renormalized) is in
:mod:`specserve.spec.grammar`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from specserve.errors import SpecserveError
from specserve.spec.grammar import bitmask_to_allowed, mask_logits, mask_probs

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")  # TensorRT-LLM's guide_type
MAX_GUIDE_CHARS = 1 << 20
_XGR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")


@dataclass(frozen=True)
class Guide:
    """A request's grammar: ``kind`` one of :data:`GUIDE_TYPES`; ``text`` the JSON schema, the
    regex or the EBNF grammar (ignored, may be empty, for ``json``: any JSON object)."""

    kind: str
    text: str = ""

    def validate(self) -> None:
        if self.kind not in GUIDE_TYPES:
            raise SpecserveError(f"guided_decoding_guide_type must be one of "
                                 f"{', '.join(GUIDE_TYPES)}, got {self.kind!r}")
        if self.kind != "json" and not self.text.strip():
            raise SpecserveError(f"guided_decoding_guide is empty (guide type {self.kind})")
        if len(self.text) > MAX_GUIDE_CHARS:
            raise SpecserveError(f"guided_decoding_guide has {len(self.text)} characters, more "
                                 f"than {MAX_GUIDE_CHARS}")


def _one_line(e: Exception) -> str:
    """xgrammar's C++ error (timestamp, source line, check text, multi-line) as one line."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return _XGR_PREFIX.sub("", text).strip()[:300]


class GuideCompiler:
    """Compiles guides for one tokenizer (xgrammar's ``TokenizerInfo`` is built on first use).
    ``vocab_size``: the model's (may exceed the tokenizer's; the extra ids are never allowed);
    ``stop_token_ids``: the grammar's default stop tokens (a request's own stop ids override
    them, :meth:`CompiledGuide.matcher`)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        self._compiler: Any = None

    @classmethod
    def from_info(cls, info: Any, vocab_size: int) -> GuideCompiler:
        """A compiler over a ready xgrammar ``TokenizerInfo`` (tests' tiny vocabularies)."""
        import xgrammar as xgr

        self = cls(None, vocab_size, list(info.stop_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self

    def _get(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size,
                stop_token_ids=self.stop_token_ids or None)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile_text(self, kind: str, text: str) -> CompiledGuide:
        """:meth:`compile` of ``Guide(kind, text)`` (the front doors' form)."""
        return self.compile(Guide(kind, text))

    def compile(self, guide: Guide) -> CompiledGuide:
        """The compiled guide, or SpecserveError with one line (bad schema / regex / grammar, or
        a grammar no token of this vocabulary can start)."""
        guide.validate()
        comp = self._get()
        try:
            if guide.kind == "json":
                grammar = comp.compile_builtin_json_grammar()
            elif guide.kind == "json_schema":
                json.loads(guide.text)
                grammar = comp.compile_json_schema(guide.text, any_whitespace=False)
            elif guide.kind == "regex":
                grammar = comp.compile_regex(guide.text)
            else:
                grammar = comp.compile_grammar(guide.text)
        except json.JSONDecodeError as e:
            raise SpecserveError(f"guided_decoding_guide: the JSON schema is not JSON ({e})"
                                 ) from None
        except (RuntimeError, ValueError, TypeError) as e:
            raise SpecserveError(f"guided_decoding_guide ({guide.kind}): {_one_line(e)}"
                                 ) from None
        out = CompiledGuide(guide, grammar, self.vocab_size)
        if not bool(out.matcher(()).allowed().any()):
            raise SpecserveError(f"guided_decoding_guide ({guide.kind}): no token of the "
                                 "model's vocabulary can start it (the tokenizer cannot "
                                 "express this grammar)")
        return out


@dataclass(frozen=True, eq=False)
class CompiledGuide:
    """A guide compiled for the engine's tokenizer; shared by every request (and every one of
    ``n`` sequences) that uses it; each gets its own :class:`GuideMatcher`."""

    guide: Guide
    grammar: Any  # xgrammar.CompiledGrammar
    vocab_size: int

    def matcher(self, stop_ids: Sequence[int]) -> GuideMatcher:
        """A fresh matcher; ``stop_ids`` (the request's stop tokens) replace the grammar's
        stop tokens when given."""
        return GuideMatcher(self, sorted(stop_ids))

    @cached_property
    def pieces(self) -> dict[bytes, list[int]]:
        """Each vocabulary piece's bytes -> its token ids (below ``vocab_size``; xgrammar's
        ``TokenizerInfo.decoded_vocab``): how a forced string maps back to tokens."""
        out: dict[bytes, list[int]] = {}
        for i, piece in enumerate(self.grammar.tokenizer_info.decoded_vocab[:self.vocab_size]):
            if piece:
                out.setdefault(bytes(piece), []).append(i)
        return out


class GuideMatcher:
    """One sequence's grammar state over its generated tokens."""

    def __init__(self, guide: CompiledGuide, stop_ids: list[int]) -> None:
        import xgrammar as xgr

        self.guide, self.vocab_size = guide, guide.vocab_size
        self._m = xgr.GrammarMatcher(guide.grammar, override_stop_tokens=stop_ids or None)
        self._bitmask = xgr.allocate_token_bitmask(1, guide.vocab_size)  # [1, W] int32

    @property
    def terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (all, once a stop token was accepted:
        what follows is never emitted)."""
        if self.terminated:
            return torch.ones(self.vocab_size, dtype=torch.bool)
        self._m.fill_next_token_bitmask(self._bitmask)
        return bitmask_to_allowed(self._bitmask[0], self.vocab_size)

    def accept(self, token: int) -> None:
        """Advance by one emitted token; RuntimeError if the grammar rejects it (the mask was
        not applied where it was chosen: a bug, never bad input)."""
        if not self._m.accept_token(int(token)):
            raise RuntimeError(f"grammar matcher: token {token} was emitted outside the grammar")

    def jump_forward(self) -> bytes:
        """The string the grammar forces next, UTF-8 (xgrammar's ``find_jump_forward_string``;
        b"" when nothing is forced or a stop token was accepted)."""
        if self.terminated:
            return b""
        return str(self._m.find_jump_forward_string()).encode()

    def rollback(self, n: int) -> None:
        if n:
            self._m.rollback(n)

    def fork(self) -> GuideMatcher:
        """An independent copy of this state (xgrammar's ``GrammarMatcher.fork``)."""
        new = GuideMatcher.__new__(GuideMatcher)
        new.guide, new.vocab_size, new._m = self.guide, self.vocab_size, self._m.fork()
        new._bitmask = self._bitmask.clone()
        return new

    def walk(self, drafts: Sequence[int]) -> list[torch.Tensor]:
        """Accept the drafts while the grammar allows them; the allowed sets [V] bool of the
        verified positions: position j scores the token after ``j`` kept drafts, so
        ``len(result) - 1`` drafts are kept (and stay accepted: :meth:`settle` rolls back)."""
        masks = [self.allowed()]
        for t in drafts:
            if self.terminated or not bool(masks[-1][int(t)]):
                break
            self.accept(int(t))
            masks.append(self.allowed())
        return masks

    def settle(self, kept: int, accepted: int, last: int) -> None:
        """After verification: ``kept`` drafts were walked, ``accepted`` of them passed, ``last``
        (the recovered or bonus token) follows them."""
        self.rollback(kept - accepted)
        if not self.terminated:
            self.accept(last)


@dataclass
class GuidedStep:
    """The grammar side of one chain verify step: ``allowed [B, k+1, V]`` bool for the forward's
    positions (all True for unguided rows and past a row's kept drafts)."""

    rows: list[int]
    allowed: torch.Tensor

    @classmethod
    def plan(cls, matchers: Sequence[GuideMatcher | None], drafts: torch.Tensor | None,
             counts: list[int], active: Sequence[int], vocab: int,
             device: torch.device) -> GuidedStep | None:
        """Walk each active guided row's drafts (``drafts [B, K]``, ``counts[b]`` real ones):
        ``counts`` is cut in place to the drafts inside the grammar. None: no guided row."""
        rows = [b for b in active if matchers[b] is not None]
        if not rows:
            return None
        per_row: dict[int, list[torch.Tensor]] = {}
        for b in rows:
            m = matchers[b]
            assert m is not None
            own = [] if drafts is None else drafts[b, :counts[b]].tolist()
            per_row[b] = m.walk(own)
            counts[b] = len(per_row[b]) - 1
        k = max(counts)
        allowed = torch.ones(len(counts), k + 1, vocab, dtype=torch.bool)
        for b, masks in per_row.items():
            allowed[b, :len(masks)] = torch.stack(masks)
        return cls(rows, allowed.to(device))

    def mask_q(self, q: torch.Tensor) -> torch.Tensor:
        """q [B, k, V] (the draft's probabilities) -> the guided rows' q renormalized over their
        allowed sets (:func:`~specserve.spec.grammar.mask_probs`); other rows untouched."""
        out = q.clone()
        idx = torch.tensor(self.rows, device=q.device)
        out[idx] = mask_probs(q[idx], self.allowed[idx, :q.shape[1]]).to(q.dtype)
        return out

    @staticmethod
    def tree(matchers: Sequence[GuideMatcher | None], tokens: torch.Tensor,
             parents: Sequence[int], active: Sequence[int], vocab: int,
             device: torch.device) -> torch.Tensor | None:
        """allowed [B, N+1, V] for a candidate tree (``tokens [B, N+1]``, node 0 the root =
        the pending token, ``parents[i]`` node i's parent): node i's set is the grammar's after
        the tokens on the path root..i (walked depth first with accept / rollback; the matchers
        end where they began). A node outside its parent's set, and what hangs below it, keeps
        all True: greedy tree verification can never accept it, as the parent's masked argmax is
        inside the set. None: no guided row."""
        rows = [b for b in active if matchers[b] is not None]
        if not rows:
            return None
        n = len(parents)
        children: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            children[parents[i]].append(i)
        allowed = torch.ones(len(matchers), n, vocab, dtype=torch.bool)
        for b in rows:
            m = matchers[b]
            assert m is not None
            _visit(m, tokens[b].tolist(), children, allowed[b], 0)
        return allowed.to(device)

    @staticmethod
    def first(matchers: Sequence[GuideMatcher | None], active: Sequence[int], vocab: int,
              device: torch.device) -> torch.Tensor | None:
        """allowed [B, 1, V] for the prefill's sampled token; None: no guided row."""
        step = GuidedStep.plan(matchers, None, [0] * len(matchers), active, vocab, device)
        return None if step is None else step.allowed


def _visit(m: GuideMatcher, toks: list[int], children: list[list[int]], out: torch.Tensor,
           node: int) -> None:
    """Fill ``out[node]`` [V] and recurse into the children the set allows (depth <= tree
    depth); the matcher is back where it was on return."""
    out[node] = m.allowed()
    if m.terminated:
        return
    for c in children[node]:
        if bool(out[node, toks[c]]):
            m.accept(toks[c])
            _visit(m, toks, children, out, c)
            m.rollback(1)


class DraftGuide:
    """Grammar-aware drafting: a fork of each guided row's matcher follows the drafts as a
    proposer makes them, so the draft's logits can be masked to the grammar before it picks
    (its greedy argmax and its sampled q then stay inside; q is the masked distribution, which
    the verifier's renormalization leaves as it is). A row whose draft leaves the grammar anyway
    (a proposer that does not mask) is no longer guided for the rest of the chain: the decoder's
    walk cuts it there. The rows' own matchers are not touched."""

    def __init__(self, matchers: Sequence[GuideMatcher | None], active: Sequence[int]) -> None:
        self.forks = {b: m.fork() for b in active if (m := matchers[b]) is not None}
        self._allowed: dict[int, torch.Tensor] = {}

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] of one draft step -> a copy masked on the guided rows."""
        out = logits.clone()
        for b, f in self.forks.items():
            if out.shape[-1] == f.vocab_size:
                self._allowed[b] = a = f.allowed().to(out.device)  # [V]
                out[b] = mask_logits(out[b], a)
        return out

    def advance(self, tok: torch.Tensor) -> None:
        """The drafts tok [B] were picked: each guided row's fork accepts its own."""
        for b in list(self.forks):
            f, t = self.forks[b], int(tok[b])
            a = self._allowed.pop(b, None)
            if f.terminated or not bool((f.allowed() if a is None else a)[t]):
                del self.forks[b]
                continue
            f.accept(t)
