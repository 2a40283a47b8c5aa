"""A scripted OpenAI-shaped server over a deterministic toy next-token table, for the checker's
own tests (tests/conform/): NOT a mock of a server under test, a fixture whose faults are known.

Stdlib only (``http.server``), 127.0.0.1, a free port. ``/v1/completions`` and
``/v1/chat/completions``, streamed (SSE, ``[DONE]``) or not, with the fields the checks use:
``temperature``/``seed`` (``random.Random(seed)``), ``stop`` (strings, left out of the text),
``stop_token_ids``, ``min_tokens``, ``ignore_eos``, ``max_tokens``, ``n``, ``logprobs`` /
``top_logprobs``, ``response_format`` / ``structured_outputs.regex`` (a fixed valid answer),
``return_token_ids``; ``usage``; ``GET /v1/models`` states ``max_model_len``.

The toy model: 16 tokens (multi-byte ones among them); the next token's logits depend on the
last token only (:func:`logits`). A "speculative" server streams its tokens in runs of
``run`` tokens per chunk (one chunk = one verify step); the baseline in runs of 1.
``plants`` turns on one fault each, named after the check it must turn red.
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VOCAB = ("</s>", " ", "a", "b", "c", "(", ")", ":", "\n", "é", "日", "本", "x", "=", "1", "-")
EOS = 0
LIMIT = 256
PLANTS = frozenset({
    "greedy_drift",      # T = 0: token 5 replaced
    "split_char",        # streamed multi-byte characters split across chunks, decoded alone
    "stop_leak",         # text after a stop string inside a run is sent
    "stop_id_ignored",   # stop_token_ids ignored
    "overshoot",         # max_tokens rounded up to a whole run
    "min_ignored",       # min_tokens ignored
    "eos_honoured",      # ignore_eos ignored (stops at max_tokens // 2)
    "finish_missing",    # streamed answers carry no finish_reason
    "usage_off",         # streamed usage counts one token too many
    "seed_ignored",      # seed ignored
    "stream_seed_off",   # a streamed request samples another stream (seed + 1)
    "skewed_sampler",    # T > 0: tokens after the first sampled from p^3 (not p)
    "n_clone",           # n > 1: every choice a copy of the first
    "drop_logprob",      # the second token's logprob dropped (null)
    "top_shifted",       # top-k logprobs: ranks 2..k+1 (the most likely one left out)
    "grammar_leak",      # structured output: an invalid answer
    "long_crash",        # HTTP 500 for prompts over LIMIT - 32 tokens
    "empty_crash",       # HTTP 500 for the empty prompt
    "short_crash",       # HTTP 500 for a one-character prompt
    "refuse_logprobs",   # HTTP 400 for logprobs (a clean refusal)
})
SCHEMA_ANSWER = '{"name": "ab", "ok": true}'
OBJECT_ANSWER = '{"a": 1}'
REGEX_ANSWER = "abc-12"


def logits(last: int) -> list[float]:
    """The toy model: the next token's logits given the last token."""
    out = [((last * 59 + j * 25) % 31) / 6.0 for j in range(len(VOCAB))]
    out[EOS] = -1.0
    out[last] -= 4.0   # no long self-loops
    return out


def probs(last: int, temperature: float) -> list[float]:
    z = [x / temperature for x in logits(last)]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = sum(e)
    return [x / s for x in e]


def logprobs_of(last: int) -> list[float]:
    p = probs(last, 1.0)
    return [math.log(x) for x in p]


def wants_logprobs(body: dict[str, Any]) -> bool:
    """OpenAI: ``logprobs`` k >= 0 (completions; 0 = the chosen tokens only) or true (chat)."""
    lp = body.get("logprobs")
    return lp is not None and lp is not False   # 0 == False: compare by identity


def last_token(prompt: str) -> int:
    return VOCAB.index(prompt[-1]) if prompt and prompt[-1] in VOCAB else len(prompt) % 15 + 1


@dataclass
class Generation:
    ids: list[int]
    finish: str
    top: list[list[float]] = field(default_factory=list)   # per token: the full logprob row
    leak: list[int] = field(default_factory=list)   # the rest of the run after a stop string


