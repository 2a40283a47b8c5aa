"""Recapture ``specserve_metrics.txt`` (README.md here): the tiny reference engine drafting with
the target itself on a real tritonserver, three 12-token requests to ``ensemble`` and one to
``ensemble_baseline``, then ``GET /metrics`` filtered to the ``specserve:spec_decode_*`` lines.

    .venv/bin/python tests/data/watch/capture_specserve.py tests/data/watch/specserve_metrics.txt
"""

from __future__ import annotations

import sys
import tempfile
import urllib.request
from pathlib import Path

from tests.helpers.server import grpc_stream, request, serve_tiny

PROMPTS = ["def add(a, b):", "the quick brown fox", "import os\nimport sys"]
PREFIX = "specserve:spec_decode_"


def name(line: str) -> str:
    """The metric a line of exposition text is about (``# HELP name ...``, ``name{...} v``)."""
    parts = line.split()
    return parts[2] if line.startswith("#") and len(parts) > 2 else line


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="specserve-capture-") as tmp:
        dep = serve_tiny(Path(tmp))
        try:
            for p in PROMPTS:
                grpc_stream(dep.server.grpc_url, "ensemble", request(p, max_tokens=12))
            grpc_stream(dep.server.grpc_url, "ensemble_baseline", request("hello world", 12))
            with urllib.request.urlopen(dep.server.metrics_url, timeout=10) as r:
                text = r.read().decode()
        finally:
            dep.server.stop()
    lines = [ln for ln in text.splitlines(keepends=True) if name(ln).startswith(PREFIX)]
    out.write_text("".join(lines))
    print(f"{out}: {len(lines)} lines")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
