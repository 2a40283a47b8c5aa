"""``specserve serve --frontend dynamo`` as users run it, surviving its parts (marker
``dynamo``; every server on 127.0.0.1, every request loop bounded in count and time):

- two workers, ``--migration-limit 3``, streamed greedy requests at c = 8; worker #0 SIGKILLed
  while it holds requests: none hangs, the requests that were on it (the frontend's
  ``dynamo_frontend_model_migration_total`` plus the errors clients saw) complete through
  migration with their greedy text (>= 90%) or end with an error, ``/v1/models`` answers
  throughout, and the supervisor has the worker back (and serving) within 30 s;
- worker #0 SIGSTOPped mid-run: its health probe finds it, it is killed and restarted, and
  every request ends within 30 s of the stop;
- the engine broken under a running worker that then dies: its restarts fail, and the fifth
  failure within 60 s ends ``serve`` (exit 3) in one line naming the worker and its error;
- the frontend SIGKILLed: ``serve`` exits 3 in one line and leaves no worker behind;
- a wedged engine (the loop blocked, the process up: :mod:`tests.helpers.wedge_worker`) is
  found by Dynamo's canary, killed and replaced, every request ending within 30 s;
- a base model (no chat template) serves ``/v1/completions`` with ``specserve generate``'s
  greedy text, and a registration the frontend refuses fails ``serve`` within 15 s with the
  frontend's reason;
- every socket the deployment listens on (frontend, request plane, worker metrics, Dynamo's
  system status servers; tritonserver's HTTP, gRPC and metrics for ``serve --repo``) is on
  127.0.0.1.

The stopped-worker run sends half as many requests as the killed-worker run (:data:`REQUESTS`).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.dynamo import descendants, json_from, post, stream, streamed_text
from tests.helpers.dynamo_failover import migrations
from tests.helpers.server import make_tiny_engine
from tests.helpers.sockets import listeners

pytestmark = pytest.mark.dynamo

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os\n",
           "while True:", "def main():", "return x +", "if __name__ =="]
REQUESTS, CONCURRENCY, MAX_TOKENS = 200, 8, 48
HUNG_S = 45.0  # a request that reads nothing for this long is hung
BACK_WITHIN_S = 30.0


# --- the command, its JSON and its events ---------------------------------------------------

@dataclass
class Serve:
    """A ``specserve serve ... --format json`` subprocess: its first JSON object, then one
    supervision event per line (with the time each arrived)."""

    proc: subprocess.Popen[str]
    info: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.info["frontend"])

    def wait_event(self, pred: Any, timeout_s: float) -> tuple[float, dict[str, Any]] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for t, e in list(self.events):
                if pred(e):
                    return t, e
            time.sleep(0.1)
        return None

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append((time.monotonic(), json.loads(line)))
            except ValueError:
                continue


def _start(args: list[str], timeout_s: float = 180.0) -> Serve:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "specserve.cli.main", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    s = Serve(proc)
    s.info = json_from(proc, timeout_s)
    threading.Thread(target=s._read_events, daemon=True).start()
    return s


def _stop(s: Serve) -> None:
    if s.proc.poll() is None:
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
    for f in (s.proc.stdout, s.proc.stderr):
        if f is not None:
            f.close()


# --- a bounded closed-loop load ------------------------------------------------------------

@dataclass
class Rec:
    index: int
    sent: float
    ended: float = 0.0
    text: str = ""
    error: str = ""
    hung: bool = False


def _one(url: str, i: int) -> Rec:
    """One streamed greedy completion; an error event, a non-200 or a broken stream is an
    error, a read that waited :data:`HUNG_S` is hung."""
    rec = Rec(i, time.monotonic())
    body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
            "temperature": 0}
    try:
        status, events = stream(url, "/v1/completions", body, timeout=HUNG_S)
        errs = [e for e in events if "error" in e]
        if status != 200 or errs:
            rec.error = f"{status}: {(errs or events or ['?'])[0]}"[:200]
        else:
            rec.text = streamed_text(events)
    except TimeoutError:
        rec.hung = True
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:200]
    rec.ended = time.monotonic()
    return rec


def _load(url: str, n: int, fault: Any, fault_after: int) -> tuple[list[Rec], float]:
    """``n`` requests at c = :data:`CONCURRENCY`; ``fault()`` runs once, half a request's
    time after ``fault_after`` requests finished (the next wave is mid-stream); returns the
    records and the fault's time."""
    todo = list(range(n))
    lock = threading.Lock()
    recs: list[Rec] = []
    fault_at: list[float] = []

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            r = _one(url, i)
            with lock:
                recs.append(r)
                due = len(recs) == fault_after
            if due:
                done = [x.ended - x.sent for x in recs if not x.error]
                time.sleep(0.5 * sum(done) / max(1, len(done)))
                fault_at.append(time.monotonic())
                fault()

    threads = [threading.Thread(target=worker) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert fault_at, "the fault never ran"
    return recs, fault_at[0]


class Watch:
    """``GET /v1/models`` every 0.5 s on a thread: the service answers throughout."""

    def __init__(self, url: str) -> None:
        self.url, self.ok = url, 0
        self.bad: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.5):
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    ids = [m["id"] for m in json.loads(r.read())["data"]]
                if ids == ["tiny"]:
                    self.ok += 1
                else:
                    self.bad.append(f"lists {ids}")
            except Exception as e:
                self.bad.append(f"{type(e).__name__}: {e}")

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


