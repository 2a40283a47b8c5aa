"""``specserve watch`` through the CLI group against real HTTP servers on loopback that serve
a script of vLLM-format exposition texts (the format of tests/data/openai/vllm_metrics_*.txt):
alarms, exit codes, resets, workers summed, scrape errors, and bad input as one line."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli

DATA = Path(__file__).resolve().parents[1] / "data" / "watch"
DOCTOR = str(DATA / "doctor_demo.json")  # rate 0.633, tau 3.44: floors 0.443, 2.41
INTERVAL = 0.05


def vllm_text(drafts: float, draft_tokens: float, accepted: float,
              created: float = 1.7961330228e9) -> str:
    lines = []
    for name, v in (("num_drafts", drafts), ("num_draft_tokens", draft_tokens),
                    ("num_accepted_tokens", accepted)):
        lines += [f"# HELP vllm:spec_decode_{name}_total x",
                  f"# TYPE vllm:spec_decode_{name}_total counter",
                  f'vllm:spec_decode_{name}_total{{engine="0",model_name="demo"}} {float(v)}',
                  f'vllm:spec_decode_{name}_created{{engine="0",model_name="demo"}} {created}']
    return "\n".join(lines) + "\n"


def script(steps: Sequence[tuple[float, float, float]],
           start: tuple[float, float, float] = (0, 0, 0)
           ) -> list[str | int]:
    """Cumulative texts: the start, then one per interval adding each step's counts."""
    d, t, a = start
    out: list[str | int] = [vllm_text(d, t, a)]
    for sd, st, sa in steps:
        d, t, a = d + sd, t + st, a + sa
        out.append(vllm_text(d, t, a))
    return out


HEALTHY = (100, 400, 320)   # rate 0.8, tau 4.2
COLLAPSED = (100, 400, 4)   # rate 0.01, tau 1.04


class Scripted:
    """An HTTP server answering ``GET /metrics`` with the next body of its script (an int:
    that HTTP status, no body); the last body repeats."""

    def __init__(self, bodies: list[str | int]) -> None:
        self.bodies, self.i = bodies, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = owner.bodies[min(owner.i, len(owner.bodies) - 1)]
                owner.i += 1
                if isinstance(body, int):
                    self.send_response(body)
                    self.end_headers()
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Any]:
    made: list[Scripted] = []

    def make(bodies: list[str | int]) -> str:
        made.append(Scripted(bodies))
        return made[-1].url
    yield make
    for s in made:
        s.close()


def watch(*urls: str, intervals: int, baseline: str = DOCTOR, extra: tuple[str, ...] = ()
          ) -> tuple[int, list[dict[str, Any]], str]:
    args = ["watch", *[a for u in urls for a in ("--metrics-url", u)], "--baseline", baseline,
            "--interval", str(INTERVAL), "--duration", str(INTERVAL * intervals + 1e-6),
            "--format", "json", *extra]
    r = CliRunner().invoke(cli, args)
    events = [json.loads(x) for x in r.output.splitlines() if x.startswith("{")]
    return r.exit_code, events, r.output


def kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def test_collapse_raises_one_alarm_at_the_second_low_interval(serve: Any) -> None:
    url = serve(script([HEALTHY] * 3 + [COLLAPSED] * 3))
    code, events, out = watch(url, intervals=6)
    assert code == 1, out
    assert [e["status"] for e in kinds(events, "interval")] == ["ok"] * 3 + ["low"] * 3
    (alarm,) = kinds(events, "alarm")
    assert alarm["index"] == 5 and set(alarm["figures"]) == {"acceptance_rate", "tau"}
    assert alarm["acceptance_rate"] == pytest.approx(0.01) and alarm["tau"] == pytest.approx(1.04)
    assert kinds(events, "end")[0] == {"event": "end", "intervals": 6, "alarms": 1,
                                       "exit_code": 1}


def test_exit_on_alarm_stops_at_the_alarm(serve: Any) -> None:
    url = serve(script([COLLAPSED] * 6))
    code, events, _ = watch(url, intervals=6, extra=("--exit-on-alarm",))
    assert code == 1 and len(kinds(events, "interval")) == 2


def test_idle_intervals_raise_nothing(serve: Any) -> None:
    url = serve(script([(0, 0, 0)] * 3 + [(10, 40, 0)] * 3))  # 40 < 64 draft tokens
    code, events, _ = watch(url, intervals=6)
    assert code == 0 and {e["status"] for e in kinds(events, "interval")} == {"idle"}


