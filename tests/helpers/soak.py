"""Load and fault injection against a real tritonserver on loopback (``make soak``).

Three checks, each bounded in time (``docs/reliability.md`` has the figures):

1. :func:`soak_streams`: N requests over C concurrent gRPC streams to the ensemble, a fraction
   cancelled by the client after their first streamed chunk (``stop_stream(cancel_requests=
   True)``). Every request gets a record (completed, cancelled or error); the server must stay
   up, its memory (RSS of tritonserver and its Python stubs, one process group) is reported
   before and after, and a greedy request after the run must equal the one before.
2. :func:`kill_during_bench`: ``specserve bench`` runs while the server is SIGKILLed; the bench
   must keep its records, write a partial report and exit non-zero; after a restart on the same
   ports the same bench command must pass (exit 0).
3. :func:`sigint_build`: ``specserve build`` gets SIGINT while it is paused inside its staging
   step (the engine written, not yet renamed into place); no engine directory (nor staging
   directory) may remain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os",
           "if __name__ == '__main__':", "print(i, i * i)", "self.x = x", "return a + b"]


@dataclass(frozen=True)
class StreamRecord:
    index: int
    status: str  # completed | cancelled | error
    chunks: int
    text: str
    error: str | None
    seconds: float


def rss_bytes(pid: int | str = "self") -> int:
    """VmRSS of one process (``"self"``: this one); OSError when it is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def group_rss_bytes(pgid: int) -> int:
    """Sum of VmRSS over the processes of a process group (tritonserver + its stubs)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != pgid:  # field 5 (pgrp), after pid and comm
                continue
            total += rss_bytes(d.name)
        except (OSError, ValueError):
            continue
    return total


def one_stream(url: str, index: int, text: str, max_tokens: int, cancel: bool,
               timeout_s: float = 120.0) -> StreamRecord:
    """One streamed request on its own gRPC stream; ``cancel``: stop after the first chunk
    (closing the stream cancels the request)."""
    from tests.helpers.server import grpc_responses, request

    t0 = time.monotonic()
    chunks, parts = 0, list[str]()

    def record(status: str, error: str | None = None) -> StreamRecord:
        return StreamRecord(index, status, chunks, "".join(parts), error, time.monotonic() - t0)

    try:
        with closing(grpc_responses(url, "ensemble", [request(text, max_tokens, stream=True)],
                                    timeout_s)) as responses:
            for _, d in responses:
                if "error" in d:
                    return record("error", str(d["error"])[:300])
                piece = d["text_output"].reshape(-1)[0] if "text_output" in d else b""
                if piece:
                    chunks += 1
                    parts.append(piece.decode("utf-8", "replace"))
                if d["final"]:
                    return record("completed")
                if cancel and chunks >= 1:
                    return record("cancelled")
        return record("error", "the stream ended without a final response")
    except Exception as e:  # noqa: BLE001 - every failure is recorded
        return record("error", f"{type(e).__name__}: {e}"[:300])


def one_openai_stream(url: str, model: str, index: int, text: str, max_tokens: int,
                      cancel: bool, timeout_s: float = 120.0) -> StreamRecord:
    """:func:`one_stream` over the OpenAI protocol (a streamed greedy ``/v1/completions``, as
    NVIDIA Dynamo's frontend serves it); ``cancel``: close the connection after the first
    chunk with text (the frontend then cancels the request)."""
    import http.client
    from urllib.parse import urlparse

    t0 = time.monotonic()
    chunks, parts = 0, list[str]()

    def record(status: str, error: str | None = None) -> StreamRecord:
        return StreamRecord(index, status, chunks, "".join(parts), error, time.monotonic() - t0)

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return record("error", f"HTTP {r.status}: {r.read()[:200]!r}")
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return record("completed")
            event = json.loads(data)
            if "error" in event:
                return record("error", str(event["error"])[:300])
            piece = "".join(c.get("text") or "" for c in event.get("choices", []))
            if piece:
                chunks += 1
                parts.append(piece)
            if cancel and chunks >= 1:
                return record("cancelled")
        return record("error", "the stream ended without [DONE]")
    except Exception as e:  # noqa: BLE001 - every failure is recorded
        return record("error", f"{type(e).__name__}: {e}"[:300])
    finally:
        conn.close()


def stream_rounds(url: str, model: str, inputs: Callable[[], list[Any]], n: int, cancel: bool,
                  threads: int = 4) -> None:
    """``n`` streamed requests from ``threads`` threads (a gRPC client each), each on its own
    stream: read to the final response, or with ``cancel`` stopped after the first response
    by ``stop_stream(cancel_requests=True)``, a client's cancel (``inputs()``: one request's
    ``InferInput`` list)."""
    import queue
    import threading

    import tritonclient.grpc as grpcclient

    def one(client: Any) -> None:
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, inputs(), request_id="0",
                                  enable_empty_final_response=True)
        while True:
            result, error = got.get(timeout=60)
            if error is not None or cancel:
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream(cancel_requests=cancel)

    def work() -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            for _ in range(n // threads):
                one(client)
        finally:
            client.close()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def soak_streams(server: Any, requests: int = 500, concurrency: int = 64,
                 cancel_every: int = 10, max_tokens: int = 32,
                 out: Path | None = None) -> dict[str, Any]:
    """Check 1 (see the module docstring). Returns the figures; writes ``requests.jsonl``."""
    url = server.grpc_url
    before = one_stream(url, -1, PROMPTS[0], 16, False)
    rss0 = group_rss_bytes(server.pid)
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(one_stream, url, i, PROMPTS[i % len(PROMPTS)],
                               max_tokens * (4 if i % cancel_every == 0 else 1),
                               i % cancel_every == 0) for i in range(requests)]
        records = [f.result() for f in futures]
    wall = time.monotonic() - t0
    time.sleep(1.0)  # let cancelled requests drain on the server
    rss1 = group_rss_bytes(server.pid)
    after = one_stream(url, -2, PROMPTS[0], 16, False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "requests.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(asdict(r)) + "\n")
    counts = {s: sum(r.status == s for r in records) for s in ("completed", "cancelled", "error")}
    return {
        "requests": requests, "concurrency": concurrency, "recorded": len(records),
        "counts": counts, "errors": sorted({r.error or "" for r in records if r.error})[:5],
        "wall_s": round(wall, 2), "requests_per_s": round(requests / wall, 1),
        "server_alive": server.is_running(),
        "rss_before_mb": round(rss0 / 2**20, 1), "rss_after_mb": round(rss1 / 2**20, 1),
        "rss_growth_mb": round((rss1 - rss0) / 2**20, 1),
        "next_request_correct": before.status == after.status == "completed"
        and before.text == after.text and bool(before.text),
    }


def _bench_cmd(url: str, out: Path, requests: int) -> list[str]:
    exe = str(Path(sys.executable).with_name("specserve"))
    return [exe, "bench", "--url", url, "--model", "ensemble", "--requests", str(requests),
            "--warmup", "0", "--concurrency", "4", "--max-tokens", "48", "--end-id", "-1",
            "--temperature", "0", "--timeout", "60", "--out", str(out), "--format", "json"]


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def kill_during_bench(server: Any, out: Path, requests: int = 200,
                      kill_after: int = 5, restart: bool = True) -> dict[str, Any]:
    """Check 2. SIGKILL the server once ``kill_after`` requests are recorded."""
    cmd = _bench_cmd(server.grpc_url.replace("localhost", "127.0.0.1"), out / "killed", requests)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    jsonl = out / "killed" / "requests.jsonl"
    deadline = time.monotonic() + 120
    while len(_lines(jsonl)) < kill_after and time.monotonic() < deadline \
            and proc.poll() is None:
        time.sleep(0.05)
    recorded_at_kill = len(_lines(jsonl))
    alive_before_kill = server.is_running()
    if alive_before_kill:  # tritonserver only: its stubs are orphaned, as in a crash
        os.kill(server.pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    records = _lines(jsonl)
    res: dict[str, Any] = {
        "bench_exit_code": proc.returncode, "recorded_at_kill": recorded_at_kill,
        "server_alive_before_kill": alive_before_kill,
        "records": len(records),
        "statuses": {s: sum(r["status"] == s for r in records) for s in
                     ("completed", "cancelled", "error")},
        "summary_written": (out / "killed" / "summary.json").exists(),
        "stderr_tail": err.decode(errors="replace").strip().splitlines()[-1:],
    }
    if not alive_before_kill:  # an unexpected death: keep what the server said
        res["server_log_tail"] = server.log_text().strip().splitlines()[-20:]
    if restart:
        http, grpc, metrics = server.http_port, server.grpc_port, server.metrics_port
        server.stop()
        server.http_port, server.grpc_port, server.metrics_port = http, grpc, metrics
        server.start(180)
        again = subprocess.run(_bench_cmd(server.grpc_url, out / "restarted", 16),
                               capture_output=True, timeout=300)
        res["after_restart_exit_code"] = again.returncode
        res["after_restart_records"] = len(_lines(out / "restarted" / "requests.jsonl"))
    return res


# The build, run as ``specserve build`` would (click's ``cli``), with the torch engine's writer
# wrapped in this process only: it writes the engine into the staging dir, touches the file
# named by its first argument and sleeps until a signal ends it. So SIGINT always lands inside
# the staged build (the tiny engine stages in milliseconds: a signal sent on seeing the staging
# dir could arrive after the swap), and nothing in the product knows about the pause. SIGINT
# raises KeyboardInterrupt as in a terminal even when the test runs in a background job (a
# non-interactive shell starts those with SIGINT ignored, and Python keeps it ignored).
_PAUSED_BUILD = """
import signal, sys, time
from pathlib import Path
import specserve.build.torch_engine as torch_engine
from specserve.cli.main import cli