def _served_requests(metrics_url: str) -> float:
    """The worker's ``vllm:request_success_total``, summed over reasons."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


@pytest.fixture(scope="module")
def engine(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_engine(tiny_ckpt, Path(tmp_path_factory.mktemp("eng")) / "engine-draft",
                            "draft", draft_is_target=True)


def _reference(url: str) -> dict[int, str]:
    """Each prompt's greedy text, before any fault."""
    out = {}
    for i, p in enumerate(PROMPTS):
        status, events = stream(url, "/v1/completions", {"model": "tiny", "prompt": p,
                                                         "max_tokens": MAX_TOKENS,
                                                         "temperature": 0})
        assert status == 200, events
        out[i] = streamed_text(events)
    return out


@pytest.fixture()
def two_workers(engine: Path, tmp_path: Path) -> Iterator[Serve]:
    s = _start(["--frontend", "dynamo", "--engine", str(engine), "--workers", "2",
                "--migration-limit", "3", "--name", "tiny", "--max-batch", "16",
                "--format", "json", "--log-dir", str(tmp_path / "logs")])
    try:
        yield s
    finally:
        _stop(s)


def _report(name: str, got: dict[str, Any]) -> None:
    print(f"\n{name}: {json.dumps(got, sort_keys=True)}")


def test_a_killed_worker_s_requests_migrate_and_it_is_back_within_30_s(
        two_workers: Serve) -> None:
    s = two_workers
    ref = _reference(s.url)
    pid = s.info["workers"][0]["pid"]
    before = migrations(s.url)
    watch = Watch(s.url)
    recs, kill_at = _load(s.url, REQUESTS, lambda: os.killpg(pid, signal.SIGKILL), 40)
    back = s.wait_event(lambda e: e["event"] == "worker-ready" and e["worker"].endswith("#0"),
                        BACK_WITHIN_S)
    watch.stop()
    after = migrations(s.url)
    moved = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    migrated = sum(moved.values())
    errors = [r for r in recs if r.error]
    hung = [r for r in recs if r.hung]
    wrong = [r for r in recs if not r.error and not r.hung and r.text != ref[r.index % 8]]
    on_dead = migrated + len(errors)
    exited = s.wait_event(lambda e: e["event"] == "worker-exited", 1)
    got = {"requests": len(recs), "completed": len(recs) - len(errors) - len(hung),
           "errors": len(errors), "hung": len(hung), "wrong_text": len(wrong),
           "migrations": moved, "on_killed_worker": on_dead,
           "in_flight_at_kill": sum(1 for r in recs if r.sent <= kill_at < r.ended),
           "back_after_s": None if back is None else round(back[0] - kill_at, 2),
           "models_polls_ok": watch.ok, "models_polls_bad": watch.bad,
           "error_samples": [r.error for r in errors[:3]]}
    _report("sigkill", got)
    assert len(recs) == REQUESTS and not hung, got
    assert exited is not None and exited[1]["code"] == -signal.SIGKILL, s.events
    assert on_dead >= 1, got  # the kill hit the worker while it held requests
    assert migrated / on_dead >= 0.9, got
    assert not wrong, [(r.index, r.text) for r in wrong[:3]]
    assert not watch.bad and watch.ok > 0, got
    assert back is not None and back[0] - kill_at <= BACK_WITHIN_S, (got, s.events)
    # the restarted worker serves: a few more requests reach it too (round-robin)
    metrics = s.info["workers"][0]["metrics_url"]
    for i in range(6):
        assert not _one(s.url, i).error
    assert _served_requests(metrics) >= 1
    assert s.proc.poll() is None


