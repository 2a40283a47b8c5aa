"""A code-edit dataset for Predicted Outputs (OpenAI's ``prediction``): each
record asks for a function again with one small edit, and its ``prediction`` is the unedited
function, the situation Predicted Outputs are for (an editor re-sends a file it expects back
almost unchanged).

Built from the demo corpus's held-out files (``checkpoints/demo/corpus.json``: ``root`` and
``heldout_files``, the stdlib files the demo models never trained on). The demo target is a base
code LM, not an instruction follower, so the edit is asked the way a base LM continues it: the
original function, then a comment naming the edit (one argument renamed), then the edited
``def`` line, without its newline (a byte-level BPE merges a newline with the next line's
indentation, so a prompt ending in a bare newline is a token boundary the model never saw); the
model writes the body. The prediction is the original body from that newline on. Records are
JSON objects ``{"prompt", "prediction", "max_tokens", "edit", "source"}``, one per line
(:func:`write_jsonl`), the same for the same corpus and seed.
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from specserve.config import write_text_atomic
from specserve.errors import SpecserveError

MIN_CHARS, MAX_CHARS = 200, 1200  # functions of this size (the demo's 96-token outputs)
DEFAULT_MAX_TOKENS = 96


@dataclass(frozen=True)
class EditRecord:
    """One request: ``prompt`` (original function, edit comment, edited def line),
    ``prediction`` (the original body), ``max_tokens``, the ``edit`` and its ``source``."""

    prompt: str
    prediction: str
    max_tokens: int
    edit: str
    source: str

    def to_dict(self) -> dict[str, object]:
        return {"prompt": self.prompt, "prediction": self.prediction,
                "max_tokens": self.max_tokens, "edit": self.edit, "source": self.source}


def read_corpus(corpus_json: str | Path) -> tuple[Path, list[str]]:
    """(root, held-out file names) of a demo ``corpus.json``; SpecserveError naming it."""
    p = Path(corpus_json)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        root, files = Path(data["root"]), [str(f) for f in data["heldout_files"]]
    except FileNotFoundError:
        raise SpecserveError(f"{p}: not found") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecserveError(f"{p}: not a demo corpus.json (root, heldout_files): {e}") from None
    return root, files


def edit_records(sources: dict[str, str], n: int, seed: int = 0,
                 max_tokens: int = DEFAULT_MAX_TOKENS) -> list[EditRecord]:
    """Up to ``n`` records from ``sources`` (name -> Python source), chosen with ``seed``."""
    pool = [r for name in sorted(sources) for r in _records(name, sources[name], max_tokens)]
    if not pool:
        raise SpecserveError("code-edit dataset: no function with an argument to rename")
    random.Random(seed).shuffle(pool)
    return pool[:n]


def load_edit_records(corpus_json: str | Path, n: int, seed: int = 0,
                      max_tokens: int = DEFAULT_MAX_TOKENS) -> list[EditRecord]:
    """:func:`edit_records` over the held-out files of a demo ``corpus.json``."""
    return edit_records(read_heldout(corpus_json), n, seed, max_tokens)


def read_heldout(corpus_json: str | Path) -> dict[str, str]:
    """{name: source} of a demo ``corpus.json``'s held-out files, in its order (a file this
    interpreter lacks, or cannot decode, is left out: the others still serve)."""
    root, files = read_corpus(corpus_json)
    sources = {}
    for f in files:
        try:
            sources[f] = (root / f).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return sources


def write_jsonl(records: list[EditRecord], path: str | Path) -> None:
    write_text_atomic(Path(path), "".join(json.dumps(r.to_dict()) + "\n" for r in records))


def _records(name: str, source: str, max_tokens: int) -> list[EditRecord]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines, out = source.splitlines(), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
            continue
        args = [a.arg for a in node.args.args if a.arg not in ("self", "cls") and len(a.arg) > 1]
        if not args or node.body[0].lineno != node.lineno + 1:  # a one-line def header only
            continue
        start, end = node.lineno - 1, node.end_lineno
        chunk = lines[start:end]
        indent = len(chunk[0]) - len(chunk[0].lstrip())
        text = "\n".join(line[indent:] for line in chunk) + "\n"
        if not MIN_CHARS <= len(text) <= MAX_CHARS:
            continue
        old = args[0]
        new = f"{old}_value"
        header, body = text.split("\n", 1)
        edited_header = re.sub(rf"\b{re.escape(old)}\b", new, header)
        prompt = (f"{text}\n\n# the same function with argument {old!r} renamed to {new!r}\n"
                  f"{edited_header}")
        out.append(EditRecord(prompt, "\n" + body, max_tokens, f"rename {old} -> {new}",
                              f"{name}:{node.lineno}"))
    return out
