"""``specserve repo``: write the Triton model repository for an engine directory."""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit

EXAMPLES = """
\b
Examples:
  specserve repo --engine engines/demo --out triton_repo
  specserve repo --engine engines/demo --out triton_repo --baseline --force
  specserve repo --engine engines/llama-medusa-fp8 --out /models/repo --max-batch-size 64 \\
      --tokenizer /models/tokenizer --max-queue-delay-us 100

Layout and tensor names are TensorRT-LLM 1.2.1's inflight_batcher_llm (ensemble, preprocessing,
tensorrt_llm, postprocessing, tensorrt_llm_bls; tensorrt_llm_draft for draft-target engines).
Defaults come from the engine's build_config.json. Serve it with `specserve serve --repo OUT`.
"""


def _text(d: dict[str, Any]) -> str:
    return (f"wrote {d['repo']} ({d['backend']} engine, spec_mode {d['spec_mode']}): "
            + ", ".join(d["models"]))


@click.command("repo", epilog=EXAMPLES, short_help="Write a Triton model repository.")
@click.option("--engine", "engine_dir", required=True, type=click.Path(file_okay=False),
              help="Engine directory from `specserve build`.")
@click.option("--out", required=True, type=click.Path(), help="Repository folder to write.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=None,
              help="Triton max_batch_size (default: the engine's).")
@click.option("--preprocessing-instances", type=click.IntRange(min=1), default=1,
              show_default=True)
@click.option("--postprocessing-instances", type=click.IntRange(min=1), default=1,
              show_default=True)
@click.option("--bls-instances", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--decoupled/--no-decoupled", default=True, show_default=True,
              help="Decoupled (streaming) tensorrt_llm and BLS models.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False), default=None,
              help="Tokenizer folder for pre/postprocessing (default: ENGINE/tokenizer).")
@click.option("--max-queue-delay-us", type=click.IntRange(min=0), default=0, show_default=True,
              help="Dynamic batching queue delay in microseconds.")
@click.option("--accumulate-tokens", is_flag=True, help="BLS decodes all tokens so far.")
@click.option("--baseline", is_flag=True,
              help="Reference engines: also ensemble_baseline -> tensorrt_llm_baseline "
                   "(same engine, speculation off).")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@FORMAT_OPTION
def command(engine_dir: str, out: str, max_batch_size: int | None, preprocessing_instances: int,
            postprocessing_instances: int, bls_instances: int, decoupled: bool,
            tokenizer_dir: str | None, max_queue_delay_us: int, accumulate_tokens: bool,
            baseline: bool, force: bool, fmt: str) -> None:
    """Write a Triton model repository for ENGINE into OUT (atomically)."""
    from specserve.triton.repository import RepoOptions, read_repo_meta, write_repository

    opts = RepoOptions(
        max_batch_size=max_batch_size, preprocessing_instance_count=preprocessing_instances,
        postprocessing_instance_count=postprocessing_instances, bls_instance_count=bls_instances,
        decoupled=decoupled, tokenizer_dir=tokenizer_dir, max_queue_delay_us=max_queue_delay_us,
        baseline=baseline, accumulate_tokens=accumulate_tokens)
    repo = write_repository(engine_dir, out, opts, force=force)
    meta = read_repo_meta(repo)
    emit({"repo": str(repo), **meta}, fmt, _text)
