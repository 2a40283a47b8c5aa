"""NVIDIA Dynamo's OpenAI frontend in front of specserve workers, end to end (marker ``dynamo``,
``make test-dynamo``): one deployment for the module serves a tiny engine of every method an
engine records (draft, n-gram, Medusa, EAGLE-3, and ``none``: the target alone) under its own
name; greedy text through /v1/completions and /v1/chat/completions, streamed and not, equals the
reference decoder's (and the Triton model's, same engine); fields the worker cannot serve get an
OpenAI error; a client that goes away frees its slot; each worker's counters are exact."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.dynamo import method_engines, post, stream, streamed_text

pytestmark = pytest.mark.dynamo

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):"]
METHODS = ("draft", "ngram", "medusa", "eagle3", "none")
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def served(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from specserve.frontends.dynamo_serve import (
        DynamoDeployment,
        DynamoServeConfig,
        ServedModel,
    )

    root = Path(tmp_path_factory.mktemp("dynamo"))
    engines = method_engines(tiny_ckpt, root)
    models = tuple(ServedModel(m, engine=engines[m]) for m in METHODS if m != "none") + (
        ServedModel("none", speculation=False, engine=engines["draft"]),
        ServedModel("draft-all", engine=engines["draft-all"]),
        ServedModel("cancel", speculation=False, engine=engines["draft-all"]))
    cfg = DynamoServeConfig(engine=engines["draft"], models=models, max_batch=8,
                            log_dir=root / "logs")
    dep = DynamoDeployment(cfg)
    dep.start(240)
    try:
        yield dep, engines
    finally:
        dep.stop()


@pytest.fixture(scope="module")
def reference(served: Any) -> Any:
    """The target alone, greedy: what every method must produce at temperature 0."""
    from specserve.runtime.params import SamplingParams
    from specserve.serving.engine import load_decoder

    _, engines = served
    decoder, tok, _ = load_decoder(str(engines["draft"]), speculation=False)

    def greedy(ids: list[int], n: int = MAX_TOKENS) -> str:
        (res,) = decoder.generate([ids], SamplingParams(max_tokens=n, temperature=0.0))
        return str(tok.decode(res.token_ids, skip_special_tokens=True))
    return greedy, tok


@pytest.mark.parametrize("method", METHODS)
def test_greedy_completions_equal_the_reference(served: Any, reference: Any, method: str
                                                ) -> None:
    dep, _ = served
    greedy, tok = reference
    for prompt in PROMPTS:
        want = greedy(list(tok(prompt)["input_ids"]))
        body = {"model": method, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        status, one = post(dep.url, "/v1/completions", body)
        assert status == 200, one
        assert one["choices"][0]["text"] == want, (method, prompt)
        assert one["usage"]["completion_tokens"] == MAX_TOKENS
        status, events = stream(dep.url, "/v1/completions", body)
        assert status == 200 and streamed_text(events) == want, (method, prompt)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_chat_equals_the_reference(served: Any, reference: Any, method: str) -> None:
    dep, _ = served
    greedy, tok = reference
    messages = [{"role": "user", "content": PROMPTS[0]}]
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"])
    want = greedy(ids)
    body = {"model": method, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    status, one = post(dep.url, "/v1/chat/completions", body)
    assert status == 200, one
    assert one["choices"][0]["message"]["content"] == want
    assert one["usage"]["prompt_tokens"] == len(ids)
    status, events = stream(dep.url, "/v1/chat/completions", body)
    assert status == 200 and streamed_text(events, chat=True) == want


@pytest.mark.server
def test_greedy_text_equals_the_triton_model(served: Any, tiny_server: Any) -> None:
    """The same engine (draft = target) behind Triton's ensemble and behind Dynamo."""
    dep, _ = served
    srv = tiny_server.server
    for prompt in PROMPTS:
        conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=60)
        conn.request("POST", "/v2/models/ensemble/generate", json.dumps(
            {"text_input": prompt, "max_tokens": MAX_TOKENS, "end_id": -1,
             "exclude_input_in_output": True}))
        triton = json.loads(conn.getresponse().read())["text_output"]
        conn.close()
        status, one = post(dep.url, "/v1/completions", {
            "model": "draft-all", "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True})
        assert status == 200 and one["choices"][0]["text"] == triton, prompt


UNSERVED = [
    ("/v1/completions", {"n": 2, "stop": ["\n"]}),
    ("/v1/completions", {"n": 17}),
    ("/v1/chat/completions", {"n": 2, "stop": ["\n"]}),
    ("/v1/completions", {"presence_penalty": 0.5}),
]


@pytest.mark.parametrize(("path", "extra"), UNSERVED)
@pytest.mark.parametrize("streamed", [False, True])
def test_unserved_fields_get_an_openai_error(served: Any, path: str, extra: dict[str, Any],
                                             streamed: bool) -> None:
    dep, _ = served
    body: dict[str, Any] = {"model": "draft", "max_tokens": 4, **extra}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    if streamed:  # the stream has begun (200): one OpenAI error event, no choice
        status, events = stream(dep.url, path, body)
        assert status == 200 and len(events) == 1 and "choices" not in events[0], events
        err = events[0]["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400
    else:
        status, err = post(dep.url, path, body)
        assert status == 400, err
    assert "not supported by the specserve worker" in err["message"] or \
        "must be in [1, 16]" in err["message"], err


@pytest.mark.parametrize("method", METHODS)
def test_logprobs_equal_the_target_alone(served: Any, reference: Any, method: str) -> None:
    """OpenAI logprobs through Dynamo (completions ``logprobs`` 2; chat ``top_logprobs`` 2,
    streamed and not): every token's log-prob within 1e-4 of the target alone's (the
    reference decoder at T = 0; the worker takes them from the verify pass), top-2 sets
    equal, whatever the method."""
    from specserve.runtime.params import SamplingParams

    dep, engines = served
    _, tok = reference
    from specserve.serving.engine import load_decoder

    decoder, _, _ = load_decoder(str(engines["draft"]), speculation=False)
    prompt = PROMPTS[0]
    (want,) = decoder.generate([list(tok(prompt)["input_ids"])],
                               SamplingParams(max_tokens=8, logprobs=True, top_logprobs=2))
    body = {"model": method, "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "logprobs": 2}
    status, one = post(dep.url, "/v1/completions", body)
    assert status == 200, one
    lp = one["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == pytest.approx(want.logprobs, abs=1e-4)
    assert [len(t) for t in lp["top_logprobs"]] == [len({tok.decode([i]) for i, _ in r})
                                                   for r in want.top_logprobs]
    status, events = stream(dep.url, "/v1/completions", body)
    got = [v for e in events for c in e["choices"] if c.get("logprobs")
           for v in c["logprobs"]["token_logprobs"]]
    assert status == 200 and got == pytest.approx(want.logprobs, abs=1e-4)
    chat = {"model": method, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    status, c = post(dep.url, "/v1/chat/completions", chat)
    assert status == 200, c
    content = c["choices"][0]["logprobs"]["content"]
    assert len(content) == c["usage"]["completion_tokens"] == 8
    assert all(len(t["top_logprobs"]) == 2 and t["top_logprobs"][0]["logprob"] >= t["logprob"]
               - 1e-6 for t in content)


def _choices(events_or_body: Any, chat: bool, streamed: bool) -> dict[int, tuple[str, str]]:
    """{index: (text, finish_reason)} of a response (streamed: its events)."""
    out: dict[int, list[str]] = {}
    reasons: dict[int, str] = {}
    for e in events_or_body if streamed else [events_or_body]:
        for c in e.get("choices", []):
            part = (c.get("delta", {}).get("content") if streamed else
                    c.get("message", {}).get("content")) if chat else c.get("text")
            out.setdefault(c["index"], []).append(part or "")
            if c.get("finish_reason"):
                reasons[c["index"]] = c["finish_reason"]
    return {i: ("".join(t), reasons.get(i, "")) for i, t in out.items()}


@pytest.mark.parametrize("method", ["draft", "ngram"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("streamed", [False, True])
def test_n_choices_are_the_requests_run_alone(served: Any, method: str, path: str,
                                              streamed: bool) -> None:
    """n = 3 at T = 1 (seed 21): Dynamo's frontend passes n to the worker; choice i is the
    same request with n = 1 and seed 21 + i (text and finish reason), each its own text."""
    dep, _ = served
    chat = path.endswith("chat/completions")
    body: dict[str, Any] = {"model": method, "max_tokens": 12, "temperature": 1.0}
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPTS[0]}]
    else:
        body["prompt"] = PROMPTS[0]

    def ask(**extra: Any) -> dict[int, tuple[str, str]]:
        if streamed:
            status, got = stream(dep.url, path, {**body, **extra})
        else:
            status, got = post(dep.url, path, {**body, **extra})
        assert status == 200, got
        return _choices(got, chat, streamed)

    many = ask(n=3, seed=21)
    alone = [ask(seed=21 + i)[0] for i in range(3)]
    assert [many[i] for i in range(3)] == alone
    assert len({t for t, _ in alone}) > 1


def _counter(url: str, name: str, **labels: str) -> float:
    from specserve.client.acceptance import parse_prometheus

    u = url.removeprefix("http://").split("/")[0].split(":")
    conn = http.client.HTTPConnection(u[0], int(u[1]), timeout=10)
    conn.request("GET", "/metrics")
    samples = parse_prometheus(conn.getresponse().read().decode())
    conn.close()
    return sum(v for (n, lab), v in samples.items()
               if n == name and all(dict(lab).get(k) == w for k, w in labels.items()))


def test_a_client_that_goes_away_frees_its_slot(served: Any) -> None:
    """Stream a long request (480 tokens, one per step), read one chunk, hang up: the worker
    ends it (``abort``, not ``length``) and the next request on that worker completes."""
    dep, _ = served
    (worker,) = [w for w in dep.workers if w.model == "cancel"]
    before = _counter(worker.metrics_url, "vllm:request_success_total", finished_reason="abort")
    done = _counter(worker.metrics_url, "vllm:request_success_total", finished_reason="length")
    conn = http.client.HTTPConnection("127.0.0.1", dep.http_port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": "cancel", "prompt": PROMPTS[0], "max_tokens": 480, "temperature": 0,
        "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data:")
    conn.sock.close()  # type: ignore[union-attr]  # the client is gone
    conn.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _counter(worker.metrics_url, "vllm:request_success_total") > before + done:
            break
        time.sleep(0.1)
    assert _counter(worker.metrics_url, "vllm:request_success_total",
                    finished_reason="abort") == before + 1, "the abandoned request ran on"
    assert _counter(worker.metrics_url, "vllm:request_success_total",
                    finished_reason="length") == done
    status, one = post(dep.url, "/v1/completions", {"model": "cancel", "prompt": PROMPTS[1],
                                                    "max_tokens": 4, "temperature": 0})
    assert status == 200 and one["usage"]["completion_tokens"] == 4
    assert _counter(worker.metrics_url, "vllm:request_success_total",
                    finished_reason="length") == done + 1