def test_restart_is_a_reset_counted_from_zero_not_an_alarm(serve: Any) -> None:
    before = script([HEALTHY] * 2, start=(5000, 20000, 16000))
    after = [vllm_text(100, 400, 320, created=1.8e9), vllm_text(200, 800, 640, created=1.8e9)]
    url = serve(before + after)
    code, events, out = watch(url, intervals=4)
    assert code == 0, out
    assert len(kinds(events, "counter-reset")) == 1
    iv = kinds(events, "interval")
    assert iv[2]["resets"] == 1 and iv[2]["draft_tokens"] == 400
    assert iv[2]["acceptance_rate"] == pytest.approx(0.8)
    assert [e["status"] for e in iv] == ["ok"] * 4


def test_workers_are_summed(serve: Any) -> None:
    """w0 collapses on a small share of the traffic: the summed rate 0.75 stays above the
    floor, where the mean of the workers' rates (0.4) would not."""
    w0 = serve(script([(25, 100, 80)] + [(25, 100, 0)] * 3))
    w1 = serve(script([(300, 1200, 960)] * 4))
    code, events, out = watch(w0, w1, intervals=4)
    assert code == 0, out
    iv = kinds(events, "interval")
    assert all(e["workers"] == 2 for e in iv) and iv[-1]["draft_tokens"] == 1300
    assert iv[-1]["acceptance_rate"] == pytest.approx(960 / 1300)


def test_a_worker_that_fails_a_scrape_is_left_out_once(serve: Any) -> None:
    bodies = script([HEALTHY] * 4)
    url = serve(bodies[:2] + [500] + bodies[3:])  # the server counted on meanwhile
    code, events, out = watch(url, intervals=4)
    assert code == 0, out
    (err,) = kinds(events, "scrape-error")
    assert "HTTP 500" in err["error"]
    iv = kinds(events, "interval")
    assert iv[1]["workers"] == 0 and iv[1]["status"] == "idle"
    assert iv[2]["draft_tokens"] == 800  # two intervals' worth, counted when it answers


def one_error_line(out: str) -> str:
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    assert "Traceback" not in out
    return lines[0]


def test_unreachable_url_is_one_line(serve: Any) -> None:
    s = Scripted([vllm_text(0, 0, 0)])
    url = s.url
    s.close()
    code, _, out = watch(url, intervals=1)
    assert code == 2 and "unreachable" in one_error_line(out)


def test_url_without_spec_counters_is_one_line(serve: Any) -> None:
    url = serve(['nv_inference_request_success{model="ensemble",version="1"} 4\n'])
    code, _, out = watch(url, intervals=1)
    line = one_error_line(out)
    assert code == 2 and "no speculative-decoding series" in line and "1.2.1" in line


def test_engine_named_but_absent_is_one_line(serve: Any) -> None:
    url = serve(script([HEALTHY]))
    code, _, out = watch(url, intervals=1, extra=("--engine", "sglang"))
    assert code == 2 and "no sglang speculative-decoding series" in one_error_line(out)


def test_baseline_of_the_wrong_kind_is_one_line(serve: Any, tmp_path: Path) -> None:
    url = serve(script([HEALTHY]))
    f = tmp_path / "rules.json"
    f.write_text('{"groups": []}')
    code, _, out = watch(url, intervals=1, baseline=str(f))
    assert code == 2 and "neither a specserve bench summary.json" in one_error_line(out)


def test_not_a_url_is_one_line() -> None:
    code, _, out = watch("localhost:8002", intervals=1)
    assert code == 2 and "not an http(s) URL" in one_error_line(out)


def test_emit_rules_writes_the_file_and_needs_an_engine(tmp_path: Path) -> None:
    out = tmp_path / "rules.yaml"
    r = CliRunner().invoke(cli, ["watch", "--emit-rules", str(out), "--baseline", DOCTOR,
                                 "--interval", "60"])
    assert r.exit_code == 2 and "needs --engine" in one_error_line(r.output)
    r = CliRunner().invoke(cli, ["watch", "--emit-rules", str(out), "--engine", "specserve",
                                 "--baseline", DOCTOR, "--interval", "60"])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "specserve:spec_decode_num_accepted_tokens_total" in text and "< 0.443" in text
