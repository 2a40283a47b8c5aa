"""The supervisor's decisions (pure: :mod:`specserve.frontends.supervision`) and its runner
(:class:`specserve.frontends.dynamo_supervisor.Supervisor`) on stand-in processes (``sleep``, a
process that exits at once, a listener that never answers): restart with bounded backoff, a
crash loop ends the service in one line, a worker that stops answering its probe is killed and
restarted, the frontend's exit ends the service. No Dynamo needed."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specserve.errors import ServerError
from specserve.frontends import supervision as sv
from specserve.frontends.dynamo_registration import has_chat_template, rejection

P = sv.RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, crash_loop_failures=3,
                     crash_loop_window_s=10.0, probe_misses=2, ready_timeout_s=30.0)


def test_backoff_doubles_and_is_bounded() -> None:
    assert [sv.backoff_s(n, P) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_exits_restart_until_a_crash_loop() -> None:
    st = sv.WorkerState()
    st, d = sv.on_exit(st, 100.0, P)
    assert d == sv.Restart(100.5, 0.5, 1)
    st, d = sv.on_exit(st, 105.0, P)
    assert d == sv.Restart(106.0, 1.0, 2)
    st, d = sv.on_exit(st, 109.0, P)
    assert d == sv.GiveUp(3, 10.0)


def test_failures_older_than_the_window_are_forgotten() -> None:
    st = sv.WorkerState()
    for t in (0.0, 20.0, 40.0, 60.0):
        st, d = sv.on_exit(st, t, P)
        assert d == sv.Restart(t + 0.5, 0.5, 1), d
    assert st.failures == (60.0,)


def test_a_loading_worker_is_not_hung_but_a_ready_one_that_stops_answering_is() -> None:
    st = sv.on_start(sv.WorkerState(), 0.0)
    st, v = sv.on_probe(st, False, 5.0, P)
    assert v == "ok" and st.misses == 0  # still loading
    st, v = sv.on_probe(st, True, 6.0, P)
    assert v == "became-ready"
    st, v = sv.on_probe(st, False, 7.0, P)
    assert v == "miss"
    st, v = sv.on_probe(st, True, 8.0, P)  # an answer resets the count
    assert v == "ok" and st.misses == 0
    st, v = sv.on_probe(st, False, 9.0, P)
    st, v = sv.on_probe(st, False, 10.0, P)
    assert v == "hung"
    st, _ = sv.on_exit(st, 11.0, P)
    st = sv.on_start(st, 12.0)
    _, v = sv.on_probe(st, False, 12.0 + 31.0, P)
    assert v == "not-ready-in-time"


def test_bad_policies_are_refused() -> None:
    for bad in (sv.RestartPolicy(crash_loop_failures=0), sv.RestartPolicy(probe_misses=0),
                sv.RestartPolicy(initial_backoff_s=5, max_backoff_s=1)):
        with pytest.raises(ValueError):
            bad.validate()


def test_chat_template_and_the_frontends_rejection(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert not has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert has_chat_template(tmp_path)
    line = ('\x1b[2m2026-12-07T02:39:57.587770Z\x1b[0m \x1b[33m WARN\x1b[0m dynamo_llm::discovery'
            '::controller: Model materialization failed; scheduling retry group=["tiny"] '
            'attempt=1 retry_ms=1000 error="prompt_formatter_from_mdc: chat_template field '
            'is required in the tokenizer_config.json file"')
    assert rejection("INFO starting\n" + line + "\n") == (
        "prompt_formatter_from_mdc: chat_template field is required in the "
        "tokenizer_config.json file")
    assert rejection("INFO all good\n") is None


# --- the runner, on stand-in processes ---------------------------------------------------

def _deployment(tmp_path: Path, worker_code: str, system_port: int = 0) -> Any:
    from specserve.frontends.dynamo_child import Child
    from specserve.frontends.dynamo_serve import (
        DynamoDeployment,
        DynamoServeConfig,
        ServedModel,
    )

    dep = DynamoDeployment(DynamoServeConfig(engine=tmp_path, models=(ServedModel("m"),)))
    py = sys.executable
    dep.children = [Child("frontend", [py, "-c", "import time; time.sleep(60)"],
                          tmp_path / "frontend.log"),
                    Child("worker m #0", [py, "-c", worker_code], tmp_path / "w0.log",
                          system_port=system_port),
                    Child("worker m #1", [py, "-c", "import time; time.sleep(60)"],
                          tmp_path / "w1.log")]
    dep.env = {}
    for c in dep.children:
        c.start(dep.env)
    return dep


def _run(sup: Any, until: Any, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not until() and time.monotonic() < deadline:
        sup.step()
        time.sleep(0.05)


FAST = sv.RestartPolicy(initial_backoff_s=0.1, max_backoff_s=0.4, crash_loop_failures=4,
                        crash_loop_window_s=30.0, probe_interval_s=0.2, probe_timeout_s=0.3,
                        probe_misses=2)


def test_a_killed_worker_is_restarted_and_the_rest_keeps_running(tmp_path: Path) -> None:
    from specserve.frontends.dynamo_supervisor import Supervisor

    dep = _deployment(tmp_path, "import time; time.sleep(60)")
    events: list[dict[str, Any]] = []
    try:
        sup = Supervisor(dep, FAST, events.append)
        first = dep.workers[0].proc.pid
        dep.kill_worker(0)
        _run(sup, lambda: any(e["event"] == "worker-restarted" for e in events), 10)
        kinds = [e["event"] for e in events]
        assert kinds == ["worker-exited", "worker-restarted"], events
        assert events[0]["code"] == -signal.SIGKILL and "SIGKILL" in events[0]["error"]
        assert dep.workers[0].exited() is None and dep.workers[0].proc.pid != first
        assert dep.workers[1].exited() is None and dep.children[0].exited() is None
    finally:
        dep.stop()


def test_a_crash_loop_ends_the_service_in_one_line(tmp_path: Path) -> None:
    from specserve.frontends.dynamo_supervisor import Supervisor

    dep = _deployment(tmp_path, "import sys; print('error: no such engine'); sys.exit(2)")
    events: list[dict[str, Any]] = []
    try:
        sup = Supervisor(dep, FAST, events.append)
        with pytest.raises(ServerError) as e:
            _run(sup, lambda: False, 20)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("worker m #0 failed 4 times in 30 s"), msg
        assert "error: no such engine" in msg, msg
        assert [x["event"] for x in events].count("worker-restarted") == 3, events
    finally:
        dep.stop()


def test_the_frontends_exit_ends_the_service(tmp_path: Path) -> None:
    from specserve.frontends.dynamo_supervisor import Supervisor

    dep = _deployment(tmp_path, "import time; time.sleep(60)")
    try:
        sup = Supervisor(dep, FAST)
        assert dep.children[0].proc is not None
        dep.children[0].proc.kill()
        dep.children[0].proc.wait()
        with pytest.raises(ServerError, match="^frontend exited with code -9"):
            sup.step()
    finally:
        dep.stop()


def test_a_worker_that_stops_answering_its_probe_is_killed_and_restarted(
        tmp_path: Path) -> None:
    """The worker answers its health probe ready, then is SIGSTOPped: the probe times out,
    the supervisor kills it and starts it again."""
    from specserve.frontends.dynamo_supervisor import Supervisor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ("import http.server, json\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        b = json.dumps({'status': 'ready'}).encode()\n"
              "        self.send_response(200); self.end_headers(); self.wfile.write(b)\n"
              "    def log_message(self, *a): pass\n"
              "http.server.HTTPServer.allow_reuse_address = True\n"
              f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    dep = _deployment(tmp_path, server, system_port=port)
    events: list[dict[str, Any]] = []
    try:
        sup = Supervisor(dep, FAST, events.append)
        sup.states[0] = sv.on_start(sup.states[0], time.monotonic())
        _run(sup, lambda: sup.states[0].ready, 10)  # its first ready answer
        assert sup.states[0].ready
        events.clear()
        stopped = dep.workers[0].proc.pid
        dep.workers[0].proc.send_signal(signal.SIGSTOP)
        _run(sup, lambda: any(e["event"] == "worker-ready" for e in events), 20)
        kinds = [e["event"] for e in events]
        assert kinds[:4] == ["worker-hung", "worker-exited", "worker-restarted",
                             "worker-ready"], events
        assert events[0]["pid"] == stopped and dep.workers[0].proc.pid != stopped
    finally:
        dep.stop()


def test_each_event_is_one_line_of_text_or_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from specserve.cli.serve import _event

    events = [{"event": "worker-exited", "worker": "worker m #0", "pid": 7, "code": -9,
               "error": "killed by SIGKILL; last log line: x", "restart_in_s": 0.5},
              {"event": "worker-hung", "worker": "worker m #1", "pid": 8, "verdict": "hung"},
              {"event": "worker-restarted", "worker": "worker m #0", "pid": 9},
              {"event": "worker-ready", "worker": "worker m #0", "pid": 9, "down_s": 4.2}]
    for e in events:
        _event(e, "text")
        _event(e, "json")
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == events
    lines = err.splitlines()
    assert len(lines) == 4 and all(x.startswith("specserve: worker m #") for x in lines), lines
    assert "exited with code -9" in lines[0] and "restarting in 0.5 s" in lines[0]


def test_a_request_migrated_after_its_last_token_gets_its_final_response() -> None:
    """Migration re-sends a request whose worker died after its last token with max_tokens 0:
    the worker answers with the final response alone (before, the request failed with
    "request_output_len must be positive, got 0")."""
    import asyncio

    from specserve.frontends.dynamo_worker import Worker, spent

    req = {"token_ids": [5, 6, 7], "stop_conditions": {"max_tokens": 0}}
    assert spent(req) and not spent({"token_ids": [5], "stop_conditions": {"max_tokens": 1}})
    assert not spent({"token_ids": [5]})
    worker = Worker.__new__(Worker)  # no engine: the answer comes before one is needed

    async def collect() -> list[dict[str, Any]]:
        return [item async for item in worker.generate(req, None)]

    assert asyncio.run(collect()) == [{"token_ids": [], "finish_reason": "length"}]
