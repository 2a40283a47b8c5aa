"""Measured evaluation of a demo checkpoint with the project's reference decoder
(:mod:`specserve.runtime`): tau (mean tokens emitted per target forward), acceptance rate and
per-position acceptance for Medusa (the default tree and a small CPU-tuned one), the draft model,
an EAGLE-3 head and n-gram lookup (prompt lookup decoding, Saxena 2023) at K, plus tokens/s with
and without speculation, one request at a time at T=0 (Leviathan et al. 2023 report speedups the
same way). At T=0 speculation is lossless, so every output must equal the baseline's; the
fraction that does is reported as a check. ``fastest_method`` names the method with the highest
measured tokens/s (what ``make engine`` builds for the demo model). The fastest method and the
CPU-tuned Medusa tree are also run on the prompts ``specserve demo`` serves (:data:`SERVED`),
their tau recorded as ``tau_served_prompts``: a method whose acceptance depends on the prompts
(n-gram lookup copies from them) is then checked against the server like with like.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.config import write_json_atomic

if TYPE_CHECKING:
    import torch

    from specserve.train.distill_config import SelfDistillConfig
    from specserve.train.progress import Reporter

CPU_TREE_NODES = 15  # verify cost on CPU grows with the tree: a small tuned tree wins there
METHODS = ("medusa", "medusa_tuned", "draft", "eagle3", "ngram")
#: What ``specserve demo`` serves by default (its DemoRunConfig): builtin code prompts, seed 0,
#: 2 warmup + 24 measured requests of up to 96 tokens, each stopping at the tokenizer's EOS.
SERVED = {"prompts": "builtin-code", "seed": 0, "warmup": 2, "requests": 24, "max_tokens": 96}


def served_tau(decoder: Any, tokenizer: Any, served: dict[str, Any] = SERVED) -> float:
    """tau of ``decoder`` on the measured requests of ``served`` (greedy, one at a time)."""
    from specserve.client.builtin_prompts import builtin_code_prompts
    from specserve.runtime.params import SamplingParams
    from specserve.spec.stats import AcceptanceStats

    texts = builtin_code_prompts(served["warmup"] + served["requests"], served["seed"])
    params = SamplingParams(max_tokens=served["max_tokens"], temperature=0.0,
                            end_id=tokenizer.eos_token_id)
    stats = AcceptanceStats()
    for p in texts[served["warmup"]:]:
        (res,) = decoder.generate([tokenizer.encode(p.text)], params)
        stats = stats.merge(res.stats)
    return round(stats.tau, 4)


def run_greedy(decoder: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
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


def compare(run: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A :func:`run_greedy` result against the plain decoder's: tau, acceptance, tokens/s."""
    same = sum(a == b for a, b in zip(run["outputs"], base["outputs"], strict=True))
    stats = run["stats"]
    return {
        "tau": round(stats.tau, 4),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "per_position_acceptance": [round(a, 4) for a in stats.per_position_acceptance],
        "tokens_per_s": round(run["tokens_per_s"], 2),
        "speedup": round(run["tokens_per_s"] / max(base["tokens_per_s"], 1e-9), 3),
        "matches_baseline": same / max(len(base["outputs"]), 1),
    }


def spec_vs_plain(model_dir: Path, prompts: list[list[int]], max_tokens: int, k: int,
                  device: str = "cpu", **proposer: Any) -> dict[str, Any]:
    """Plain vs speculative decoding of ``prompts`` at T = 0 through the reference decoder;
    ``proposer``: ``build_decoder``'s ``eagle3_dir=`` or ``draft_dir=`` (chains of ``k``)."""
    from specserve.runtime.loader import build_decoder

    base = run_greedy(build_decoder(model_dir, device=device), prompts, max_tokens)
    spec = run_greedy(build_decoder(model_dir, max_draft_len=k, device=device, **proposer),
                      prompts, max_tokens)
    return {"baseline_tokens_per_s": round(base["tokens_per_s"], 2), "k": k,
            "prompts": len(prompts), "max_tokens": max_tokens, **compare(spec, base)}


