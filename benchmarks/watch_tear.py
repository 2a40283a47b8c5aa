"""How often a metrics scrape lands inside one request's counter update (docs/reliability.md
§7): the tiny reference engine drafting with the target itself (every draft accepted, so any
read whose drafted and accepted totals differ is torn), ``--threads`` gRPC clients as load, and
back-to-back scrapes for ``--duration-s``: raw reads (``watch.run.read_once``) and the watch's
settled reads (``watch.run.scrape``, the seqlock). Prints one JSON line.

    .venv/bin/python benchmarks/watch_tear.py --duration-s 60 --every-ms 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specserve.watch import run
from tests.helpers.server import serve_tiny
from tests.watch.test_watch_server import Load


def count(url: str, duration_s: float, every_s: float) -> dict[str, int]:
    """Raw and settled reads of ``url`` for ``duration_s``: how many, how many torn."""
    fetch, engine = run.http_get, "specserve"
    w = run.Worker(url, run.read_once(url, engine, fetch, 5.0))
    n = {"raw": 0, "raw_torn": 0, "settled": 0, "settled_torn": 0, "unsettled": 0}
    t_end = time.monotonic() + duration_s
    while time.monotonic() < t_end:
        raw = run.read_once(url, engine, fetch, 5.0)
        n["raw"] += 1
        n["raw_torn"] += raw.draft_tokens != raw.accepted
        got, ok = run.scrape(w, engine, fetch, 5.0)
        if ok:
            n["settled"] += 1
            n["settled_torn"] += got.draft_tokens != got.accepted
        else:
            n["unsettled"] += 1
        time.sleep(every_s)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--every-ms", type=float, default=5.0, help="pause between scrape pairs")
    ap.add_argument("--threads", type=int, default=2, help="client threads (load)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="specserve-tear-") as tmp:
        dep = serve_tiny(Path(tmp))
        try:
            url = dep.server.metrics_url
            with Load(dep.server.grpc_url, threads=a.threads) as load:
                n = count(url, a.duration_s, a.every_ms / 1000)
            print(json.dumps({**n, "requests": load.done, "errors": load.errors,
                              "duration_s": a.duration_s, "every_ms": a.every_ms}))
        finally:
            dep.server.stop()


if __name__ == "__main__":
    main()
