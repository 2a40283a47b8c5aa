"""Prompt sources for ``specserve bench``: dataset files and the built-in, categorised sets.

Files (``--dataset FILE``; the format is told by the first character: ``[`` ShareGPT JSON, else
JSONL):

- **JSONL**, one JSON object per line (blank lines skipped): ``prompt`` (or ``text_input`` /
  ``text``: AIPerf's ``single_turn`` records, ``{"text": ..., "output_length": N}``, so one file
  feeds both clients), or ``messages`` (a chat history ``[{"role", "content"}, ...]`` sent as one
  request), or ``turns`` (a multi-turn conversation: the user turns, strings or
  ``{"text": ...}`` objects as AIPerf's ``multi_turn`` records have them); optionally
  ``category`` (a string: reports split every figure by it) and ``max_tokens`` (or
  ``output_length``). Sampling fields (``temperature`` ...) are refused: they are set per run.
- **ShareGPT JSON** (the layout of ``ShareGPT_V3_unfiltered_cleaned_split.json`` that vLLM's
  ``benchmarks/benchmark_dataset.py`` and SGLang's ``bench_serving`` read): an array of
  ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}``. One human turn
  is one prompt; several are a multi-turn conversation. The recorded ``gpt`` replies are not
  replayed: each turn resends the conversation so far with the *model's own* replies appended
  (:func:`conversation_text`), as a real chat client does.

Every error is one line naming the file and the line (ShareGPT: the entry and its line).

Built-in sets (``--prompts NAME``), made from what ships with the running interpreter, the same
for the same seed and Python version; the registry :data:`BUILTIN` holds one entry per set, so a
new set is one :class:`BuiltinSet`:

- ``builtin-code`` (category ``code``): a function's signature and first body lines, cut from the
  standard library's source (code completion is where Medusa / n-gram drafting pays most; cf.
  the Medusa paper's and Prompt Lookup Decoding's code benchmarks).
- ``builtin-prose`` (``prose``): the opening words of English paragraphs of the standard
  library's docstrings (module, class and function documentation written as prose: no doctest,
  few symbols).
- ``builtin-json`` (``structured``): JSON arrays of records generated from a seeded generator
  (ids, names, flags, tags, scores), cut inside the next record.
- ``builtin-chat`` (``multi-turn``): two- and three-turn conversations about a stdlib function
  (explain it, then follow-ups from a fixed list).
- ``builtin-mix``: the four above in turn (code, prose, structured, multi-turn, code, ...).

Categories follow SPEED-Bench's point (arXiv 2604.09557) that acceptance differs about 2x between
categories (coding easy, writing hard), so one pooled number misleads (``docs/benchmarks.md``,
"Workloads").
"""

from __future__ import annotations

import ast
import functools
import json
import random
import re
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.errors import SpecserveError

BUILTIN_SOURCES = (
    "textwrap.py", "json/encoder.py", "json/decoder.py", "csv.py", "heapq.py", "bisect.py",
    "fractions.py", "statistics.py", "shlex.py", "string.py", "calendar.py", "difflib.py",
    "functools.py", "colorsys.py", "base64.py", "glob.py", "fnmatch.py", "posixpath.py",
)
PROSE_SOURCES = (
    "argparse.py", "logging/__init__.py", "subprocess.py", "threading.py", "tarfile.py",
    "zipfile/__init__.py", "email/message.py", "http/client.py", "urllib/request.py",
    "unittest/case.py", "asyncio/events.py", "pickle.py", "shutil.py", "tempfile.py",
    "random.py", "decimal.py", "_pydecimal.py", "typing.py", "dataclasses.py", "inspect.py",
    "configparser.py", "optparse.py", "gettext.py", "locale.py", "smtplib.py", "ftplib.py",
)
UNCATEGORIZED = "uncategorized"
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop", "n", "logprobs")
_TEXT_KEYS = ("prompt", "text_input", "text")
_ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                   "assistant": "assistant", "bing": "assistant", "bard": "assistant",
                   "system": "system"}


