"""One output helper for every command: ``--format text|json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

FORMAT_OPTION = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format: human text, or JSON for machines.",
)


def emit(data: Any, fmt: str, text: Callable[[Any], str] | None = None) -> None:
    """Print ``data`` as JSON (``fmt == 'json'``) or through the ``text`` renderer."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    elif text is not None:
        click.echo(text(data))
    else:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def decode_eval_line(ev: dict[str, Any]) -> str:
    """A training command's held-out decode eval (``decoder_eval.spec_vs_plain``) in a line."""
    pos = ", ".join(f"{a:.2f}" for a in ev["per_position_acceptance"])
    return (f"held-out decode (K={ev['k']}, T=0): tau {ev['tau']:.2f}, per-position acceptance "
            f"[{pos}], {ev['tokens_per_s']:.0f} tok/s vs {ev['baseline_tokens_per_s']:.0f} "
            f"plain, matches plain {ev['matches_baseline']:.0%}")