def fastest(out: dict[str, Any], methods: tuple[str, ...]) -> str:
    """The measured method with the highest tokens/s (``"none"`` when none beats plain)."""
    best = max(methods, key=lambda m: out[m]["tokens_per_s"])
    return best if out[best]["tokens_per_s"] > out["baseline_tokens_per_s"] else "none"


def decoder_eval(root: Path, prompts: list[list[int]], max_tokens: int,
                 k: int = 4) -> dict[str, Any]:
    """Run baseline, Medusa (mc_sim_7b_63 cut to the heads' depth, then a tuned
    :data:`CPU_TREE_NODES`-node tree), draft, EAGLE-3 (when ``root/eagle3`` exists) and n-gram
    (chains of K=``k``) over ``prompts`` with checkpoints under ``root`` (target/, medusa/,
    draft/, eagle3/)."""
    from specserve.runtime.loader import build_decoder, load_tokenizer

    target = root / "target"
    decs = {"baseline": build_decoder(target),
            "medusa": build_decoder(target, medusa_dir=root / "medusa"),
            "draft": build_decoder(target, draft_dir=root / "draft", max_draft_len=k),
            "ngram": build_decoder(target, ngram=True, max_draft_len=k)}
    if (root / "eagle3").is_dir():
        decs["eagle3"] = build_decoder(target, eagle3_dir=root / "eagle3", max_draft_len=k)
    runs = {m: run_greedy(d, prompts, max_tokens) for m, d in decs.items()}
    tuned = tuned_tree(runs["medusa"]["stats"], root / "medusa", CPU_TREE_NODES)
    decs["medusa_tuned"] = build_decoder(target, medusa_dir=root / "medusa",
                                         medusa_choices=tuned)
    runs["medusa_tuned"] = run_greedy(decs["medusa_tuned"], prompts, max_tokens)
    write_json_atomic(root / "medusa_tree_cpu.json", tuned)
    base = runs["baseline"]
    out: dict[str, Any] = {"baseline_tokens_per_s": round(base["tokens_per_s"], 2)}
    methods = tuple(m for m in METHODS if m in runs)
    for mode in methods:
        out[mode] = compare(runs[mode], base)
    out["fastest_method"] = fastest(out, methods)
    out["medusa_tuned"]["choices"] = tuned
    out["medusa_tuned"]["nodes"] = len(tuned)
    tok = load_tokenizer(root / "tokenizer" if (root / "tokenizer").is_dir() else target)
    for mode in dict.fromkeys((out["fastest_method"], "medusa_tuned")):
        if mode in decs:  # what `make engine` builds by default, and the tuned Medusa tree
            out[mode]["tau_served_prompts"] = served_tau(decs[mode], tok)
    out["served_prompts"] = dict(SERVED)
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


def heldout_eval(cfg: SelfDistillConfig, stage: Path, held: torch.Tensor, rep: Reporter,
                 what: str, **proposer: Any) -> dict[str, Any]:
    """A self-distillation run's decode eval: the first ``cfg.eval_prompts`` held-out
    sequences' prompts [N, prompt_len] of ``held`` decoded plain and with the proposer saved in
    ``stage`` (``proposer``: as :func:`spec_vs_plain`), written to ``stage/eval.json``; {} when
    there is none to decode."""
    n_eval = min(cfg.eval_prompts, held.shape[0])
    if not n_eval:
        return {}
    rep.log(f"decoding {n_eval} held-out prompts, plain and with the {what}")
    prompts = held[:n_eval, :cfg.prompt_len].tolist()
    ev = spec_vs_plain(Path(cfg.model), prompts, cfg.eval_gen_len, cfg.max_draft_len,
                       cfg.device, **proposer)
    write_json_atomic(stage / "eval.json", ev)
    return ev
