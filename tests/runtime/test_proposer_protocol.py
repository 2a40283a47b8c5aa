"""The :class:`~specserve.runtime.proposers.Proposer` protocol is the decoder's only view of a
proposer: two proposers defined only in this file (no specserve base class), one proposing
chains and one proposing trees, drive :class:`SpecDecoder` unchanged. Their drafts follow a
script over the target's own greedy continuation, so the T=0 output must equal plain greedy
decoding token for token and the acceptance stats must be exactly what the script implies.
Also static: ``decoder.py`` has no ``isinstance`` over proposer classes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch

import specserve.runtime.proposers as proposers_pkg
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import Transformer
from specserve.runtime.proposers import (
    ChainProposal,
    ProposalRequest,
    Proposer,
    StepOutcome,
    TreeProposal,
)
from specserve.spec.stats import AcceptanceStats
from specserve.spec.tree import MedusaTree, build_tree_buffers
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41]]
MAX_TOKENS = [23, 17, 20]
K = 4
# (n, a) per step: propose n drafts of which the first a are right and draft a is wrong
CHAIN_SCRIPT = [[(4, 4), (3, 1), (2, 2), (0, 0), (4, 0), (1, 1)],
                [(2, 2), (4, 3), (1, 0)],
                [(3, 3), (4, 4), (0, 0), (2, 1)]]
TREE = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0], [1, 1], [1, 0, 0]])
TRUE_PATH = [(1,), (1, 0), (1, 0, 0)]  # the branch that carries the true continuation
TREE_SCRIPT = [[(3, 0), (1, 0), (0, 0), (2, 0)], [(2, 0), (3, 0)],
               [(0, 0), (3, 0), (1, 0)]]  # (right nodes along TRUE_PATH, unused) per step


def _params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=m) for m in MAX_TOKENS]  # T=0, EOS off


@pytest.fixture(scope="module")
def greedy(tiny_models: TinyModels) -> list[list[int]]:
    """Plain greedy decoding of the target, one prompt at a time."""
    dec = SpecDecoder(tiny_models.target)
    return [dec.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, _params(), strict=True)]


class _Scripted:
    """Shared state of the scripted proposers: each row's generated length as told by
    :meth:`update` only (as a draft cache would be), its step in its script, and a log of the
    accepted counts of every outcome."""

    def __init__(self, refs: list[list[int]], script: list[list[tuple[int, int]]]) -> None:
        self.refs, self.script, self.vocab = refs, script, 0
        self.prompt_lens: list[int] = []
        self.pos: list[int] = []
        self.steps: list[int] = []
        self.accepted_log: list[list[int]] = []

    aux_layers: tuple[int, ...] = ()  # no target layers read

    def slots(self) -> None:
        """Per-call state (the scripts are indexed by row): not in flight."""
        return None

    def bind(self, target: Transformer) -> None:
        self.vocab = target.cfg.vocab_size

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        self.prompt_lens = [len(p) for p in prompts]
        self.pos, self.steps = [0] * len(prompts), [0] * len(prompts)

    def update(self, outcome: StepOutcome) -> None:
        b, t = outcome.hidden.shape[:2]
        assert b == len(self.pos) and all(0 <= i < t for i in outcome.last)
        self.pos = [len(s) - n for s, n in zip(outcome.seqs, self.prompt_lens, strict=True)]
        self.accepted_log.append(list(outcome.accepted))

    def truth(self, b: int, j: int) -> int:
        """The j-th token after row b's pending token (0 past the reference)."""
        ref, i = self.refs[b], self.pos[b] + j
        return ref[i] if i < len(ref) else 0

    def wrong(self, b: int, j: int) -> int:
        return (self.truth(b, j) + 1) % self.vocab

    def next_entry(self, b: int, request: ProposalRequest) -> tuple[int, int]:
        """Row b's script entry for this step; (0, 0) once the row is finished."""
        if self.pos[b] >= request.params[b].max_tokens:
            return 0, 0
        script = self.script[b]
        self.steps[b] += 1
        return script[(self.steps[b] - 1) % len(script)]


