"""The training/serving dtype chooser (specserve/cpu_dtype.py): float32 on a CPU without
bfloat16 instructions, bfloat16 where it is fast, a flag overrides, and the choice is recorded.

An AVX2-only CPU (no AVX-512 BF16) is emulated on this machine with oneDNN's and ATen's own ISA
caps, ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN docs, "CPU Dispatcher Control") and
``ATEN_CPU_CAPABILITY=avx2`` (PyTorch, aten/src/ATen/native/DispatchStub.cpp) and MKL's
``MKL_ENABLE_INSTRUCTIONS=AVX2`` (float32 GEMM at AVX2 speed), each in a fresh
subprocess since each is read once at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specserve.cpu_dtype import CpuProbe, choose_dtype, pick
from specserve.errors import SpecserveError
from tests.helpers.tiny import TinyCheckpoint

ROOT = Path(__file__).resolve().parents[1]
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=300)


def test_auto_picks_float32_on_an_avx2_only_cpu_and_the_flag_wins() -> None:
    code = ("import json\nfrom specserve.cpu_dtype import choose_dtype\n"
            "print(json.dumps([choose_dtype(r).to_dict() for r in "
            "('auto', 'bfloat16', 'float32')]))\n")
    out = _run(code, AVX2_ONLY)
    assert out.returncode == 0, out.stderr
    auto, bf16, fp32 = json.loads(out.stdout)
    probe = auto["probe"]
    assert probe["cpu_capability"] == "AVX2" and probe["onednn_bf16"] is False
    # the emulation is real: bf16 matmuls are much slower than float32 ones (~40x here)
    assert probe["bfloat16_us"] > 2 * probe["float32_us"]
    assert auto["dtype"] == "float32" and "oneDNN bf16 no" in auto["reason"]
    assert (bf16["dtype"], bf16["reason"]) == ("bfloat16", "requested")
    assert fp32["dtype"] == "float32" and fp32["probe"] == probe  # cached once per process


def test_pick_needs_both_bf16_kernels_and_a_faster_matmul() -> None:
    fast = CpuProbe("AVX512", onednn_bf16=True, float32_us=350.0, bfloat16_us=90.0)
    assert pick(fast)[0] == "bfloat16"
    assert pick(CpuProbe("AVX2", False, 350.0, 90.0))[0] == "float32"  # no bf16 kernels
    assert pick(CpuProbe("AVX512", True, 350.0, 400.0))[0] == "float32"  # slower anyway


def test_native_choice_follows_this_cpu() -> None:
    c = choose_dtype("auto")
    assert c.probe is not None and c.device == "cpu"
    assert c.dtype == pick(c.probe)[0]
    assert choose_dtype("auto", "cuda:0").dtype == "bfloat16"
    assert choose_dtype("float32", "cuda").dtype == "float32"
    with pytest.raises(SpecserveError, match="--dtype 'fp8': choose one of auto"):
        choose_dtype("fp8")


def test_autocast_flag_changes_the_arithmetic() -> None:
    """Schedule.bf16 really selects bf16 autocast (a flag that is ignored would train the same
    numbers in both modes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specserve.train.lm import Schedule, train_lm

    def losses(bf16: bool) -> tuple[float, ...]:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
        model = LlamaForCausalLM(cfg)
        data = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
        s = Schedule(steps=2, batch_size=4, seq_len=16, lr=1e-3, warmup_steps=1, bf16=bf16)
        return train_lm(model, lambda _g: data, s, 0).losses

    assert Schedule(1, 1, 1, 1.0).bf16 is False  # the library default is float32
    assert losses(True) != losses(False)


@pytest.mark.parametrize("flag, expected", [(None, "float32"), ("bfloat16", "bfloat16")])
def test_train_medusa_on_avx2_trains_and_records_the_choice(
        tiny_ckpt: TinyCheckpoint, tmp_path: Path, flag: str | None, expected: str) -> None:
    out = tmp_path / "heads"
    args = ["train-medusa", "--model", str(tiny_ckpt.target), "--out", str(out),
            "--heads", "2", "--samples", "4", "--prompt-len", "4", "--gen-len", "8", "--steps", "2",
            "--batch-tokens", "16", "--threads", "1", "--format", "json"]
    args += ["--dtype", flag] if flag else []
    code = ("import sys\nfrom specserve.cli.main import cli\n"
            f"cli.main(args={args!r}, prog_name='specserve')\n")
    res = _run(code, AVX2_ONLY)
    assert res.returncode == 0, res.stderr[-2000:]
    printed = json.loads(res.stdout[res.stdout.index("{"):])
    info = json.loads((out / "train_info.json").read_text())
    assert info["dtype"]["dtype"] == printed["dtype"]["dtype"] == expected
    assert info["dtype"]["requested"] == (flag or "auto")
    assert info["config"]["dtype"] == (flag or "auto")