def test_a_stopped_worker_is_found_killed_and_replaced(two_workers: Serve) -> None:
    s = two_workers
    pid = s.info["workers"][0]["pid"]
    recs, stop_at = _load(s.url, 96, lambda: os.kill(pid, signal.SIGSTOP), 24)
    hung_ev = s.wait_event(lambda e: e["event"] == "worker-hung", 1)
    back = s.wait_event(lambda e: e["event"] == "worker-ready" and e["worker"].endswith("#0"),
                        BACK_WITHIN_S)
    late = [r for r in recs if r.ended - max(r.sent, stop_at) > 30.0]
    got = {"requests": len(recs), "errors": sum(1 for r in recs if r.error),
           "hung": sum(1 for r in recs if r.hung), "ended_late": len(late),
           "in_flight_at_stop": sum(1 for r in recs if r.sent <= stop_at < r.ended),
           "last_end_after_stop_s": round(max(r.ended for r in recs) - stop_at, 2),
           "found_after_s": None if hung_ev is None else round(hung_ev[0] - stop_at, 2),
           "back_after_s": None if back is None else round(back[0] - stop_at, 2)}
    _report("sigstop", got)
    assert len(recs) == 96 and got["hung"] == 0 and not late, got
    assert hung_ev is not None and hung_ev[1]["pid"] == pid, s.events
    assert back is not None and back[0] - stop_at <= BACK_WITHIN_S, (got, s.events)
    assert s.proc.poll() is None


# --- base models and refused registrations ------------------------------------------------

