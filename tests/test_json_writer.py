"""The one atomic JSON writer (``specserve.config.write_json_atomic``): stable bytes, the usual
file mode (engine directories are read by other users, e.g. a serving container), no temp
files left behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from specserve.config import write_json_atomic


def test_bytes_mode_and_no_leftovers(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "build_config.json"
    write_json_atomic(out, {"b": 1, "a": [1, 2]})
    assert out.read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=2, sort_keys=True) + "\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    write_json_atomic(out, {"c": 3})  # replaces in place
    assert json.loads(out.read_text()) == {"c": 3}
    assert [p.name for p in out.parent.iterdir()] == ["build_config.json"]
