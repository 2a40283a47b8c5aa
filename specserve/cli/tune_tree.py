"""``specserve tune-tree``: a Medusa sparse tree tuned to measured acceptance.

Reads per-node acceptance from a ``specserve bench`` ``summary.json`` (or per-head top-k
accuracies from a JSON file), builds the tree that maximizes the expected accepted length for a
node budget with the Medusa paper's greedy construction (:mod:`specserve.spec.tree_tuning`), and
writes it as a JSON list of lists (what ``specserve build --medusa-choices`` reads) plus the same
tree in TensorRT-LLM's brace form next to it (``.txt``).

Input contract (docs/architecture.md, "tune-tree input"): from a bench summary,
``variants.spec.acceptance.accepted_nodes`` (``"head,rank" -> count``) and
``variants.spec.acceptance.steps`` (verify steps of those requests); a bare
``AcceptanceStats.to_dict()`` also works.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.config import read_json as _read_json
from specserve.errors import SpecserveError
from specserve.spec import tree_tuning as TT
from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

EXAMPLES = """
\b
Examples:
  # from a benchmark of the default tree (mc_sim_7b_63), at most 63 nodes
  specserve tune-tree --from reports/x/summary.json --nodes 63 --out trees/tuned.json
  specserve build --model M --medusa H --medusa-choices trees/tuned.json --out engines/t
\b
  # from per-head accuracies: [[rank0, rank1, ...], ...] per head (P(rank r is right)),
  # {"topk_accuracy": [[top1, top2, ...], ...]} (cumulative), or a demo eval.json
  specserve tune-tree --from acc.json --nodes 31 --out trees/t31.json --format json