class ScriptedChain(_Scripted):
    """Chain proposals after CHAIN_SCRIPT; the padding after each row's count is the TRUE
    continuation: a decoder that ignored the counts would accept it."""

    name = "scripted-chain"
    max_draft_len = K
    lookahead = K

    def get_proposal(self, request: ProposalRequest) -> ChainProposal | None:
        width = max(request.limits)
        tokens = torch.zeros(len(self.pos), width, dtype=torch.long)
        counts = [0] * len(self.pos)
        for b in range(len(self.pos)):
            tokens[b] = torch.tensor([self.truth(b, j) for j in range(width)])
            n, a = self.next_entry(b, request)
            counts[b] = min(n, request.limits[b])
            if a < counts[b]:
                tokens[b, a] = self.wrong(b, a)
        return ChainProposal(tokens, counts, None) if width else None


class ScriptedTree(_Scripted):
    """Tree proposals over TREE: at script entry (a, _) the first a nodes of TRUE_PATH hold the
    true continuation, every other node a wrong token."""

    name = "scripted-tree"
    max_draft_len = TREE.depth
    lookahead = TREE.num_nodes

    def __init__(self, refs: list[list[int]], script: list[list[tuple[int, int]]]) -> None:
        super().__init__(refs, script)
        self.buffers = build_tree_buffers(TREE)
        self.kept_log: list[list[list[int]]] = []

    def update(self, outcome: StepOutcome) -> None:
        super().update(outcome)
        if outcome.paths is not None:  # a tree step: the kept nodes, root first
            assert outcome.hidden.shape[1] == TREE.num_nodes + 1
            self.kept_log.append(outcome.paths)

    def get_proposal(self, request: ProposalRequest) -> TreeProposal:
        tokens = torch.zeros(len(self.pos), TREE.num_nodes + 1, dtype=torch.long)
        for b, seq in enumerate(request.seqs):
            tokens[b, 0] = seq[-1]
            right, _ = self.next_entry(b, request)
            for i, path in enumerate(TREE.choices, start=1):
                d = len(path) - 1
                ok = path in TRUE_PATH[:right]
                tokens[b, i] = self.truth(b, d) if ok else self.wrong(b, d)
        return TreeProposal(tokens, self.buffers)


def _expected_chain(b: int) -> tuple[AcceptanceStats, list[int]]:
    """What CHAIN_SCRIPT implies for row b: stats and the accepted count of each step."""
    stats, out, i, acc = AcceptanceStats(), 1, 0, []  # the first token comes from the prefill
    while out < MAX_TOKENS[b]:
        n, a = CHAIN_SCRIPT[b][i % len(CHAIN_SCRIPT[b])]
        n = min(n, K, MAX_TOKENS[b] - out - 1)
        a = min(a, n)
        stats.observe(n, a, num_emitted=a + 1)
        out, i = out + a + 1, i + 1
        acc.append(a)
    return stats, acc


def _expected_tree(b: int) -> tuple[AcceptanceStats, list[int]]:
    stats, out, i, acc = AcceptanceStats(), 1, 0, []
    while out < MAX_TOKENS[b]:
        a = min(TREE_SCRIPT[b][i % len(TREE_SCRIPT[b])][0], MAX_TOKENS[b] - out - 1)
        nodes = [(d, 1 if d == 0 else 0) for d in range(a)]  # (head, rank) along TRUE_PATH
        stats.observe(TREE.num_nodes, a, num_emitted=a + 1, positions_drafted=TREE.depth,
                      nodes=nodes)
        out, i = out + a + 1, i + 1
        acc.append(a)
    return stats, acc