signal.signal(signal.SIGINT, signal.default_int_handler)

ready, real = Path(sys.argv[1]), torch_engine.write_torch_engine

def write_then_pause(*args, **kwargs):
    parts = real(*args, **kwargs)
    ready.touch()
    time.sleep(3600)  # the signal ends it
    return parts

torch_engine.write_torch_engine = write_then_pause
cli(sys.argv[2:], prog_name="specserve")
"""


def sigint_build(model: Path, out: Path, timeout_s: float = 120.0) -> dict[str, Any]:
    """Check 3. SIGINT ``specserve build`` (the torch engine, n-gram) while it is paused inside
    its staging step, the engine written into ``.<name>.building`` but not yet swapped into
    place (:data:`_PAUSED_BUILD`); without a pause within ``timeout_s`` it is signalled anyway
    and ``interrupted_while_staging`` is false."""
    stage = out.parent / f".{out.name}.building"
    with tempfile.TemporaryDirectory(prefix="sigint-build-") as tmp:
        ready = Path(tmp) / "staged"
        proc = subprocess.Popen([sys.executable, "-c", _PAUSED_BUILD, str(ready), "build",
                                 "--model", str(model), "--ngram", "--backend", "torch",
                                 "--dtype", "float32", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        while not ready.exists() and proc.poll() is None and time.monotonic() - t0 < timeout_s:
            time.sleep(0.01)
        paused = ready.exists() and proc.poll() is None
        staged = paused and (stage / "target" / "model.safetensors").is_file()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    return {"interrupted_while_staging": staged, "exit_code": proc.returncode,
            "engine_dir_left": out.exists(), "staging_dir_left": stage.exists(),
            "stderr_tail": err.decode(errors="replace").strip().splitlines()[-1:]}
