"""``specserve generate``: one prompt through the PyTorch reference decoder (plain or
speculative), for one-off use and for checking a checkpoint or an engine directory."""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.errors import SpecserveError


def _render(d: dict[str, Any]) -> str:
    s = d["stats"]
    return (f"{d['text']}\n---\n{len(d['token_ids'])} tokens, {d['tokens_per_s']:.1f} tok/s, "
            f"mode {d['spec_mode']}, finish {d['finish_reason']}, steps {s['steps']}, "
            f"tau {s['tau']:.2f}, acceptance {s['acceptance_rate']:.2f} "
            f"({s['accepted_tokens']}/{s['draft_tokens']})")


@click.command("generate", short_help="Generate text with the reference speculative decoder.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False),
              help="Target HF model directory (safetensors).")
@click.option("--engine", "engine_dir", type=click.Path(file_okay=False),
              help="Torch engine directory from `specserve build` (instead of --model).")
@click.option("--medusa", "medusa_dir", type=click.Path(file_okay=False),
              help="Medusa heads directory (FasterDecoding layout).")
@click.option("--draft", "draft_dir", type=click.Path(file_okay=False),
              help="Draft model directory (same tokenizer as the target).")
@click.option("--eagle3", "eagle3_dir", type=click.Path(file_okay=False),
              help="EAGLE-3 head directory (portable layout, e.g. from `specserve "
                   "train-eagle3`).")
@click.option("--ngram", is_flag=True, help="Prompt-lookup (n-gram) speculation.")
@click.option("--no-spec", is_flag=True, help="Plain decoding (ignore any proposer).")
@click.option("--prompt", required=True, help="Prompt text.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--min-tokens", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0,
              show_default=True)
@click.option("--seed", type=int, default=None, help="Seed of the request's generator.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the tokenizer's EOS.")
@click.option("--num-draft-tokens", type=click.IntRange(min=1), default=4, show_default=True,
              help="Draft length K for --draft/--ngram/--eagle3.")
@click.option("--adaptive-k", is_flag=True,
              help="Adapt the draft length per step within --num-draft-tokens (draft/ngram).")
@click.option("--draft-min-confidence", type=click.FloatRange(0.0, 1.0), default=0.0,
              show_default=True,
              help="--draft: end a step's chain at a draft token the draft model gives less "
                   "probability than this (lossless; pair with a large --num-draft-tokens).")
@click.option("--medusa-choices", default=None,
              help="Tree as '{0}, {0, 0}, {1}' (default: mc_sim_7b_63 up to the head count).")
@click.option("--eagle-choices", default=None,
              help="--eagle3: a static tree '{0}, {1}, {0, 0}' at T = 0 (default: a chain of "
                   "--num-draft-tokens; sampled requests always get the chain).")
@click.option("--typical", is_flag=True,
              help="LOSSY Medusa typical acceptance at temperature > 0 (never the default).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default="float32", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@FORMAT_OPTION
def command(model_dir: str | None, engine_dir: str | None, medusa_dir: str | None,
            draft_dir: str | None, eagle3_dir: str | None, ngram: bool, no_spec: bool,
            prompt: str, max_tokens: int,
            min_tokens: int, temperature: float, top_k: int, top_p: float, seed: int | None,
            ignore_eos: bool, num_draft_tokens: int, adaptive_k: bool,
            draft_min_confidence: float, medusa_choices: str | None,
            eagle_choices: str | None, typical: bool, dtype: str, device: str, fmt: str) -> None:
    """Generate from --model (with --medusa, --draft, --eagle3 or --ngram) or from --engine.

    \b
    Examples:
      specserve generate --model ckpt/target --draft ckpt/draft --prompt "def add(" \\
          --max-tokens 64 --format json
      specserve generate --model ckpt/target --medusa ckpt/medusa --prompt "import os"
      specserve generate --model ckpt/target --eagle3 ckpt/eagle3 --prompt "def add("
      specserve generate --model ckpt/target --eagle3 ckpt/eagle3 \\
          --eagle-choices "{0}, {1}, {0, 0}, {0, 0, 0}" --prompt "def add("
      specserve generate --model ckpt/target --draft ckpt/draft --num-draft-tokens 32 \\
          --draft-min-confidence 0.6 --prompt "class Stack:"
      specserve generate --engine engines/demo --prompt "for i in" --temperature 0.8 --seed 1
    """
    from specserve.runtime import loader
    from specserve.runtime.params import SamplingParams

    if (model_dir is None) == (engine_dir is None):
        raise SpecserveError("give exactly one of --model or --engine")
    if engine_dir is not None:
        if medusa_dir or draft_dir or eagle3_dir or ngram:
            raise SpecserveError("--engine already fixes the speculation mode; drop "
                                 "--medusa/--draft/--eagle3/--ngram")
        decoder, tokenizer = _from_engine(engine_dir, device)
    else:
        assert model_dir is not None
        decoder = loader.build_decoder(
            model_dir, medusa_dir=None if no_spec else medusa_dir,
            draft_dir=None if no_spec else draft_dir, ngram=ngram and not no_spec,
            eagle3_dir=None if no_spec else eagle3_dir,
            eagle_choices=None if no_spec else eagle_choices, max_draft_len=num_draft_tokens,
            medusa_choices=medusa_choices,
            medusa_acceptance="typical" if typical else "greedy", dtype=dtype, device=device,
            adaptive_draft_len=adaptive_k, draft_min_confidence=draft_min_confidence)
        tokenizer = loader.load_tokenizer(model_dir)
    if no_spec:
        decoder.proposer = None
    eos = None if ignore_eos else tokenizer.eos_token_id
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, end_id=eos, min_tokens=min_tokens)
    emit(loader.generate_text(decoder, tokenizer, prompt, params), fmt, _render)


def _from_engine(engine_dir: str, device: str) -> tuple[Any, Any]:
    try:
        from specserve.runtime.engine import load_engine
    except ImportError as e:
        raise SpecserveError(f"{engine_dir}: engine loading is not available ({e})") from e
    engine = load_engine(engine_dir, device=device)
    return engine.decoder, engine.tokenizer
