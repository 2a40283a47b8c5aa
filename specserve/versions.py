"""Installed versions of specserve and the packages that matter for reproducing a run.

Library code (``build_config.json``'s ``versions``) and ``specserve version`` both use
:func:`collect_versions`; the library never imports the CLI.
"""

from __future__ import annotations

import importlib.metadata

from specserve import __version__

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