def _without_chat_template(engine: Path, out: Path) -> Path:
    shutil.copytree(engine, out)
    target = out / "target"
    (target / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = target / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    return out


def _generate(engine: Path, prompt: str) -> str:
    out = subprocess.run([sys.executable, "-m", "specserve.cli.main", "generate", "--engine",
                          str(engine), "--prompt", prompt, "--max-tokens", "16",
                          "--format", "json"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    return str(json.loads(out.stdout)["text"])


def test_a_base_model_serves_completions(engine: Path, tmp_path: Path) -> None:
    base = _without_chat_template(engine, tmp_path / "base")
    want = {p: _generate(base, p) for p in PROMPTS[:2]}
    s = _start(["--frontend", "dynamo", "--engine", str(base), "--name", "tiny",
                "--format", "json", "--timeout", "60"])
    try:
        for p, text in want.items():
            body = {"model": "tiny", "prompt": p, "max_tokens": 16, "temperature": 0}
            status, one = post(s.url, "/v1/completions", body)
            assert status == 200 and one["choices"][0]["text"] == text, (p, one, text)
        status, _ = post(s.url, "/v1/chat/completions",
                         {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 404  # no chat route for a completions-only model (docs/reliability.md)
    finally:
        _stop(s)


def test_a_refused_registration_fails_serve_within_15_s(engine: Path, tmp_path: Path) -> None:
    broken = _without_chat_template(engine, tmp_path / "broken")
    cfg_path = broken / "target" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }"  # not valid Jinja
    cfg_path.write_text(json.dumps(cfg))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "specserve.cli.main", "serve", "--frontend",
                           "dynamo", "--engine", str(broken), "--format", "json",
                           "--timeout", "30"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    took = time.monotonic() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("error: Dynamo's frontend refused to serve broken: "), lines
    assert "syntax error" in lines[0], lines
    assert took < 15.0, took


# --- loopback only ------------------------------------------------------------------------

def _listening(proc: subprocess.Popen[str], want: int, timeout_s: float = 20.0) -> list[Any]:
    """The listeners of ``proc``'s descendants once there are at least ``want`` of them."""
    deadline = time.monotonic() + timeout_s
    got: list[Any] = []
    while time.monotonic() < deadline:
        got = listeners(descendants(proc.pid) | {proc.pid})
        if len(got) >= want:
            break
        time.sleep(0.5)
    return got


def test_a_dynamo_deployment_listens_on_loopback_only(engine: Path, tmp_path: Path) -> None:
    s = _start(["--frontend", "dynamo", "--engine", str(engine), "--workers", "2",
                "--name", "tiny", "--format", "json", "--router", "kv"])
    try:
        # frontend HTTP + response stream, per worker: request plane, metrics, system status
        got = _listening(s.proc, 2 + 2 * 3)
    finally:
        _stop(s)
    _report("dynamo listeners", {"listeners": [f"{x.address}:{x.port} pid {x.pid}"
                                               for x in got]})
    assert len(got) >= 8, got
    assert all(x.loopback for x in got), [x for x in got if not x.loopback]


@pytest.mark.server
def test_a_triton_deployment_listens_on_loopback_only(engine: Path, tmp_path: Path) -> None:
    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import find_free_ports

    repo = write_repository(engine, tmp_path / "repo", RepoOptions(baseline=False), force=True)
    http, grpc, metrics = find_free_ports(3)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "specserve.cli.main", "serve", "--repo",
                             str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
                             "--metrics-port", str(metrics), "--timeout", "240"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready"), (line, proc.stderr.read() if proc.stderr else "")
        got = _listening(proc, 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
    _report("triton listeners", {"listeners": [f"{x.address}:{x.port} pid {x.pid}"
                                               for x in got]})
    assert {http, grpc, metrics} <= {x.port for x in got}, got
    assert all(x.loopback for x in got), [x for x in got if not x.loopback]


def test_a_crash_loop_ends_serve_in_one_line_naming_the_worker(engine: Path,
                                                                 tmp_path: Path) -> None:
    """The engine breaks under a running worker, which then dies: every restart fails to load
    it, and the fifth failure within 60 s ends ``serve`` (exit 3) with one line naming the
    worker and its last error."""
    own = tmp_path / "engine"
    shutil.copytree(engine, own)
    s = _start(["--frontend", "dynamo", "--engine", str(own), "--name", "tiny",
                "--format", "json"])
    try:
        (own / "target" / "model.safetensors").write_bytes(b"not a safetensors file")
        t0 = time.monotonic()
        os.killpg(s.info["workers"][0]["pid"], signal.SIGKILL)
        rc = s.proc.wait(timeout=90)
        took = time.monotonic() - t0
        assert s.proc.stderr is not None
        err = s.proc.stderr.read().strip().splitlines()
    finally:
        _stop(s)
    kinds = [e["event"] for _, e in s.events]
    _report("crash loop", {"exit": rc, "took_s": round(took, 1), "events": kinds,
                           "line": err[-1:]})
    assert rc == 3 and len(err) == 1, (rc, err)
    assert err[0].startswith("error: worker tiny #0 failed 5 times in 60 s (crash loop)"), err
    assert "model.safetensors" in err[0], err
    assert kinds.count("worker-restarted") == 4 and "worker-ready" not in kinds, kinds


def test_the_frontend_s_death_ends_serve_and_every_worker(engine: Path) -> None:
    from tests.helpers.dynamo import alive

    s = _start(["--frontend", "dynamo", "--engine", str(engine), "--workers", "2",
                "--name", "tiny", "--format", "json"])
    try:
        children = descendants(s.proc.pid)
        os.killpg(s.info["frontend_pid"], signal.SIGKILL)
        rc = s.proc.wait(timeout=60)
        assert s.proc.stderr is not None
        err = s.proc.stderr.read().strip().splitlines()
    finally:
        _stop(s)
    assert rc == 3 and len(err) == 1, (rc, err)
    assert err[0].startswith("error: frontend exited with code -9"), err
    deadline = time.monotonic() + 10
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(children), f"orphans: {alive(children)}"


def test_a_wedged_engine_is_found_by_dynamo_s_canary_and_replaced(
        engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker #0 is :mod:`tests.helpers.wedge_worker`: while a file exists its serving loop
    blocks, its process and sockets stay up (the system status server answers). Dynamo's
    canary (``DYN_HEALTH_CHECK_ENABLED``, on in ``serve``) finds the engine silent and turns
    ``/health`` not ready; the supervisor kills the worker and restarts it; every request ends
    within 30 s of the wedge. (The one fault the command cannot plant from outside, so this
    runs the library's deployment and supervisor in the test.)"""
    from specserve.frontends import dynamo_serve as ds
    from specserve.frontends.dynamo_supervisor import Supervisor
    from specserve.frontends.supervision import RestartPolicy

    wedge = tmp_path / "wedge"
    monkeypatch.setenv("SPECSERVE_TEST_WEDGE_FILE", str(wedge))
    product_command = ds.worker_command

    made: list[int] = []

    def command(cfg: Any, model: Any, port: int) -> list[str]:  # worker #0: the wedge
        cmd = product_command(cfg, model, port)
        if not made:
            cmd[cmd.index(ds.WORKER_MODULE)] = "tests.helpers.wedge_worker"
        made.append(port)
        return cmd

    monkeypatch.setattr(ds, "worker_command", command)
    dep = ds.DynamoDeployment(ds.DynamoServeConfig(
        engine=engine, models=(ds.ServedModel("tiny"),), workers=2, migration_limit=3,
        max_batch=16, log_dir=tmp_path / "logs", canary=True))
    dep.start(180)
    events: list[tuple[float, dict[str, Any]]] = []

    def on_event(e: dict[str, Any]) -> None:
        events.append((time.monotonic(), e))
        if e["event"] == "worker-hung":
            wedge.unlink(missing_ok=True)  # the restarted worker must not wedge again

    done = threading.Event()
    sup = Supervisor(dep, RestartPolicy(), on_event)

    def supervise() -> None:
        while not done.is_set():
            sup.step()
            time.sleep(0.2)

    thread = threading.Thread(target=supervise, daemon=True)
    thread.start()
    try:
        assert "wedge_worker" in " ".join(dep.workers[0].cmd)
        recs, wedged_at = _load(dep.url, 48, wedge.touch, 12)
        deadline = time.monotonic() + BACK_WITHIN_S
        while not any(e["event"] == "worker-ready" for _, e in events) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        done.set()
        thread.join(timeout=30)
        wedge.unlink(missing_ok=True)
        dep.stop()
    hung = [t for t, e in events if e["event"] == "worker-hung"]
    back = [t for t, e in events if e["event"] == "worker-ready"]
    late = [r for r in recs if r.ended - max(r.sent, wedged_at) > 30.0]
    got = {"requests": len(recs), "errors": sum(1 for r in recs if r.error),
           "hung": sum(1 for r in recs if r.hung), "ended_late": len(late),
           "found_after_s": round(hung[0] - wedged_at, 2) if hung else None,
           "back_after_s": round(back[0] - wedged_at, 2) if back else None,
           "events": [e["event"] for _, e in events]}
    _report("wedged", got)
    assert len(recs) == 48 and got["hung"] == 0 and not late, got
    assert hung and back and back[0] - wedged_at <= BACK_WITHIN_S, got