@dataclass(frozen=True)
class Prompt:
    """One request, or one conversation.

    ``text``: what a text endpoint is sent (for ``messages``, the history rendered by
    :func:`conversation_text`; for ``turns``, the first turn). ``max_tokens`` overrides the run's
    ``--max-tokens`` when set. ``messages``: (role, content) pairs of a chat history sent as one
    request. ``turns``: the user turns of a multi-turn conversation (empty: a single request)."""

    text: str
    max_tokens: int | None = None
    category: str = UNCATEGORIZED
    messages: tuple[tuple[str, str], ...] = ()
    turns: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSONL record that :func:`load_jsonl` reads back as this prompt."""
        d: dict[str, Any] = ({"turns": list(self.turns)} if self.turns else
                             {"messages": [{"role": r, "content": c} for r, c in self.messages]}
                             if self.messages else {"prompt": self.text})
        d["category"] = self.category
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        return d


def conversation_text(messages: tuple[tuple[str, str], ...] | list[tuple[str, str]],
                      open_reply: bool = True) -> str:
    """A chat history as plain text for completion endpoints (Triton ``text_input``, OpenAI
    ``/v1/completions``): ``User: ...`` / ``Assistant: ...`` blocks, ending with an open
    ``Assistant:`` for the model to answer. The chat endpoint is sent the messages themselves."""
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    text = "\n\n".join(f"{names[r]}: {c}" for r, c in messages)
    return text + "\n\nAssistant:" if open_reply else text


# ------------------------------------------------------------------------------------ files


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
    for i, line in enumerate(text.splitlines(), 1):
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
    if kinds == ["messages"]:
        msgs = _messages(obj["messages"], where)
        return Prompt(conversation_text(msgs), max_tokens, category, messages=msgs)
    if kinds == ["turns"]:
        turns = _turns(obj["turns"], where)
        return Prompt(turns[0], max_tokens, category, turns=turns)
    if key is None:
        raise SpecserveError(f"{where}: missing 'prompt' (or 'text_input'/'text', 'messages', "
                             "'turns')")
    return Prompt(_nonempty(obj[key], f"{where}: '{key}'"), max_tokens, category)


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


# ------------------------------------------------------------------------------- built-ins


def _stdlib_sources(names: tuple[str, ...]) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / n).read_text(encoding="utf-8") for n in names if (stdlib / n).is_file()]


def _draw(pool: list[Any], n: int, seed: int, what: str) -> list[Any]:
    if not pool:
        raise SpecserveError(f"{sysconfig.get_paths()['stdlib']}: no stdlib sources found for "
                             f"--prompts {what}")
    rng = random.Random(seed)
    if n <= len(pool):
        return rng.sample(pool, n)
    return [rng.choice(pool) for _ in range(n)]


def builtin_code_prompts(n: int, seed: int = 0, body_lines: int = 3) -> list[Prompt]:
    """``n`` code-completion prompts from the stdlib, the same for the same seed and Python."""
    pool = list(_code_pool(body_lines))
    return [Prompt(t, category="code") for t in _draw(pool, n, seed, "builtin-code")]


@functools.lru_cache(maxsize=4)
def _code_pool(body_lines: int) -> tuple[str, ...]:
    """The sorted function heads of BUILTIN_SOURCES (parsed once per process)."""
    return tuple(sorted({h for src in _stdlib_sources(BUILTIN_SOURCES)
                         for h in _function_heads(src, body_lines)}))


def _function_heads(source: str, body_lines: int) -> list[str]:
    """Signature plus the first ``body_lines`` lines of every short-enough function."""
    lines = source.splitlines()
    heads = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
            start = node.lineno - 1
            body_start = node.body[0].lineno - 1
            stop = min(body_start + body_lines, node.end_lineno)
            chunk = lines[start:stop]
            indent = len(chunk[0]) - len(chunk[0].lstrip())
            text = "\n".join(line[indent:] for line in chunk) + "\n"
            if 40 <= len(text) <= 400:
                heads.append(text)
    return sorted(set(heads))


_PROSE_OK = re.compile(r"^[A-Za-z][A-Za-z0-9 ,.;:'()\-\n]*$")


def prose_paragraphs(source: str, min_words: int = 24) -> list[str]:
    """English paragraphs of a module's docstrings: at least ``min_words`` words, letters and
    punctuation only (no doctest, code, tables or lists)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
            continue
        doc = ast.get_docstring(node)
        for para in (doc or "").split("\n\n"):
            words = para.split()
            if len(words) >= min_words and _PROSE_OK.match(para.strip()):
                out.append(" ".join(words))
    return out


