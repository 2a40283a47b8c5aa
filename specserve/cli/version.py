"""``specserve version``: package versions that matter for reproducing a run."""

from __future__ import annotations

import importlib.metadata

import click

from specserve import __version__
from specserve.cli._output import FORMAT_OPTION, emit

VERSIONED = ("torch", "transformers", "tritonclient", "tensorrt_llm", "nvidia-pytriton")


def collect_versions(dists: tuple[str, ...] = VERSIONED) -> dict[str, str | None]:
    """Versions of specserve and the given distributions; None when not installed."""
    out: dict[str, str | None] = {"specserve": __version__}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


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
