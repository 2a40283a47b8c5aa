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
