"""``specserve import``: a GGUF file (llama.cpp's format) as a Hugging Face checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit


def _summary(data: dict[str, Any]) -> str:
    src = data["source"]
    types = ", ".join(f"{k} x{v}" for k, v in src["tensor_types"].items())
    return (f"wrote {data['out']} ({data['model_type']}, {data['parameters'] / 1e6:.1f}M "
            f"parameters, {data['dtype']}, {len(data['weight_files'])} weight file(s))\n"
            f"from {src['path']} (sha256 {src['sha256'][:16]}..., {types})")


@click.command("import", short_help="Import a GGUF file as a Hugging Face checkpoint.")
@click.argument("gguf_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Output directory: config.json, model.safetensors, tokenizer, chat "
                   "template, generation_config.json, specserve_import.json (provenance).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default="float32", show_default=True,
              help="dtype of the written weights (float32 holds every GGUF type exactly).")
@click.option("--force", is_flag=True,
              help="Replace OUT if an earlier `specserve import` wrote it.")
@FORMAT_OPTION
def command(gguf_file: Path, out: Path, dtype: str, force: bool, fmt: str) -> None:
    """Import GGUF_FILE (llama, Mistral, Qwen2 or Qwen3; F32, F16, BF16, Q8_0, Q4_0, Q4_1,
    Q5_0, Q5_1, Q4_K, Q5_K or Q6_K tensors) as a Hugging Face directory that `specserve
    build`, `generate` and the trainers read. Tensors are dequantized by the `gguf` package;
    config, tokenizer and chat template come from transformers' GGUF support. Nothing is
    written unless the whole import succeeds.

    \b
    Examples:
      specserve import SmolLM2-135M-Instruct.Q4_1.gguf --out checkpoints/smollm2
      specserve import model.Q4_K_M.gguf --out ckpt/model --dtype bfloat16 --format json
    """
    from specserve.gguf_import import ImportConfig, prepare_import, write_import
    from specserve.train.progress import RichReporter

    prepared = prepare_import(ImportConfig(gguf=gguf_file, out=out, dtype=dtype, force=force))
    with RichReporter() as rep:
        res = write_import(prepared, rep)
    emit(res.to_dict(), fmt, _summary)
