"""The ``specserve tune-tree`` flow: a Medusa sparse tree tuned to measured acceptance.

:func:`tune_tree` reads per-node acceptance from a ``specserve bench`` ``summary.json`` (or
per-head top-k accuracies from a JSON file), builds the tree that maximizes the expected accepted
length for a node budget with the Medusa paper's greedy construction
(:mod:`specserve.spec.tree_tuning`), and writes it as a JSON list of lists (what ``specserve build
--medusa-choices`` reads) plus the same tree in TensorRT-LLM's brace form next to it (``.txt``).

Input contract (docs/architecture.md, "tune-tree input"): from a bench summary,
``variants.spec.acceptance.accepted_nodes`` (``"head,rank" -> count``) and
``variants.spec.acceptance.steps`` (verify steps of those requests); a bare
``AcceptanceStats.to_dict()`` also works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.config import read_json, write_text_atomic
from specserve.errors import SpecserveError
from specserve.spec import tree_tuning as TT

if TYPE_CHECKING:  # specserve.spec.tree imports torch: imported where used, not at import time
    from specserve.spec.tree import MedusaTree

Choices = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TuneTreeConfig:
    """Inputs of :func:`tune_tree` (the CLI options of ``specserve tune-tree``)."""

    src: Path  # --from: bench summary.json or per-head accuracy JSON
    nodes: int = 63  # node budget (maximum)
    out: Path | None = None  # tree JSON to write; brace form to out.with_suffix(".txt")
    measured_tree: str | None = None  # FILE, "mc_sim_7b_63" or "none"; None = summary's/default
    max_depth: int | None = None  # depth cap (<= Medusa heads)


@dataclass(frozen=True)
class LoadedAccuracies:
    """Per-head accuracies and what they came from."""

    acc: TT.HeadAccuracies
    source: str  # "accepted tree nodes" | "per-head accuracies"
    measured_tree: str | None  # description of the tree the summary was measured with
    measured_tree_choices: Choices | None  # that tree (None: every rank assumed present)
    measured_tau: float | None  # tau_server (or tau) of the summary, as given
    steps: int | None  # verify steps the counts are normalized by


def read_tree_file(path: Path) -> MedusaTree:
    """A tree file: JSON list of lists, or TensorRT-LLM brace form."""
    from specserve.spec.tree import MedusaTree

    try:
        text = path.read_text()
    except FileNotFoundError as e:
        raise SpecserveError(f"{path}: not found") from e
    try:
        return MedusaTree.from_brace(text)
    except SpecserveError as e:
        raise SpecserveError(f"{path}: {e}") from e


def measured_tree_of(arg: str | None, block: dict[str, Any],
                     where: str) -> tuple[Choices | None, str]:
    """The tree a summary was measured with, and a description: ``arg`` (FILE,
    ``mc_sim_7b_63`` or ``none``), else the block's ``medusa_choices``, else mc_sim_7b_63."""
    from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

    if arg is None:
        choices = block.get("medusa_choices")
        if isinstance(choices, list):
            if not all(isinstance(c, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                   for i in c) for c in choices):
                raise SpecserveError(f"{where}: medusa_choices: expected a list of lists of "
                                     f"ints, got {choices!r:.60}")
            try:
                tree = MedusaTree.from_choices(choices)
            except SpecserveError as e:
                raise SpecserveError(f"{where}: {e}") from e
            return tree.choices, f"{where} medusa_choices"
        return MC_SIM_7B_63, "mc_sim_7b_63 (assumed; pass --measured-tree)"
    if arg == "none":
        return None, "none (every accepted parent assumed to have every rank)"
    if arg == "mc_sim_7b_63":
        return MC_SIM_7B_63, "mc_sim_7b_63"
    return read_tree_file(Path(arg)).choices, arg


def load_accuracies(path: Path, measured_tree: str | None) -> LoadedAccuracies:
    """Accuracies from a bench summary's accepted nodes, or a per-head accuracy file."""
    data = read_json(path)
    block = TT.acceptance_block(data)
    if block is None:
        return LoadedAccuracies(TT.head_accuracies_from_json(data, str(path)),
                                "per-head accuracies", None, None, None, None)
    counts = TT.parse_accepted_nodes(block.get("accepted_nodes") or {}, str(path))
    steps = TT.verify_steps(block, counts, str(path))
    tree, tree_src = measured_tree_of(measured_tree, block, str(path))
    acc = TT.accuracies_from_accepted_nodes(counts, steps, tree, str(path))
    tau = block.get("tau_server", block.get("tau"))
    if tau is not None and (not isinstance(tau, int | float) or isinstance(tau, bool)):
        raise SpecserveError(f"{path}: tau_server {tau!r:.60}: expected a number")
    return LoadedAccuracies(acc, "accepted tree nodes", tree_src, tree, tau, steps)


def write_tree_files(out: Path, tree: MedusaTree) -> tuple[Path, Path]:
    """Write ``out`` (JSON list of lists) and ``out.with_suffix('.txt')`` (brace form),
    each through a temp file and a rename."""
    brace = out.with_suffix(".txt")
    if brace == out:
        raise SpecserveError(f"{out}: use a .json name (the brace form goes to {out.stem}.txt)")
    write_text_atomic(out, json.dumps(tree.to_list()) + "\n")
    write_text_atomic(brace, tree.to_brace() + "\n")
    return out, brace


def tune_tree(cfg: TuneTreeConfig) -> dict[str, Any]:
    """Tune the tree and (with ``cfg.out``) write it; returns the JSON-ready report
    ``specserve tune-tree`` prints (``medusa_choices``, ``brace``, expected taus, ``files``)."""
    from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

    loaded = load_accuracies(cfg.src, cfg.measured_tree)
    acc = loaded.acc
    tuned = TT.greedy_tree(acc, cfg.nodes, cfg.max_depth)
    if not tuned.choices:
        raise SpecserveError(f"{cfg.src}: every estimated accuracy is 0; nothing to build a "
                             "tree from")
    tree = MedusaTree.from_choices(tuned.choices, num_heads=acc.num_heads)
    default = [c for c in MC_SIM_7B_63 if len(c) <= acc.num_heads]
    result: dict[str, Any] = {
        "source": str(cfg.src), "input": loaded.source, "measured_tree": loaded.measured_tree,
        "steps": loaded.steps, "accuracies": [list(r) for r in acc.acc],
        "nodes": tree.num_nodes, "depth": tree.depth, "tau_expected": tuned.tau,
        "tau_by_nodes": list(tuned.tau_by_nodes),
        "default_tree": {"name": "mc_sim_7b_63", "nodes": len(default),
                         "tau_expected": TT.expected_tau(default, acc)},
        "measured_tau": loaded.measured_tau,
        "medusa_choices": tree.to_list(), "brace": tree.to_brace(), "files": [],
    }
    if cfg.out is not None:
        result["files"] = [str(p) for p in write_tree_files(cfg.out, tree)]
    return result
