"""The trtllm runner, for real, against stand-in executables on PATH.

``python3`` and ``trtllm-build`` are replaced by a small script that records its argv and writes
what the real tool would (``config.json`` + ``rank0.*``). This tests our runner (argv passed
exactly, logs streamed, outputs checked, failures and Ctrl-C leave nothing), not TensorRT-LLM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from specserve.build.builder import build_engine, prepare
from specserve.build.config import BuildConfig
from specserve.errors import SpecserveError
from tests.helpers.tiny import TinyCheckpoint

FAKE = """#!{python}
import json, os, signal, sys, time
from pathlib import Path
argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
print("fake", argv[0], "step output", flush=True)
mode = os.environ.get("FAKE_MODE", "ok")
if argv[0] == "trtllm-build" and mode == "fail":
    print("boom", flush=True)
    sys.exit(3)
if argv[0] == "trtllm-build" and mode in ("SIGINT", "SIGTERM"):
    os.kill(os.getppid(), getattr(signal, mode))
    time.sleep(60)
out = Path(argv[argv.index("--output_dir") + 1])
if mode != "no-output":
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{{}}")
    if argv[0] == "trtllm-build":  # one engine per converted rank
        ckpt = Path(argv[argv.index("--checkpoint_dir") + 1])
        names = ["rank%d.engine" % r for r in range(len(list(ckpt.glob("rank*"))))]
    else:
        ranks = 1
        for flag in ("--tp_size", "--pp_size"):
            ranks *= int(argv[argv.index(flag) + 1]) if flag in argv else 1
        names = ["rank%d.safetensors" % r for r in range(ranks)]
    for name in names:
        (out / name).write_text("x")
"""


@pytest.fixture()
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with stand-in python3 and trtllm-build; returns the argv log file."""
    bin_dir, examples = tmp_path / "bin", tmp_path / "examples"
    bin_dir.mkdir()
    for name in ("python3", "trtllm-build"):
        exe = bin_dir / name
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(0o755)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho \"${FAKE_COMPUTE_CAP:-9.0}\"\n")
    smi.chmod(0o755)
    for script in ("medusa/convert_checkpoint.py", "models/core/llama/convert_checkpoint.py",
                   "quantization/quantize.py"):
        (examples / script).parent.mkdir(parents=True, exist_ok=True)
        (examples / script).write_text("")
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TRTLLM_EXAMPLES_DIR", str(examples))
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def _cfg(ckpt: TinyCheckpoint, out: Path, **kw: object) -> BuildConfig:
    base: dict[str, object] = {"model": str(ckpt.target), "out": str(out), "spec_mode": "medusa",
                               "medusa": str(ckpt.medusa), "backend": "trtllm"}
    base.update(kw)
    return BuildConfig(**base)  # type: ignore[arg-type]


def _recorded(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_runs_exact_argv_and_assembles_engine(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                              fake_tools: Path) -> None:
    out = tmp_path / "engines" / "m"
    cfg = _cfg(tiny_ckpt, out)
    plan = prepare(cfg).plan
    build_engine(cfg)
    assert _recorded(fake_tools) == plan.commands()
    assert (out / "target" / "rank0.engine").is_file()
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert not (out / "_checkpoints").exists() and not (out.parent / ".m.building").exists()
    rec = json.loads((out / "build_config.json").read_text())
    assert rec["commands"][1:] == plan.commands() and rec["trtllm"]["tensorrt_llm"] == "1.2.1"
    assert (rec["spec_mode"], rec["world_size"], rec["medusa"]["num_heads"]) == ("medusa", 1, 4)
    assert "fake trtllm-build step output" in (out / "build.log").read_text()


def test_draft_target_builds_two_engines(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                         fake_tools: Path) -> None:
    out = tmp_path / "dt"
    build_engine(_cfg(tiny_ckpt, out, spec_mode="draft", medusa=None, draft=str(tiny_ckpt.draft)))
    assert [a[0] for a in _recorded(fake_tools)] == ["python3", "python3", "trtllm-build",
                                                      "trtllm-build"]
    assert (out / "draft" / "rank0.engine").is_file() and (out / "target" / "config.json").is_file()
    assert json.loads((out / "build_config.json").read_text())["draft_logits"] is True


@pytest.mark.parametrize(("mode", "match"), [("fail", "exited with 3"),
                                             ("no-output", "config.json is missing")])
def test_failing_step_leaves_nothing(tiny_ckpt: TinyCheckpoint, tmp_path: Path, fake_tools: Path,
                                     monkeypatch: pytest.MonkeyPatch, mode: str,
                                     match: str) -> None:
    monkeypatch.setenv("FAKE_MODE", mode)
    out = tmp_path / "engines" / "m"
    with pytest.raises(SpecserveError, match=match):
        build_engine(_cfg(tiny_ckpt, out))
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.build-failed.log"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_child_and_leaves_nothing(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                               fake_tools: Path, monkeypatch: pytest.MonkeyPatch,
                                               sig: str) -> None:
    monkeypatch.setenv("FAKE_MODE", sig)
    out = tmp_path / "engines" / "m"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        build_engine(_cfg(tiny_ckpt, out))
    assert not out.exists() and not (out.parent / ".m.building").exists()
    assert signal.getsignal(signal.SIGTERM) is before


def test_force_replaces_existing(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                 fake_tools: Path) -> None:
    out = tmp_path / "m"
    build_engine(_cfg(tiny_ckpt, out))
    (out / "old.txt").write_text("old")
    with pytest.raises(SpecserveError, match="already exists"):
        build_engine(_cfg(tiny_ckpt, out))
    build_engine(_cfg(tiny_ckpt, out), force=True)
    assert not (out / "old.txt").exists() and (out / "build_config.json").is_file()
    assert not list(tmp_path.glob(".m.*"))


@pytest.mark.parametrize(("cap", "ok"), [("9.0", True), ("10.0", True), ("8.9", False)])
def test_fp8_needs_hopper(tiny_ckpt: TinyCheckpoint, tmp_path: Path, fake_tools: Path,
                          monkeypatch: pytest.MonkeyPatch, cap: str, ok: bool) -> None:
    monkeypatch.setenv("FAKE_COMPUTE_CAP", cap)
    out = tmp_path / "fp8"
    cfg = _cfg(tiny_ckpt, out, quantize="fp8", kv_cache_dtype="fp8")
    if ok:
        build_engine(cfg)
        assert _recorded(fake_tools)[0][1].endswith("quantization/quantize.py")
    else:
        with pytest.raises(SpecserveError, match="compute capability 8.9"):
            build_engine(cfg)
        assert not out.exists() and not fake_tools.exists()


def test_tp2_writes_one_file_per_rank(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                      fake_tools: Path) -> None:
    out = tmp_path / "tp2"
    build_engine(_cfg(tiny_ckpt, out, tp_size=2))
    assert sorted(p.name for p in (out / "target").glob("rank*")) == ["rank0.engine",
                                                                      "rank1.engine"]
    assert json.loads((out / "build_config.json").read_text())["world_size"] == 2


def test_missing_rank_is_an_error(tmp_path: Path) -> None:
    from specserve.build.plan import BuildStep
    from specserve.build.runner import check_step_output

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "rank0.engine").write_text("x")
    check_step_output(BuildStep("b", "build", ("trtllm-build",), str(tmp_path), 1))
    with pytest.raises(SpecserveError, match="lacks rank1.engine"):
        check_step_output(BuildStep("b", "build", ("trtllm-build",), str(tmp_path), 2))