def _per_row(log: list[list[int]], b: int, steps: int) -> list[int]:
    """Row b's accepted counts from the outcome log (prefill first, then its ``steps``)."""
    return [row[b] for row in log[1:1 + steps]]


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_scripted_proposer_is_exact_and_stats_follow_the_script(
        tiny_models: TinyModels, greedy: list[list[int]], kind: str) -> None:
    prop: Proposer = ScriptedChain(greedy, CHAIN_SCRIPT) if kind == "chain" \
        else ScriptedTree(greedy, TREE_SCRIPT)
    stream: list[list[int]] = [[] for _ in PROMPTS]
    dec = SpecDecoder(tiny_models.target, prop)
    assert dec.spec_mode == f"scripted-{kind}"
    out = dec.generate(PROMPTS, _params(), on_step=lambda b, t: stream[b].extend(t))
    assert isinstance(prop, ScriptedChain | ScriptedTree)
    assert prop.accepted_log[0] == [0] * len(PROMPTS)  # the prefill outcome comes first
    for b, r in enumerate(out):
        assert r.token_ids == greedy[b] == stream[b], b
        assert r.finish_reason == "length"
        want, accepted = (_expected_chain if kind == "chain" else _expected_tree)(b)
        assert r.stats.to_dict() == want.to_dict(), b
        assert _per_row(prop.accepted_log, b, want.steps) == accepted, b
    if isinstance(prop, ScriptedTree):  # kept paths: root, then TRUE_PATH nodes 2, 4, 6
        index = {p: i for i, p in enumerate(TREE.choices, start=1)}
        true_nodes = [0] + [index[p] for p in TRUE_PATH]
        for paths in prop.kept_log:
            assert all(p == true_nodes[:len(p)] for p in paths)


def test_scripted_chain_batch_equals_alone(tiny_models: TinyModels,
                                           greedy: list[list[int]]) -> None:
    """Per-row counts: row 1 alone runs the same script and gets the same stats."""
    batch = SpecDecoder(tiny_models.target, ScriptedChain(greedy, CHAIN_SCRIPT)).generate(
        PROMPTS, _params())
    alone_prop = ScriptedChain([greedy[1]], [CHAIN_SCRIPT[1]])
    (alone,) = SpecDecoder(tiny_models.target, alone_prop).generate([PROMPTS[1]], _params()[1])
    assert alone.token_ids == batch[1].token_ids
    assert alone.stats.to_dict() == batch[1].stats.to_dict()


# --- static: the decoder never asks what class a proposer is --------------------------------

DECODER = Path(__file__).resolve().parents[2] / "specserve" / "runtime" / "decoder.py"


def _proposer_class_names() -> set[str]:
    """Every proposer class of the package (anything with ``get_proposal`` or named *Proposer),
    and the protocol itself."""
    names = {"Proposer"}
    for info in pkgutil.iter_modules(proposers_pkg.__path__):
        mod = importlib.import_module(f"{proposers_pkg.__name__}.{info.name}")
        names |= {n for n, obj in vars(mod).items() if inspect.isclass(obj)
                  and (hasattr(obj, "get_proposal") or n.endswith("Proposer"))}
    return names


def _named(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple | ast.BinOp):  # (A, B) or A | B
        parts = node.elts if isinstance(node, ast.Tuple) else [node.left, node.right]
        return set().union(*(_named(p) for p in parts))
    return set()


def _class_checks(source: str, classes: set[str]) -> list[str]:
    """``isinstance``/``issubclass`` over ``classes``, ``type(x) is C`` comparisons, and
    ``getattr``/``hasattr`` probes of a proposer, as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        bad = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                bad = bool(_named(node.args[1]) & classes)
            if node.func.id in ("getattr", "hasattr") and node.args:
                bad = "proposer" in ast.unparse(node.args[0]).lower()
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                and ast.unparse(node.left.func) == "type":
            bad = any(_named(c) & classes for c in node.comparators)
        if bad:
            found.append(f"{node.lineno}: {ast.unparse(node)}")  # type: ignore[attr-defined]
    return found


def test_decoder_has_no_isinstance_over_proposer_classes() -> None:
    classes = _proposer_class_names()
    assert {"DraftModelProposer", "NgramProposer", "MedusaProposer", "OracleProposer",
            "ChainProposer"} <= classes  # the check is not vacuous
    planted = "if isinstance(p, (A, MedusaProposer)) or type(p) is NgramProposer:\n  pass\n" \
              "k = getattr(self.proposer, 'max_draft_len', 0)\n"
    assert len(_class_checks(planted, classes)) == 3  # ... and it sees what it looks for
    source = DECODER.read_text(encoding="utf-8")
    assert _class_checks(source, classes) == []
    imported = {a.name for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "specserve.runtime.proposers") for a in node.names}
    assert imported & classes <= {"Proposer"}  # only the protocol, for annotations
