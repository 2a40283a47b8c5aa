"""Prompt sources for ``specserve bench``.

- ``--dataset FILE.jsonl``: one JSON object per line with ``prompt`` (or ``text_input`` /
  ``text``) and optionally ``max_tokens`` (or ``output_length``: AIPerf's ``single_turn``
  records, ``{"text": ..., "output_length": N}``, so one file feeds both clients); blank lines
  are skipped; anything else is an error naming the file and line.
- ``--prompts builtin-code``: short code-completion prompts (a function's signature and the first
  lines of its body) cut from the Python standard library of the running interpreter, chosen
  deterministically for a seed (code completion is the traffic where Medusa/n-gram drafting
  pays most; cf. the Medusa paper's and Prompt Lookup Decoding's code benchmarks).
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specserve.errors import SpecserveError

BUILTIN_SOURCES = (
    "textwrap.py", "json/encoder.py", "json/decoder.py", "csv.py", "heapq.py", "bisect.py",
    "fractions.py", "statistics.py", "shlex.py", "string.py", "calendar.py", "difflib.py",
    "functools.py", "colorsys.py", "base64.py", "glob.py", "fnmatch.py", "posixpath.py",
)
BUILTIN_SETS = ("builtin-code",)


@dataclass(frozen=True)
class Prompt:
    """One prompt; ``max_tokens`` overrides the run's ``--max-tokens`` when set."""

    text: str
    max_tokens: int | None = None


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Read prompts from a JSONL file; raise SpecserveError naming the bad line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as e:
        raise SpecserveError(f"{p}: not found") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SpecserveError(f"{p}: cannot read ({e})") from e
    prompts = [_parse_line(p, i, line) for i, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise SpecserveError(f"{p}: no prompts (expected one JSON object per line)")
    return prompts


def _parse_line(p: Path, lineno: int, line: str) -> Prompt:
    where = f"{p}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise SpecserveError(f"{where}: invalid JSON ({e.msg})") from e
    if not isinstance(obj, dict):
        raise SpecserveError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    key = next((k for k in ("prompt", "text_input", "text") if k in obj), None)
    if key is None:
        raise SpecserveError(f"{where}: missing 'prompt' (or 'text_input'/'text')")
    text = obj[key]
    if not isinstance(text, str) or not text:
        raise SpecserveError(f"{where}: '{key}' must be a non-empty string")
    mkey = next((k for k in ("max_tokens", "output_length") if k in obj), "max_tokens")
    mt = obj.get(mkey)
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise SpecserveError(f"{where}: '{mkey}' must be a positive integer, got {mt!r}")
    return Prompt(text, mt)


def builtin_code_prompts(n: int, seed: int = 0, body_lines: int = 3) -> list[Prompt]:
    """``n`` code-completion prompts from the stdlib, the same for the same seed and Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    pool: list[str] = []
    for rel in BUILTIN_SOURCES:
        f = stdlib / rel
        if f.is_file():
            pool.extend(_function_heads(f.read_text(encoding="utf-8"), body_lines))
    if not pool:
        raise SpecserveError(f"{stdlib}: no stdlib sources found for --prompts builtin-code")
    rng = random.Random(seed)
    if n <= len(pool):
        return [Prompt(t) for t in rng.sample(pool, n)]
    return [Prompt(rng.choice(pool)) for _ in range(n)]


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


def load_prompts(dataset: str | None, prompts: str | None, n: int, seed: int) -> list[Prompt]:
    """The prompt list for a run: cycle a dataset, or draw from a builtin set."""
    if dataset and prompts:
        raise SpecserveError("give --dataset or --prompts, not both")
    if dataset:
        rows = load_jsonl(dataset)
        return [rows[i % len(rows)] for i in range(n)]
    name = prompts or "builtin-code"
    if name not in BUILTIN_SETS:
        raise SpecserveError(f"--prompts: unknown set '{name}' (known: {', '.join(BUILTIN_SETS)})")
    return builtin_code_prompts(n, seed)
