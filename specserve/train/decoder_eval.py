"""Measured evaluation of a demo checkpoint with the project's reference decoder
(:mod:`specserve.runtime`): tau (mean tokens emitted per target forward) and acceptance rate for
Medusa with the default tree and the draft model at K, plus tokens/s with and without
speculation, one request at a time at T=0 (Leviathan et al. 2023 report speedups the same way).
At T=0 speculation is lossless, so every output must equal the baseline's; the fraction that
does is reported as a check.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from specserve.config import write_json_atomic

CPU_TREE_NODES = 15  # verify cost on CPU grows with the tree: a small tuned tree wins there


def _run(decoder: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from specserve.runtime.params import SamplingParams
    from specserve.spec.stats import AcceptanceStats

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, end_id=None)
    decoder.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    stats = AcceptanceStats()
    outputs: list[list[int]] = []
    tokens, seconds = 0, 0.0
    for p in prompts:
        t0 = time.perf_counter()
        (res,) = decoder.generate([p], params)
        seconds += time.perf_counter() - t0
        tokens += len(res.token_ids)
        stats = stats.merge(res.stats)
        outputs.append(list(res.token_ids))
    return {"outputs": outputs, "stats": stats, "tokens_per_s": tokens / max(seconds, 1e-9)}


def decoder_eval(root: Path, prompts: list[list[int]], max_tokens: int,
                 k: int = 4) -> dict[str, Any]:
    """Run baseline, Medusa (mc_sim_7b_63 cut to the heads' depth) and draft (K=``k``) over
    ``prompts`` with checkpoints under ``root`` (target/, medusa/, draft/)."""
    from specserve.runtime.loader import build_decoder

    target = root / "target"
    runs = {
        "baseline": _run(build_decoder(target), prompts, max_tokens),
        "medusa": _run(build_decoder(target, medusa_dir=root / "medusa"), prompts, max_tokens),
        "draft": _run(build_decoder(target, draft_dir=root / "draft", max_draft_len=k),
                      prompts, max_tokens),
    }
    tuned = tuned_tree(runs["medusa"]["stats"], root / "medusa", CPU_TREE_NODES)
    runs["medusa_tuned"] = _run(
        build_decoder(target, medusa_dir=root / "medusa", medusa_choices=tuned), prompts,
        max_tokens)
    write_json_atomic(root / "medusa_tree_cpu.json", tuned)
    base = runs["baseline"]
    out: dict[str, Any] = {"baseline_tokens_per_s": round(base["tokens_per_s"], 2)}
    for mode in ("medusa", "draft", "medusa_tuned"):
        r = runs[mode]
        same = sum(a == b for a, b in zip(r["outputs"], base["outputs"], strict=True))
        out[mode] = {
            "tau": round(r["stats"].tau, 4),
            "acceptance_rate": round(r["stats"].acceptance_rate, 4),
            "tokens_per_s": round(r["tokens_per_s"], 2),
            "speedup": round(r["tokens_per_s"] / max(base["tokens_per_s"], 1e-9), 3),
            "matches_baseline": same / len(prompts),
        }
    out["medusa_tuned"]["choices"] = tuned
    out["medusa_tuned"]["nodes"] = len(tuned)
    return out


def tuned_tree(stats: Any, medusa_dir: Path, nodes: int) -> list[list[int]]:
    """A ``nodes``-node tree tuned (``specserve tune-tree``'s greedy construction) from the
    accepted-node counts measured with the default tree."""
    from specserve.runtime.loader import medusa_tree
    from specserve.spec.tree_tuning import (
        accuracies_from_accepted_nodes,
        greedy_tree,
        parse_accepted_nodes,
    )

    num_heads = int(json.loads((medusa_dir / "config.json").read_text())["medusa_num_heads"])
    measured = [list(p) for p in medusa_tree(num_heads).choices]
    counts = parse_accepted_nodes(stats.accepted_nodes, "decoder eval")
    acc = accuracies_from_accepted_nodes(counts, stats.steps, measured)
    return [list(p) for p in greedy_tree(acc, nodes).choices]
