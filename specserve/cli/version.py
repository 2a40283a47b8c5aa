"""``specserve version``: package versions that matter for reproducing a run."""

from __future__ import annotations

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.versions import collect_versions


@click.command("version", short_help="Print package versions (torch, transformers, ...).")
@FORMAT_OPTION
def command(fmt: str) -> None:
    """Print the specserve version and those of torch, transformers, tritonclient and, when
    installed, tensorrt_llm.

    \b
    Example:
      specserve version --format json
    """
    versions = collect_versions()
    emit(
        versions,
        fmt,
        lambda v: "\n".join(f"{k:16s} {val or 'not installed'}" for k, val in v.items()),
    )
