"""Prompt sources for ``specserve bench``: dataset files and the built-in, categorised sets.

Files (``--dataset FILE``; the format is told by the first character: ``[`` ShareGPT JSON, else
JSONL):

- **JSONL**, one JSON object per line (blank lines skipped): ``prompt`` (or ``text_input`` /
  ``text``: AIPerf's ``single_turn`` records, ``{"text": ..., "output_length": N}``, so one file
  feeds both clients), or ``messages`` (a chat history ``[{"role", "content"}, ...]`` sent as one
  request), or ``turns`` (a multi-turn conversation: the user turns, strings or
  ``{"text": ...}`` objects as AIPerf's ``multi_turn`` records have them); optionally
  ``category`` (a string: reports split every figure by it), ``max_tokens`` (or
  ``output_length``) and ``prediction`` (Predicted Outputs: the expected output's text, or
  OpenAI's ``{"type": "content", "content": ...}``; not with ``turns``). Sampling fields
  (``temperature`` ...) are refused: they are set per run. Other fields are ignored (the
  records of ``specserve prompts --code-edits`` load as they are, their prediction sent).
- **ShareGPT JSON** (the layout of ``ShareGPT_V3_unfiltered_cleaned_split.json`` that vLLM's
  ``benchmarks/benchmark_dataset.py`` and SGLang's ``bench_serving`` read): an array of
  ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}``. One human turn
  is one prompt; several are a multi-turn conversation. The recorded ``gpt`` replies are not
  replayed: each turn resends the conversation so far with the *model's own* replies appended
  (:func:`conversation_text`), as a real chat client does.

Every error is one line naming the file and the line (ShareGPT: the entry and its line).

The built-in sets (``--prompts NAME``) are :mod:`specserve.client.builtin_prompts`;
:func:`load_prompts` gives a run its prompts from either.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specserve.client.builtin_prompts import BUILTIN
from specserve.client.prompt import UNCATEGORIZED, Prompt, conversation_text
from specserve.errors import SpecserveError

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop", "n", "logprobs")
_TEXT_KEYS = ("prompt", "text_input", "text")
_ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                   "assistant": "assistant", "bing": "assistant", "bard": "assistant",
                   "system": "system"}



def load_dataset(path: str | Path) -> list[Prompt]:
    """Read a JSONL or ShareGPT JSON file; raise SpecserveError naming the bad line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise SpecserveError(f"{p}: not found") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SpecserveError(f"{p}: cannot read ({e})") from e
    prompts = _sharegpt(p, text) if text.lstrip().startswith("[") else _jsonl(p, text)
    if not prompts:
        raise SpecserveError(f"{p}: no prompts (expected one JSON object per line, or a "
                             "ShareGPT JSON array)")
    return prompts


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Read prompts from a JSONL file (or a ShareGPT JSON array: :func:`load_dataset`)."""
    return load_dataset(path)


def _jsonl(p: Path, text: str) -> list[Prompt]:
    out = []
    # JSON Lines end lines at "\n" only: str.splitlines() also splits at U+2028, U+0085...,
    # which a JSON string may hold raw (dump_jsonl writes ensure_ascii=False); "\r" of CRLF
    # is JSON whitespace
    for i, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{p}:{i}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecserveError(f"{where}: invalid JSON ({e.msg})") from e
        out.append(parse_record(obj, where))
    return out


def parse_record(obj: Any, where: str) -> Prompt:
    """One JSONL record -> a :class:`Prompt` (``where``: ``file:line`` for the error)."""
    if not isinstance(obj, dict):
        raise SpecserveError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    bad = [k for k in SAMPLING_FIELDS if k in obj]
    if bad:
        raise SpecserveError(f"{where}: '{bad[0]}' is not served per prompt (set it for the "
                             "run: --temperature, --top-p, --top-k, --seed)")
    kinds = [k for k in ("messages", "turns") if k in obj]
    key = next((k for k in _TEXT_KEYS if k in obj), None)
    if len(kinds) + (key is not None) > 1:
        raise SpecserveError(f"{where}: give one of 'prompt', 'messages' or 'turns'")
    category = _category(obj, where)
    max_tokens = _max_tokens(obj, where)
    pred = _prediction(obj, where)
    if kinds == ["messages"]:
        msgs = _messages(obj["messages"], where)
        return Prompt(conversation_text(msgs), max_tokens, category, messages=msgs,
                      prediction=pred)
    if kinds == ["turns"]:
        if pred is not None:
            raise SpecserveError(f"{where}: 'prediction' is one request's, not a multi-turn "
                                 "conversation's ('turns')")
        turns = _turns(obj["turns"], where)
        return Prompt(turns[0], max_tokens, category, turns=turns)
    if key is None:
        raise SpecserveError(f"{where}: missing 'prompt' (or 'text_input'/'text', 'messages', "
                             "'turns')")
    return Prompt(_nonempty(obj[key], f"{where}: '{key}'"), max_tokens, category,
                  prediction=pred)


def _prediction(obj: dict[str, Any], where: str) -> str | None:
    """The record's ``prediction``: a non-empty string, or OpenAI's request form
    ``{"type": "content", "content": str | [{"type": "text", "text": str}, ...]}``."""
    if obj.get("prediction") is None:
        return None
    v = obj["prediction"]
    if isinstance(v, dict) and v.get("type") == "content":
        c = v.get("content")
        if isinstance(c, list) and all(isinstance(x, dict) and isinstance(x.get("text"), str)
                                       for x in c):
            c = "".join(x["text"] for x in c)
        v = c
    if not isinstance(v, str) or not v:
        raise SpecserveError(f"{where}: 'prediction' must be a non-empty string (or "
                             "{\"type\": \"content\", \"content\": ...}), got "
                             f"{obj['prediction']!r:.40}")
    return v


def _nonempty(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise SpecserveError(f"{what} must be a non-empty string, got {v!r:.40}")
    return v


def _category(obj: dict[str, Any], where: str) -> str:
    if "category" not in obj:
        return UNCATEGORIZED
    return _nonempty(obj["category"], f"{where}: 'category'").strip()


def _max_tokens(obj: dict[str, Any], where: str) -> int | None:
    mkey = next((k for k in ("max_tokens", "output_length") if k in obj), "max_tokens")
    mt = obj.get(mkey)
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise SpecserveError(f"{where}: '{mkey}' must be a positive integer, got {mt!r}")
    return mt


def _messages(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecserveError(f"{where}: 'messages' must be a non-empty list of "
                             "{\"role\", \"content\"} objects")
    out = []
    for j, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise SpecserveError(f"{where}: messages[{j}]: expected {{\"role\": one of "
                                 f"{'/'.join(_ROLES)}, \"content\": ...}}, got {m!r:.60}")
        out.append((m["role"], _nonempty(m.get("content"), f"{where}: messages[{j}].content")))
    if out[-1][0] != "user":
        raise SpecserveError(f"{where}: the last message must be the user's (the model "
                             "answers it)")
    return tuple(out)


def _turns(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecserveError(f"{where}: 'turns' must be a non-empty list of user turns")
    out = []
    for j, t in enumerate(raw):
        if isinstance(t, dict):
            t = next((t[k] for k in ("text", "prompt", "content") if k in t), None)
        out.append(_nonempty(t, f"{where}: turns[{j}]"))
    return tuple(out)


def _json_entries(p: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line, value) of each element of a top-level JSON array, decoded one by one so that an
    error names the line of the element it is in."""
    dec = json.JSONDecoder()

    def line_of(at: int) -> int:
        return text.count("\n", 0, at) + 1

    def skip(at: int) -> int:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        return at

    def end_here(at: int) -> bool:
        if at < len(text) and text[at] == "]":
            if text[at + 1:].strip():
                raise SpecserveError(f"{p}:{line_of(at + 1)}: invalid JSON (extra data after "
                                     "the array)")
            return True
        return False

    pos = skip(text.index("[") + 1)
    if end_here(pos):
        return
    while True:
        try:
            value, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise SpecserveError(f"{p}:{e.lineno}: invalid JSON ({e.msg})") from e
        yield line_of(pos), value
        pos = skip(end)
        if end_here(pos):
            return
        if pos >= len(text) or text[pos] != ",":
            raise SpecserveError(f"{p}:{line_of(pos)}: invalid JSON (expected ',' or ']')")
        pos = skip(pos + 1)


