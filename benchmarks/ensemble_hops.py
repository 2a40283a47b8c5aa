"""Where a first token's time goes through the Triton ensemble, at c = 1: the hops
(client -> preprocessing -> tensorrt_llm -> postprocessing -> client) against the engine's own
time (the request's arrival in the ``tensorrt_llm_baseline`` model to its first response
handed to the sender thread).

A copy of ``--repo`` (a repository ``specserve repo --baseline`` wrote) gets stamping code
appended to its ``preprocessing``, ``tensorrt_llm_baseline`` and ``postprocessing`` model files
(wall-clock stamps into one file, the models otherwise unchanged); a real ``tritonserver``
serves the copy, and ``--requests`` chat prompts go one at a time through
``ensemble_baseline`` (the first is a warm-up). Per request: the client's TTFT, the engine's
part and the rest (hops: gRPC, the ensemble's scheduling, both Python models, the sender
thread); then the medians.

    PYTHONPATH=. .venv/bin/python benchmarks/ensemble_hops.py \\
        --repo reports/peers-real/repo-ngram_default \\
        --prompts reports/peers-real/prompts-chat-c1.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
from pathlib import Path

STAMPS = "stamps.log"

_PYTHON_MODEL = '''

import time as _hop_time
_hop_exec = TritonPythonModel.execute
def _hop_stamped(self, requests):
    a = _hop_time.time(); r = _hop_exec(self, requests); b = _hop_time.time()
    with open({path!r}, "a") as f:
        f.write(f"{name}_in {{a:.6f}}\\n{name}_out {{b:.6f}}\\n")
    return r
TritonPythonModel.execute = _hop_stamped
'''

_ENGINE_MODEL = '''

import time as _hop_time
from specserve.triton.models import llm as _hop_llm
def _hop_log(s):
    with open({path!r}, "a") as f:
        f.write(f"{{s}} {{_hop_time.time():.6f}}\\n")
_hop_exec = _hop_llm.TritonPythonModel.execute
def _hop_stamped(self, requests):
    _hop_log("engine_in")
    return _hop_exec(self, requests)
_hop_llm.TritonPythonModel.execute = _hop_stamped
_hop_send = _hop_llm.TritonSender.send
def _hop_first(self, arrays, error, final):
    if not getattr(self, "_hop_sent", False):
        self._hop_sent = True
        _hop_log("first_token")
    return _hop_send(self, arrays, error, final)
_hop_llm.TritonSender.send = _hop_first
'''


def stamped_copy(repo: Path, out: Path) -> Path:
    """``repo`` copied to ``out`` with the stamping code appended; the stamps' file."""
    shutil.copytree(repo, out)
    stamps = out / STAMPS
    for name in ("preprocessing", "postprocessing"):
        with open(out / name / "1" / "model.py", "a", encoding="utf-8") as f:
            f.write(_PYTHON_MODEL.format(path=str(stamps), name=name))
    with open(out / "tensorrt_llm_baseline" / "1" / "model.py", "a", encoding="utf-8") as f:
        f.write(_ENGINE_MODEL.format(path=str(stamps)))
    return stamps


async def send_all(url: str, prompts: list[str], max_tokens: int) -> list[tuple[float, float]]:
    """(send wall time, TTFT s) of each prompt, one at a time."""
    from specserve.client.transport import GenParams
    from specserve.client.triton_grpc import GrpcTransport

    tr = GrpcTransport(url)
    declared = await tr.declared_inputs("ensemble_baseline")
    params = GenParams(max_tokens=max_tokens, temperature=0.0, end_id=-1)
    out = []
    for p in prompts:
        raw = await tr.generate("ensemble_baseline", p, params, declared, 600)
        if raw.error or not raw.chunk_times_s:
            raise SystemExit(f"request failed: {raw.error}")
        out.append((raw.send_wall_s, raw.chunk_times_s[0]))
        await asyncio.sleep(0.3)
    await tr.close()
    return out


def split(sent: list[tuple[float, float]], stamps: Path) -> list[tuple[float, float]]:
    """(TTFT ms, engine ms) per request: the engine's arrival and first token are the first
    such stamps after the request was sent."""
    events = [(n, float(t)) for n, t in (ln.split() for ln in stamps.read_text().splitlines())]

    def first(name: str, after: float) -> float:
        return min(t for n, t in events if n == name and t >= after)

    rows = []
    for s, ttft in sent:
        arrive = first("engine_in", s)
        rows.append((1000 * ttft, 1000 * (first("first_token", arrive) - arrive)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True, help="JSONL prompts (text)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    from specserve.client.datasets import load_dataset
    from specserve.triton.server import TritonServer

    prompts = [p.text for p in load_dataset(args.prompts)][:args.requests]
    with tempfile.TemporaryDirectory() as tmp:
        stamps = stamped_copy(args.repo, Path(tmp) / "repo")
        srv = TritonServer(Path(tmp) / "repo", log_path=Path(tmp) / "triton.log").start(300)
        try:
            sent = asyncio.run(send_all(srv.grpc_url, prompts, args.max_tokens))
        finally:
            srv.stop()
        rows = split(sent, stamps)[1:]  # the first warms up
    print("request  TTFT ms  engine ms  hops ms")
    for i, (ttft, engine) in enumerate(rows, 1):
        print(f"{i:7d} {ttft:8.0f} {engine:10.0f} {ttft - engine:8.1f}")
    hops = [t - e for t, e in rows]
    print(f"median TTFT {statistics.median(t for t, _ in rows):.0f} ms, hops median "
          f"{statistics.median(hops):.1f} ms (min {min(hops):.1f}, max {max(hops):.1f})")


if __name__ == "__main__":
    main()