class Toy:
    """Generation rules shared by the clean and the planted server."""

    def __init__(self, plants: frozenset[str], run: int = 1) -> None:
        self.plants, self.run = plants, run

    def generate(self, prompt: str, body: dict[str, Any], choice: int) -> Generation:
        t = float(body.get("temperature", 1.0))
        seed = body.get("seed")
        if seed is not None and body.get("stream") and "stream_seed_off" in self.plants:
            seed = int(seed) + 1
        rng = random.Random(None if seed is None or "seed_ignored" in self.plants
                            else int(seed) * 1000 + choice)
        max_tokens = int(body.get("max_tokens", 16))
        if "overshoot" in self.plants:
            max_tokens = -(-max_tokens // 3) * 3
        ignore_eos = bool(body.get("ignore_eos", False))
        if "eos_honoured" in self.plants and ignore_eos:
            ignore_eos, max_tokens = False, max(1, max_tokens // 2)
        stop_ids = set(body.get("stop_token_ids") or [])
        if "stop_id_ignored" in self.plants:
            stop_ids = set()
        min_tokens = 0 if "min_ignored" in self.plants else int(body.get("min_tokens") or 0)
        last, ids, top = last_token(prompt), [], []
        while len(ids) < max_tokens:
            p = probs(last, t if t > 0 else 1.0)
            if len(ids) < min_tokens or ignore_eos:
                for j in (stop_ids | ({EOS} if len(ids) < min_tokens or ignore_eos else set())):
                    p[j] = 0.0
            top_k = int(body.get("top_k") or 0)
            if top_k > 0:
                keep = set(sorted(range(len(p)), key=lambda j: -p[j])[:top_k])
                p = [x if j in keep else 0.0 for j, x in enumerate(p)]
            if t == 0:
                nxt = max(range(len(p)), key=lambda j: p[j])
                if "greedy_drift" in self.plants and len(ids) == 5:
                    nxt = (nxt + 1) % len(VOCAB) or 1
            else:
                if "skewed_sampler" in self.plants and ids:
                    p = [x ** 3 for x in p]
                nxt = rng.choices(range(len(p)), weights=p)[0]
            top.append(logprobs_of(last))
            if nxt == EOS and not ignore_eos:
                return Generation(ids, "stop", top[:-1])
            if nxt in stop_ids:
                return Generation(ids, "stop", top[:-1])
            if any(s and s in VOCAB[nxt] for s in body.get("stop") or []):
                # the stop string completes here: its token and the rest are not sent; what
                # the rest of this verify run would have been is kept for the stop_leak plant
                rest = self.generate(prompt + "".join(VOCAB[t] for t in ids + [nxt]),
                                     {**body, "stop": [], "max_tokens": -len(ids) % self.run
                                      or self.run}, choice)
                return Generation(ids, "stop", top[:-1], [nxt, *rest.ids])
            ids.append(nxt)
            last = nxt
        return Generation(ids, "length", top)


def runs(ids: list[int], run: int) -> Iterator[list[int]]:
    for i in range(0, len(ids), run):
        yield ids[i:i + run]


class ScriptedServer:
    """``with ScriptedServer(run=3, plants={"stop_leak"}) as srv: srv.url`` (host:port)."""

    def __init__(self, run: int = 1, plants: frozenset[str] | set[str] = frozenset(),
                 model: str = "toy") -> None:
        unknown = set(plants) - PLANTS
        if unknown:
            raise ValueError(f"unknown plants {sorted(unknown)}")
        self.run, self.plants, self.model = run, frozenset(plants), model
        self.toy = Toy(self.plants, run)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [
                        {"id": srv.model, "owned_by": "scripted", "max_model_len": LIMIT}]})
                elif self.path == "/version":
                    self._json(200, {"version": "0.0-test"})
                else:
                    self._json(404, {"error": {"message": "not found", "code": 404}})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                chat = self.path == "/v1/chat/completions"
                try:
                    status, answer = srv.answer(body, chat)
                except ValueError as e:
                    self._json(400, {"error": {"message": str(e), "code": 400}})
                    return
                if status != 200 or not body.get("stream"):
                    self._json(status, answer)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for event in answer:
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        return Handler

    def answer(self, body: dict[str, Any], chat: bool) -> tuple[int, Any]:
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n_prompt = len(prompt) + 1
        if "long_crash" in self.plants and n_prompt > LIMIT - 32:
            return 500, {"error": {"message": "internal error", "code": 500}}
        if prompt == "" and "empty_crash" in self.plants:
            return 500, {"error": {"message": "internal error", "code": 500}}
        if len(prompt) == 1 and "short_crash" in self.plants:
            return 500, {"error": {"message": "internal error", "code": 500}}
        if prompt == "":
            raise ValueError("prompt is empty")
        if wants_logprobs(body) and "refuse_logprobs" in self.plants:
            raise ValueError("logprobs are not supported with speculative decoding")
        if n_prompt + int(body.get("max_tokens", 16)) > LIMIT:
            raise ValueError(f"prompt {n_prompt} + max_tokens exceeds max_model_len {LIMIT}")
        n = int(body.get("n") or 1)
        gens = [self._gen(prompt, body, i) for i in range(n)]
        if "stop_leak" in self.plants:
            gens = [Generation(g.ids + g.leak, g.finish, g.top + [logprobs_of(1)] * len(g.leak))
                    for g in gens]
        if "n_clone" in self.plants:
            gens = [gens[0]] * n
        if body.get("stream"):
            return 200, list(self._events(body, gens, chat, n_prompt))
        choices = [self._choice(body, g, i, chat, g.ids, final=True)
                   for i, g in enumerate(gens)]
        return 200, {"object": "chat.completion" if chat else "text_completion",
                     "choices": choices, "usage": self._usage(n_prompt, gens)}

    def _gen(self, prompt: str, body: dict[str, Any], i: int) -> Generation:
        fmt = body.get("response_format") or {}
        regex = (body.get("structured_outputs") or {}).get("regex")
        fixed = (SCHEMA_ANSWER if fmt.get("type") == "json_schema" else OBJECT_ANSWER
                 if fmt.get("type") == "json_object" else REGEX_ANSWER if regex else None)
        if fixed is None:
            return self.toy.generate(prompt, body, i)
        if "grammar_leak" in self.plants:
            fixed = fixed[:-1] + "?"
        return Generation([ord(c) + 1000 for c in fixed], "stop", [logprobs_of(1)] * len(fixed))

    @staticmethod
    def _usage(n_prompt: int, gens: list[Generation]) -> dict[str, int]:
        done = sum(len(g.ids) for g in gens)
        return {"prompt_tokens": n_prompt, "completion_tokens": done,
                "total_tokens": n_prompt + done}

    @staticmethod
    def text_of(ids: list[int]) -> str:
        return "".join(chr(t - 1000) if t >= 1000 else VOCAB[t] for t in ids)

    def _logprobs(self, body: dict[str, Any], g: Generation, ids: list[int], offset: int,
                  chat: bool) -> Any:
        if not wants_logprobs(body):
            return None
        k = int(body.get("top_logprobs") or 0) if chat else int(body["logprobs"])
        entries = []
        for j, t in enumerate(ids):
            row = g.top[offset + j] if offset + j < len(g.top) else logprobs_of(1)
            lp = row[t] if t < len(row) else 0.0
            if "drop_logprob" in self.plants and offset + j == 1:
                lp = None
            skip = 1 if "top_shifted" in self.plants else 0
            best = sorted(range(len(row)), key=lambda i: -row[i])[skip:k + skip]
            entries.append((self.text_of([t]), lp, {VOCAB[i]: row[i] for i in best}))
        if chat:
            return {"content": [{"token": tok, "logprob": lp, "top_logprobs": [
                {"token": a, "logprob": v} for a, v in top.items()]}
                for tok, lp, top in entries]}
        return {"tokens": [e[0] for e in entries], "token_logprobs": [e[1] for e in entries],
                "top_logprobs": [e[2] for e in entries]}

    def _choice(self, body: dict[str, Any], g: Generation, i: int, chat: bool,
                ids: list[int], final: bool, offset: int = 0,
                text: str | None = None) -> dict[str, Any]:
        if text is None:
            text = self.text_of(ids)
        finish = g.finish if final else None
        c: dict[str, Any] = {"index": i, "finish_reason": finish,
                             "logprobs": self._logprobs(body, g, ids, offset, chat)}
        if chat:
            c["delta" if body.get("stream") else "message"] = {"role": "assistant",
                                                               "content": text}
        else:
            c["text"] = text
        if body.get("return_token_ids"):
            c["token_ids"] = ids
        return c

    def _events(self, body: dict[str, Any], gens: list[Generation], chat: bool,
                n_prompt: int) -> Iterator[dict[str, Any]]:
        for i, g in enumerate(gens):
            sent = ""
            offset = 0
            pieces = list(runs(g.ids, self.run))
            for piece in pieces:
                full = self.text_of(g.ids[:offset + len(piece)])
                for part in self._split(full[len(sent):]):
                    yield {"choices": [self._choice(body, g, i, chat, piece, False, offset,
                                                    part)]}
                sent = full
                offset += len(piece)
            if pieces:
                fin = self._choice(body, g, i, chat, [], False, offset, "")
                fin["finish_reason"] = None if "finish_missing" in self.plants else g.finish
                fin["logprobs"] = None
                yield {"choices": [fin]}
            if not pieces:
                fin = self._choice(body, g, i, chat, [], False, 0, "")
                fin["finish_reason"] = None if "finish_missing" in self.plants else g.finish
                yield {"choices": [fin]}
        usage = self._usage(n_prompt, gens)
        if "usage_off" in self.plants:
            usage["completion_tokens"] += 1
        yield {"choices": [], "usage": usage}

    def _split(self, text: str) -> list[str]:
        """One chunk's text, or (split_char) multi-byte characters cut and decoded alone."""
        if "split_char" not in self.plants or all(len(c.encode()) == 1 for c in text):
            return [text]
        raw = text.encode()
        i = next(k for k, b in enumerate(raw) if b >= 0x80) + 1
        return [raw[:i].decode("utf-8", "replace"), raw[i:].decode("utf-8", "replace")]
