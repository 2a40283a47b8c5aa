"""``specserve doctor``: check a target and its draft / Medusa / EAGLE-3 head before deploy.

Parses the options into a :class:`specserve.doctor.run.DoctorConfig`, calls
:func:`specserve.doctor.run.doctor` and prints one line per finding (``severity: code: message``)
or the JSON report; exits 1 when an error was found (``--strict``: or a warning), 0 otherwise,
2 for bad input.
"""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._options import GPU_CHOICES
from specserve.cli._output import FORMAT_OPTION, emit
from specserve.doctor.run import DoctorConfig, doctor

EXAMPLES = """
\b
Examples:
  # a draft model for a target, on one H200 at batch 16
  specserve doctor --model ckpt/target --draft ckpt/draft --gpu h200 --batch 16
\b
  # Medusa heads, static checks only, as JSON
  specserve doctor --model ckpt/target --medusa ckpt/medusa --no-probe --format json
\b
  # a built torch engine (paths, max_seq_len, batch, draft length from build_config.json)
  specserve doctor --engine engines/demo --gpu h100
\b
  # a TensorRT-LLM engine: the HF checkpoints it was built from, its sizes from the engine
  specserve doctor --engine engines/trt --model ckpt/target --eagle3 ckpt/eagle3
\b
  # this machine's read bandwidth and FMA rate, and a target's step against them
  specserve doctor --model ckpt/target --roofline --batch 1 --num-draft-tokens 4

\b
Each finding is one line "severity: code: message"; codes are stable (tokenizer-mismatch,
special-tokens-mismatch, chat-template-missing, chat-template-mismatch, precision-mismatch,
sampler-mismatch, sampler-penalty, draft-context-short, head-hidden-size, vocab-mismatch,
kv-budget-exceeded, acceptance-collapse, probe-failed; info: precision, sampler-defaults,
kv-budget, acceptance-probe, probe-skipped, machine, roofline).
Exit code: 0 no error (warnings allowed; --strict: none), 1 an error finding, 2 bad input.
"""


def _text(r: dict[str, Any]) -> str:
    lines = [f"{f['severity']}: {f['code']}: {f['message']}" for f in r["findings"]]
    lines.append(f"doctor: {r['errors']} error(s), {r['warnings']} warning(s) "
                 f"(exit {r['exit_code']})")
    return "\n".join(lines)


@click.command("doctor", epilog=EXAMPLES,
               short_help="Check a target + draft/Medusa/EAGLE-3 pairing before deploy.")
@click.option("--model", type=click.Path(file_okay=False), default=None,
              help="Target HF checkpoint directory.")
@click.option("--draft", type=click.Path(file_okay=False), default=None,
              help="Draft model directory.")
@click.option("--medusa", type=click.Path(file_okay=False), default=None,
              help="Medusa heads directory (FasterDecoding layout).")
@click.option("--eagle3", type=click.Path(file_okay=False), default=None,
              help="EAGLE-3 head directory (portable layout).")
@click.option("--engine", type=click.Path(file_okay=False), default=None,
              help="Engine directory (build_config.json): its paths and sizes fill the rest.")
@click.option("--gpu", type=GPU_CHOICES, default="h100-sxm", show_default=True,
              help="h100 = h100-sxm, a100 = a100-80g.")
@click.option("--gpu-memory-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Override the GPU's memory (GiB).")
@click.option("--memory-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.9,
              show_default=True, help="Share of GPU memory the engine may use.")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Concurrent sequences [default: the engine's max_batch_size, else 1].")
@click.option("--max-seq-len", type=click.IntRange(min=1), default=None,
              help="Served context [default: the engine's, else the target's "
                   "max_position_embeddings].")
@click.option("--num-draft-tokens", type=click.IntRange(min=1), default=None,
              help="Draft length K [default: the engine's max_draft_len, else 4].")
@click.option("--kv-dtype", type=click.Choice(["float32", "bfloat16", "float16", "fp8"]),
              default=None, help="KV-cache dtype [default: the engine's, else the target's].")
@click.option("--probe/--no-probe", default=True, show_default=True,
              help="Measure acceptance on built-in prompts with the reference engine.")
@click.option("--probe-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--probe-device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads for the probe [default: torch's].")
@click.option("--min-acceptance", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="Probe acceptance below this is an error (acceptance collapse).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--roofline", is_flag=True,
              help="Measure this machine (one thread: a float32 GEMV's read bandwidth, a GEMM's "
                   "FMA rate; a few seconds) and print the target's step against them. With "
                   "--model alone: only that.")
@click.option("--roofline-mb", type=click.IntRange(min=1), default=512, show_default=True,
              help="Size of the GEMV's matrix (MB): more than the last-level cache.")
@FORMAT_OPTION
def command(fmt: str, **opts: Any) -> None:
    """Check a target and its proposer: tokenizer, special tokens, chat template, precision,
    sampler defaults, context, head shapes, KV budget, and a measured acceptance probe."""
    report = doctor(DoctorConfig(**opts))
    emit(report, fmt, _text)
    click.get_current_context().exit(report["exit_code"])
