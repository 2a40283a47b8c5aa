"""The built-in prompt sets of ``specserve bench --prompts NAME``, made from what ships with
the running interpreter, the same for the same seed and Python version; the registry
:data:`BUILTIN` holds one entry per set, so a new set is one :class:`BuiltinSet`:

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
categories (coding easy, writing hard), so one pooled number misleads (``docs/workloads.md``).
"""

from __future__ import annotations

import ast
import functools
import json
import random
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.client.prompt import Prompt
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
               "JSON arrays of records from a seeded generator (specserve.client.builtin_prompts."
               "json_record)"),
    BuiltinSet("builtin-chat", "multi-turn", builtin_chat_prompts,
               "stdlib function heads with 'What does this function do?' and 1-2 follow-ups "
               "(FOLLOW_UPS)"),
    BuiltinSet("builtin-mix", "mixed", builtin_mix_prompts,
               "the four sets above in turn"),
)}
BUILTIN_SETS = tuple(BUILTIN)