def _sharegpt(p: Path, text: str) -> list[Prompt]:
    out = []
    for k, (line, entry) in enumerate(_json_entries(p, text)):
        where = f"{p}:{line}: entry {k}"
        if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
            raise SpecserveError(f"{where}: expected {{\"conversations\": [{{\"from\", "
                                 "\"value\"}, ...]}} (ShareGPT)")
        category = _category(entry, where)
        user = []
        for j, turn in enumerate(entry["conversations"]):
            role = _SHAREGPT_ROLES.get(str(turn.get("from"))) if isinstance(turn, dict) else None
            if role is None:
                raise SpecserveError(f"{where}: conversations[{j}]: expected {{\"from\": human|"
                                     f"gpt|system, \"value\": ...}}, got {turn!r:.60}")
            value = _nonempty(turn.get("value"), f"{where}: conversations[{j}].value")
            if role == "user":
                user.append(value)
        if not user:
            raise SpecserveError(f"{where}: no human turn")
        out.append(Prompt(user[0], None, category, turns=tuple(user) if len(user) > 1 else ()))
    return out


def dump_jsonl(prompts: list[Prompt]) -> str:
    """Prompts as a JSONL dataset file (:func:`load_dataset` reads it back as they are)."""
    return "".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n" for p in prompts)


def load_prompts(dataset: str | None, prompts: str | None, n: int, seed: int) -> list[Prompt]:
    """The prompt list for a run: cycle a dataset, or draw from a builtin set."""
    if dataset and prompts:
        raise SpecserveError("give --dataset or --prompts, not both")
    if dataset:
        rows = load_dataset(dataset)
        return [rows[i % len(rows)] for i in range(n)]
    name = prompts or "builtin-code"
    if name not in BUILTIN:
        raise SpecserveError(f"--prompts: unknown set '{name}' (known: {', '.join(BUILTIN)})")
    return BUILTIN[name].make(n, seed)
