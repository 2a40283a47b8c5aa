"""The doctor's measured acceptance probe: a few built-in prompts decoded greedily by the
reference engine (:func:`specserve.runtime.loader.build_decoder`, as ``specserve generate``)
with the pairing under test, reporting tau (tokens per verify step) and the acceptance rate
(accepted / drafted, TensorRT-LLM's ``acceptance_rate``;
:class:`specserve.spec.stats.AcceptanceStats`).

Greedy verification is lossless, so a collapsed pairing still answers correctly: only the
counters show it (a field report: draft weights lost on
resume, tau ~ 1.0, "completely silent"). An acceptance below ``min_acceptance`` is an error.
Float32 on the CPU by default; seconds for small models, minutes for 7B ones (``--no-probe``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specserve.doctor.findings import Finding, error, info

#: code, prose and structured data: the workloads whose acceptance differs (field §1 row 10)
PROBE_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The history of the printing press begins in the fifteenth century, when",
    '{"name": "example", "version": "1.0", "dependencies": {',
    "import os\nimport sys\n\nfor i in range(10):\n",
)


@dataclass(frozen=True)
class ProbeConfig:
    """What to probe: the target plus exactly one of draft / Medusa / EAGLE-3 directories."""

    target: Path
    tokenizer: Path  # directory with the target's tokenizer
    draft: Path | None = None
    medusa: Path | None = None
    eagle3: Path | None = None
    draft_len: int = 4
    tokens: int = 32
    device: str = "cpu"
    threads: int | None = None


@dataclass(frozen=True)
class ProbeResult:
    prompts: int
    tokens: int
    steps: int
    draft_tokens: int
    accepted_tokens: int
    tau: float
    acceptance_rate: float
    per_position_acceptance: list[float]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"status": "ran", **asdict(self)}


def encode_prompts(tokenizer_dir: Path, prompts: tuple[str, ...]) -> list[list[int]]:
    """Token ids of each prompt with the target's tokenizer (``tokenizer.json`` when present,
    the ``tokenizers`` library; else transformers' AutoTokenizer)."""
    tj = tokenizer_dir / "tokenizer.json"
    if tj.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tj))
        return [tok.encode(p).ids for p in prompts]
    from specserve.runtime.loader import load_tokenizer

    hf = load_tokenizer(tokenizer_dir)
    return [list(hf(p)["input_ids"]) for p in prompts]


def run_probe(cfg: ProbeConfig, prompts: tuple[str, ...] = PROBE_PROMPTS) -> ProbeResult:
    """Decode ``prompts`` greedily for ``cfg.tokens`` tokens each (no stop at EOS), one batch."""
    import torch

    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    decoder = build_decoder(cfg.target, draft_dir=cfg.draft, medusa_dir=cfg.medusa,
                            eagle3_dir=cfg.eagle3, max_draft_len=cfg.draft_len,
                            dtype="float32", device=cfg.device)
    ids = encode_prompts(cfg.tokenizer, prompts)
    start = time.perf_counter()
    results = decoder.generate(ids, SamplingParams(max_tokens=cfg.tokens, temperature=0.0))
    seconds = time.perf_counter() - start
    stats = results[0].stats
    for r in results[1:]:
        stats = stats.merge(r.stats)
    return ProbeResult(len(ids), sum(len(r.token_ids) for r in results), stats.steps,
                       stats.draft_tokens, stats.accepted_tokens, stats.tau,
                       stats.acceptance_rate, stats.per_position_acceptance, seconds)


def check_probe(result: ProbeResult, min_acceptance: float) -> list[Finding]:
    """An error when acceptance is below ``min_acceptance`` (or nothing was drafted)."""
    summary = (f"tau {result.tau:.3f}, acceptance {result.acceptance_rate:.3f} "
               f"({result.accepted_tokens}/{result.draft_tokens} drafts, {result.steps} steps, "
               f"{result.prompts} prompts, {result.seconds:.2f} s)")
    if result.draft_tokens == 0 or result.acceptance_rate < min_acceptance:
        return [error("acceptance-collapse", f"probe: {summary}, below {min_acceptance:g}: the "
                      "proposer does not predict the target (random or lost weights, another "
                      "backbone, a broken conversion)")]
    return [info("acceptance-probe", f"probe: {summary}")]