def builtin_prose_prompts(n: int, seed: int = 0, words: int = 28) -> list[Prompt]:
    """``n`` prose prompts: the first ``words`` words of stdlib docstring paragraphs."""
    pool = list(_prose_pool(words))
    return [Prompt(t, category="prose") for t in _draw(pool, n, seed, "builtin-prose")]


@functools.lru_cache(maxsize=4)
def _prose_pool(words: int) -> tuple[str, ...]:
    """The sorted paragraph openings of PROSE_SOURCES (parsed once per process)."""
    return tuple(sorted({" ".join(p.split()[:words]) for src in _stdlib_sources(PROSE_SOURCES)
                         for p in prose_paragraphs(src)}))


_NAMES = ("ada", "alan", "barbara", "claude", "dennis", "edsger", "frances", "grace", "guido",
          "john", "ken", "linus", "margaret", "niklaus", "radia", "tim", "tony", "barbara")
_TAGS = ("alpha", "beta", "stable", "internal", "public", "legacy", "gpu", "cpu", "edge")


def json_record(rng: random.Random, i: int) -> dict[str, Any]:
    """One generated record (pure given the generator's state)."""
    name = rng.choice(_NAMES)
    return {"id": i, "name": name.title(), "active": rng.random() < 0.7,
            "tags": rng.sample(_TAGS, rng.randint(1, 3)),
            "score": round(rng.random(), 3)}


def builtin_json_prompts(n: int, seed: int = 0, records: int = 2) -> list[Prompt]:
    """``n`` structured-data prompts: a JSON array of ``records`` generated records and the
    opening of the next one (``{"id": N, "name": ``), to be continued by the model."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randint(1, 900)
        recs = [json.dumps(json_record(rng, start + i)) for i in range(records)]
        text = "[\n  " + ",\n  ".join(recs) + f',\n  {{"id": {start + records}, "name": '
        out.append(Prompt(text, category="structured"))
    return out


FOLLOW_UPS = ("Rewrite it with type hints.", "Now add a docstring.",
              "What would break if the input were empty?", "Write a unit test for it.",
              "Make it shorter.", "Explain the edge cases.")


def builtin_chat_prompts(n: int, seed: int = 0) -> list[Prompt]:
    """``n`` multi-turn conversations: "What does this function do?" on a stdlib function head,
    then one or two follow-ups."""
    rng = random.Random(seed)
    heads = builtin_code_prompts(n, seed)
    out = []
    for h in heads:
        follow = tuple(rng.sample(FOLLOW_UPS, rng.randint(1, 2)))
        first = f"What does this function do?\n\n{h.text}"
        out.append(Prompt(first, category="multi-turn", turns=(first, *follow)))
    return out


@dataclass(frozen=True)
class BuiltinSet:
    """One built-in prompt set: ``make(n, seed)`` and where its text comes from."""

    name: str
    category: str
    make: Callable[[int, int], list[Prompt]]
    provenance: str


def builtin_mix_prompts(n: int, seed: int = 0) -> list[Prompt]:
    """The categorised sets in turn: code, prose, structured, multi-turn, code, ..."""
    parts = [s for s in BUILTIN.values() if s.category != "mixed"]
    per = [s.make(-(-n // len(parts)), seed) for s in parts]
    return [per[i % len(parts)][i // len(parts)] for i in range(n)]


BUILTIN: dict[str, BuiltinSet] = {s.name: s for s in (
    BuiltinSet("builtin-code", "code", builtin_code_prompts,
               f"function heads of the running Python's stdlib ({', '.join(BUILTIN_SOURCES)})"),
    BuiltinSet("builtin-prose", "prose", builtin_prose_prompts,
               "opening words of prose paragraphs of stdlib docstrings "
               f"({', '.join(PROSE_SOURCES)})"),
    BuiltinSet("builtin-json", "structured", builtin_json_prompts,
               "JSON arrays of records from a seeded generator (specserve.client.datasets."
               "json_record)"),
    BuiltinSet("builtin-chat", "multi-turn", builtin_chat_prompts,
               "stdlib function heads with 'What does this function do?' and 1-2 follow-ups "
               "(FOLLOW_UPS)"),
    BuiltinSet("builtin-mix", "mixed", builtin_mix_prompts,
               "the four sets above in turn"),
)}
BUILTIN_SETS = tuple(BUILTIN)


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
