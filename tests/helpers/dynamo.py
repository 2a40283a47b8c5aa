"""Tiny engines of every method and a small OpenAI HTTP client (stdlib) for the tests that run
NVIDIA Dynamo's frontend in front of specserve workers (tests/frontends/test_dynamo_*.py)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.helpers.server import make_tiny_engine
from tests.helpers.tiny import TinyCheckpoint


def make_eagle3_engine(ckpt: TinyCheckpoint, out: Path, seed: int = 5) -> Path:
    """A torch EAGLE-3 engine whose head is random (drafts mostly rejected: greedy output must
    still equal the target's)."""
    if out.exists():
        return out
    import torch

    from specserve.build.builder import build_engine
    from specserve.build.config import BuildConfig
    from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head
    from specserve.runtime.eagle3_dir import save_eagle3
    from specserve.runtime.model_config import ModelConfig

    cfg = ModelConfig.from_hf(json.loads((ckpt.target / "config.json").read_text()))
    head = Eagle3Head(Eagle3Config.for_target(cfg, cfg.vocab_size))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    head_dir = save_eagle3(head, out.parent / f"{out.name}-head")
    build_engine(BuildConfig(model=str(ckpt.target), out=str(out), spec_mode="eagle3",
                             backend="torch", dtype="float32", max_batch_size=8,
                             eagle3=str(head_dir)))
    return out


def method_engines(ckpt: TinyCheckpoint, root: Path) -> dict[str, Path]:
    """method -> tiny torch engine: draft (an independent random draft: some drafts rejected),
    draft-accept-all (draft = target), n-gram, Medusa, EAGLE-3."""
    return {
        "draft": make_tiny_engine(ckpt, root / "engine-draft", "draft"),
        "draft-all": make_tiny_engine(ckpt, root / "engine-draft-all", "draft", True),
        "ngram": make_tiny_engine(ckpt, root / "engine-ngram", "ngram"),
        "medusa": make_tiny_engine(ckpt, root / "engine-medusa", "medusa"),
        "eagle3": make_eagle3_engine(ckpt, root / "engine-eagle3"),
    }


def post(url: str, path: str, body: dict[str, Any], timeout: float = 120.0
         ) -> tuple[int, dict[str, Any]]:
    """POST JSON; (status, parsed body)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def stream(url: str, path: str, body: dict[str, Any], timeout: float = 120.0
           ) -> tuple[int, list[dict[str, Any]]]:
    """POST with ``stream: true``; (status, the SSE ``data:`` objects before ``[DONE]``), or
    (status, [error body]) when the server refuses it."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return r.status, [json.loads(r.read() or b"{}")]
        events = []
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            events.append(json.loads(data))
        return r.status, events
    finally:
        conn.close()


def streamed_text(events: list[dict[str, Any]], chat: bool = False) -> str:
    """The text of a stream's deltas (completions ``text``, chat ``delta.content``)."""
    out = []
    for e in events:
        for c in e.get("choices", []):
            out.append((c.get("delta", {}).get("content") if chat else c.get("text")) or "")
    return "".join(out)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc: parent links)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(p)
    return out


def dynamo_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("dynamo") is not None and os.name == "posix"


def json_from(proc: subprocess.Popen[str], timeout_s: float = 180.0) -> dict[str, Any]:
    """The JSON object the command prints once ready (read line by line until it parses)."""
    assert proc.stdout is not None
    text, deadline = "", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"serve exited ({proc.wait()}): {err}")
        text += line
        try:
            return dict(json.loads(text))
        except ValueError:
            continue
    pytest.fail("serve printed no JSON")
