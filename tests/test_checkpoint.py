"""specserve.checkpoint (shared by build and runtime): a pickled ``.pt`` that
``torch.load(weights_only=True)`` refuses is one line everywhere it is read, never torch's
six-line explanation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from specserve.build.validate import validate_medusa, validate_target
from specserve.checkpoint import load_pt_state_dict, read_medusa_state_dict
from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.runtime.checkpoint import load_medusa_heads
from tests.helpers.tiny import TinyCheckpoint


class Payload:
    """A class instance in a pickle: weights_only=True refuses to rebuild it."""

    def __init__(self) -> None:
        self.note = "code, not tensors"


def _heads_dir(ckpt: TinyCheckpoint, root: Path, state: object) -> Path:
    """A Medusa heads directory whose only weights file is ``medusa_lm_head.pt`` = ``state``."""
    d = root / "heads"
    d.mkdir()
    shutil.copyfile(ckpt.medusa / "config.json", d / "config.json")
    torch.save(state, str(d / "medusa_lm_head.pt"))
    return d


def _one_line(e: pytest.ExceptionInfo[SpecserveError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg, f"refusal spans {msg.count(chr(10)) + 1} lines:\n{msg}"
    return msg


def test_pickled_pt_is_refused_in_one_line(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    d = _heads_dir(tiny_ckpt, tmp_path, {"0.0.linear.weight": Payload()})
    pt = d / "medusa_lm_head.pt"
    with pytest.raises(SpecserveError) as e:
        load_pt_state_dict(pt)
    msg = _one_line(e)
    assert msg.startswith(f"{pt}: not loadable with weights_only=True"), msg
    assert "Payload" in msg and msg.endswith("save the heads as safetensors"), msg
    for read in (lambda: load_medusa_heads(d, 64, 260),  # runtime
                 lambda: validate_medusa(d, validate_target(tiny_ckpt.target)),  # build
                 lambda: read_medusa_state_dict(d)):
        with pytest.raises(SpecserveError, match="weights_only=True") as e:
            read()
        _one_line(e)


def test_pickled_pt_heads_cli_build_is_one_line_exit_2(tiny_ckpt: TinyCheckpoint,
                                                       tmp_path: Path) -> None:
    d = _heads_dir(tiny_ckpt, tmp_path, {"0.0.linear.weight": Payload()})
    r = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--medusa", str(d),
                                 "--backend", "torch", "--out", str(tmp_path / "e"),
                                 "--dry-run"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "weights_only=True" in lines[0]


def test_corrupt_pt_is_one_line(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    d = _heads_dir(tiny_ckpt, tmp_path, {})
    (d / "medusa_lm_head.pt").write_bytes(b"not a torch.save file")
    with pytest.raises(SpecserveError, match="medusa_lm_head.pt") as e:
        load_medusa_heads(d, 64, 260)
    _one_line(e)


def test_plain_state_dict_pt_still_loads(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    sd = load_file(str(tiny_ckpt.medusa / "medusa_lm_head.safetensors"))
    d = _heads_dir(tiny_ckpt, tmp_path, sd)
    got, src = read_medusa_state_dict(d)
    assert src.name == "medusa_lm_head.pt" and sorted(got) == sorted(sd)
    assert all(torch.equal(got[k], sd[k]) for k in sd)
