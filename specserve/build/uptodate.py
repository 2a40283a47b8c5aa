"""``make engine`` reuse check: is ``OUT/build_config.json`` up to date for a planned build?

``specserve engine`` (:mod:`specserve.build.demo_engine`) calls :func:`is_up_to_date`; as a
script it reads the JSON of ``specserve build ... --dry-run --force --format json`` on stdin
and exits 0 when the existing engine was built from the same resolved config, the same input
file hashes and the same package versions, else 1. Content-based, not timestamp-based:
touching a file does not force a rebuild; changing a byte does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from specserve.build.config import BuildConfig
from specserve.build.record import input_hashes, package_versions
from specserve.engine_record import read_engine_record
from specserve.errors import SpecserveError


def is_up_to_date(summary: dict[str, Any]) -> bool:
    """True when ``summary['out']`` holds an engine built exactly as ``summary`` plans."""
    cfg = BuildConfig.from_dict(summary["config"])
    try:
        rec = read_engine_record(Path(cfg.out))
    except SpecserveError:  # no engine, or not a valid record: rebuild
        return False
    planned = json.loads(json.dumps(cfg.to_dict()))
    return bool(rec.get("config") == planned and rec.get("input_hashes") == input_hashes(cfg)
                and rec.get("versions") == package_versions())


def main() -> int:
    try:
        summary = json.loads(sys.stdin.read())
    except json.JSONDecodeError:
        return 1
    if not isinstance(summary, dict) or "config" not in summary:
        return 1
    return 0 if is_up_to_date(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
