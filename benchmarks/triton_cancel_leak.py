"""tritonserver's own RSS per request, by how the request ends (what is left of the kv
soak's RSS growth once the primitive caches are capped; docs/reliability.md §3).

Serves a repository (default ``reports/kv-soak/repo``, written by ``benchmarks/kv_soak.py``) and
sends rounds of short streamed requests over gRPC from 4 threads, one client per thread, to the
ensemble (text) and then straight to ``tensorrt_llm`` (token ids):
``complete`` (read to the final response, then ``stop_stream()``) or ``cancel`` (stop after the
first response with ``stop_stream(cancel_requests=True)``, which is how a client cancels a
stream). After each round it prints the tritonserver process's own RSS change per request (the
Python stubs are other processes).

    .venv/bin/python benchmarks/triton_cancel_leak.py [--repo DIR] [--requests 1000] [--minimal]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/helpers: the request arrays of the soak
# --minimal: a decoupled Python model of a few lines (a thread sends up to N responses, checks
# is_cancelled() before each, ends with the final flag), the control that is not ours
ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1, 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
ECHO_MODEL = """import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "request_output_len").as_numpy()[0, 0])
            threading.Thread(target=self.serve, args=(r.get_response_sender(), n),
                             daemon=True).start()

    def serve(self, sender, n):
        for i in range(n):
            if sender.is_cancelled():
                break
            out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            time.sleep(0.005)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


# the same model behind an ensemble, alone ("echo_ensemble") and followed by a
# non-decoupled Python step as our postprocessing is ("echo_chain")
COPY_CONFIG = """name: "copy"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
COPY_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().copy())])
            for r in requests]
"""


def ensemble_config(name: str, chain: bool) -> str:
    io = ('input [ { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1, 1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    first = ('{ model_name: "echo" model_version: -1 input_map { key: "request_output_len" '
             'value: "request_output_len" } output_map { key: "OUT" value: "%s" } }'
             % ("MID" if chain else "OUT"))
    second = (', { model_name: "copy" model_version: -1 input_map { key: "IN" value: "MID" } '
              'output_map { key: "OUT" value: "OUT" } }') if chain else ""
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{io}'
            f"ensemble_scheduling {{ step [ {first}{second} ] }}\n")


def minimal_repo(root: Path) -> Path:
    for name, config, model in (("echo", ECHO_CONFIG, ECHO_MODEL),
                                ("copy", COPY_CONFIG, COPY_MODEL)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(model)
    for name, chain in (("echo_ensemble", False), ("echo_chain", True)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(ensemble_config(name, chain))
    return root


def rss_mb(pid: int) -> float:
    from tests.helpers.soak import rss_bytes

    return rss_bytes(pid) / 2**20


def arrays(model: str, n: int) -> dict[str, Any]:
    """A streamed request of ``n`` tokens: text for the ensemble, token ids for tensorrt_llm."""
    import numpy as np

    from tests.helpers.server import request

    if model.startswith("ensemble"):
        return request("def f(x):", n, stream=True)
    if model.startswith("echo"):
        return {"request_output_len": np.array([[n]], dtype=np.int32)}
    return {"input_ids": np.array([[5, 6, 7, 8]], dtype=np.int32),
            "input_lengths": np.array([[4]], dtype=np.int32),
            "request_output_len": np.array([[n]], dtype=np.int32),
            "end_id": np.array([[-1]], dtype=np.int32),
            "streaming": np.array([[True]], dtype=bool)}


def run(url: str, pid: int, mode: str, n: int, model: str, threads: int = 4) -> float:
    from tests.helpers.server import infer_inputs
    from tests.helpers.soak import stream_rounds

    cancel = mode == "cancel"
    before, t0 = rss_mb(pid), time.monotonic()
    stream_rounds(url, model, lambda: infer_inputs(arrays(model, 32 if cancel else 4)), n,
                  cancel, threads)
    per = (rss_mb(pid) - before) * 1024 / n
    print(f"{model}, {mode}: {n} requests in {time.monotonic() - t0:.0f} s, tritonserver RSS "
          f"{before:.1f} -> {rss_mb(pid):.1f} MB ({per:.2f} KB/request)", flush=True)
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT / "reports" / "kv-soak" / "repo")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--models", default="ensemble,tensorrt_llm",
                    help="sent to each in turn: the ensemble (text) and tensorrt_llm (ids)")
    ap.add_argument("--minimal", action="store_true",
                    help="serve a minimal decoupled Python model instead: 'echo' alone, "
                         "'echo_ensemble' (echo behind an ensemble), 'echo_chain' (echo, then "
                         "a Python step, as the ensemble's postprocessing)")
    a = ap.parse_args()
    import tempfile

    from specserve.triton.server import TritonServer

    if a.minimal:
        a.repo = minimal_repo(Path(tempfile.mkdtemp()) / "repo")
        if a.models == ap.get_default("models"):
            a.models = "echo,echo_ensemble,echo_chain"
    srv = TritonServer(a.repo, log_path=Path("/tmp/triton-cancel-leak.log")).start(timeout_s=300)
    try:
        for model in a.models.split(","):
            run(srv.grpc_url, srv.pid, "complete", 900, model)  # warm-up: first allocations
            for _ in range(2):
                for mode in ("cancel", "complete"):
                    run(srv.grpc_url, srv.pid, mode, a.requests, model)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