Writes OUT (JSON list of lists) and OUT with suffix .txt (TensorRT-LLM brace form, one line).
--nodes is a maximum: nodes that can never be accepted (estimated accuracy 0) are left out.
"""


def _acceptance_block(data: Any) -> dict[str, Any] | None:
    """``variants.spec.acceptance`` of a bench summary, ``acceptance``, or a bare stats dict."""
    if not isinstance(data, dict):
        return None
    spec = (data.get("variants") or {}).get("spec") if isinstance(data.get("variants"),
                                                                   dict) else None
    for block in (spec.get("acceptance") if isinstance(spec, dict) else None,
                  data.get("acceptance"), data):
        if isinstance(block, dict) and "accepted_nodes" in block:
            return block
    return None


def _steps(block: dict[str, Any], counts: dict[TT.Path, int], where: str) -> int:
    """Verify steps: ``steps``, else head-0 accepted nodes / per_position_acceptance[0]."""
    steps = block.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        return steps
    rates = block.get("per_position_acceptance") or []
    head0 = sum(c for (h, _), c in counts.items() if h == 0)
    if rates and float(rates[0]) > 0 and head0 > 0:
        return round(head0 / float(rates[0]))
    raise SpecserveError(f"{where}: acceptance has no 'steps' (verify steps) to normalize by")


def _measured_tree(arg: str | None, block: dict[str, Any], where: str) -> tuple[Any, str]:
    if arg is None:
        choices = block.get("medusa_choices")
        if isinstance(choices, list):
            return MedusaTree.from_choices(choices).choices, f"{where} medusa_choices"
        return MC_SIM_7B_63, "mc_sim_7b_63 (assumed; pass --measured-tree)"
    if arg == "none":
        return None, "none (every accepted parent assumed to have every rank)"
    if arg == "mc_sim_7b_63":
        return MC_SIM_7B_63, "mc_sim_7b_63"
    return read_tree_file(Path(arg)).choices, arg


def read_tree_file(path: Path) -> MedusaTree:
    """A tree file: JSON list of lists, or TensorRT-LLM brace form."""
    try:
        text = path.read_text()
    except FileNotFoundError as e:
        raise SpecserveError(f"{path}: not found") from e
    try:
        return MedusaTree.from_brace(text)
    except SpecserveError as e:
        raise SpecserveError(f"{path}: {e}") from e


def _accuracy_rows(data: Any, where: str) -> TT.HeadAccuracies:
    """Per-head accuracies from the forms listed in the help."""
    if isinstance(data, list):
        return TT.HeadAccuracies.of(data, where)
    if isinstance(data, dict):
        if isinstance(data.get("rank_accuracy"), list):
            return TT.HeadAccuracies.of(data["rank_accuracy"], where)
        if isinstance(data.get("topk_accuracy"), list):
            return TT.HeadAccuracies.from_cumulative(data["topk_accuracy"], where)
        top1 = (data.get("medusa") or {}).get("top1_accuracy") if isinstance(
            data.get("medusa"), dict) else None
        if isinstance(top1, list):
            return TT.HeadAccuracies.of([[float(a)] for a in top1], where)
    raise SpecserveError(f"{where}: expected a bench summary with accepted_nodes, or per-head "
                         "accuracies (list of lists, rank_accuracy, topk_accuracy, "
                         "medusa.top1_accuracy)")


def load_accuracies(path: Path, measured_tree: str | None) -> dict[str, Any]:
    """Accuracies plus what they came from (and the measured tau when known)."""
    data = _read_json(path)
    block = _acceptance_block(data)
    if block is None:
        return {"acc": _accuracy_rows(data, str(path)), "source": "per-head accuracies",
                "measured_tree": None, "measured_tau": None, "steps": None}
    counts = TT.parse_accepted_nodes(block.get("accepted_nodes") or {}, str(path))
    steps = _steps(block, counts, str(path))
    tree, tree_src = _measured_tree(measured_tree, block, str(path))
    acc = TT.accuracies_from_accepted_nodes(counts, steps, tree, str(path))
    tau = block.get("tau_server", block.get("tau"))
    return {"acc": acc, "source": "accepted tree nodes", "measured_tree": tree_src,
            "measured_tree_choices": tree, "measured_tau": tau, "steps": steps}


def write_tree_files(out: Path, tree: MedusaTree) -> tuple[Path, Path]:
    """Write ``out`` (JSON list of lists) and ``out.with_suffix('.txt')`` (brace form),
    each through a temp file and a rename."""
    brace = out.with_suffix(".txt")
    if brace == out:
        raise SpecserveError(f"{out}: use a .json name (the brace form goes to {out.stem}.txt)")
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((out, json.dumps(tree.to_list()) + "\n"), (brace, tree.to_brace() + "\n")):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return out, brace


def run_tune_tree(src: Path, nodes: int, out: Path | None, measured_tree: str | None,
                  max_depth: int | None) -> dict[str, Any]:
    loaded = load_accuracies(src, measured_tree)
    acc: TT.HeadAccuracies = loaded["acc"]
    tuned = TT.greedy_tree(acc, nodes, max_depth)
    if not tuned.choices:
        raise SpecserveError(f"{src}: every estimated accuracy is 0; nothing to build a tree from")
    tree = MedusaTree.from_choices(tuned.choices, num_heads=acc.num_heads)
    default = [c for c in MC_SIM_7B_63 if len(c) <= acc.num_heads]
    result: dict[str, Any] = {
        "source": str(src), "input": loaded["source"], "measured_tree": loaded["measured_tree"],
        "steps": loaded["steps"], "accuracies": [list(r) for r in acc.acc],
        "nodes": tree.num_nodes, "depth": tree.depth, "tau_expected": tuned.tau,
        "tau_by_nodes": list(tuned.tau_by_nodes),
        "default_tree": {"name": "mc_sim_7b_63", "nodes": len(default),
                         "tau_expected": TT.expected_tau(default, acc)},
        "measured_tau": loaded["measured_tau"],
        "medusa_choices": tree.to_list(), "brace": tree.to_brace(), "files": [],
    }
    if out is not None:
        result["files"] = [str(p) for p in write_tree_files(out, tree)]
    return result


def _text(r: dict[str, Any]) -> str:
    lines = [f"input: {r['source']} ({r['input']}"
             + (f", {r['steps']} verify steps, measured tree {r['measured_tree']}"
                if r["steps"] else "") + ")", "per-head accuracy by rank:"]
    for h, row in enumerate(r["accuracies"]):
        lines.append(f"  head {h}: " + " ".join(f"{a:.3f}" for a in row[:10]))
    d = r["default_tree"]
    lines += [f"tuned tree: {r['nodes']} nodes, depth {r['depth']}, expected tau "
              f"{r['tau_expected']:.3f}",
              f"{d['name']}: {d['nodes']} nodes, expected tau {d['tau_expected']:.3f}"
              + (f" (measured {r['measured_tau']:.3f})" if r["measured_tau"] else ""),
              f"brace: {r['brace']}"]
    if r["files"]:
        lines.append("wrote " + ", ".join(r["files"]))
    return "\n".join(lines)


@click.command("tune-tree", epilog=EXAMPLES,
               short_help="Build a Medusa tree from measured acceptance (greedy, Medusa paper).")
@click.option("--from", "src", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="bench summary.json, or a per-head accuracy JSON.")
@click.option("--nodes", type=int, default=63, show_default=True, help="Node budget (maximum).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Tree JSON to write (brace form goes to the same name with .txt).")
@click.option("--measured-tree", default=None,
              help="Tree the summary was measured with: FILE, mc_sim_7b_63, or none "
                   "[default: the summary's medusa_choices, else mc_sim_7b_63].")
@click.option("--max-depth", type=int, default=None, help="Cap the depth (<= Medusa heads).")
@FORMAT_OPTION
def command(src: Path, nodes: int, out: Path | None, measured_tree: str | None,
            max_depth: int | None, fmt: str) -> None:
    """Tune a Medusa sparse tree for a node budget from measured acceptance."""
    emit(run_tune_tree(src, nodes, out, measured_tree, max_depth), fmt, _text)
