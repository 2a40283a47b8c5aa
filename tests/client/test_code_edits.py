"""The code-edit set for Predicted Outputs on an instruction model
(specserve/client/code_edits.py): every kind of edit is checked by the syntax tree (the
reference edit passes, the unedited code fails, a half-made edit fails, an answer that changed
more than asked is not the reference), the set from the standard library and a HumanEval file
is deterministic with the kinds balanced, and records carry the chat request and the prediction.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from specserve.client.code_edits import (
    KINDS,
    Edit,
    answer_code,
    applicable_edits,
    build_code_edits,
    code_edits,
    edit_made,
    humaneval_functions,
    same_as_reference,
    stdlib_functions,
    write_jsonl,
)
from specserve.errors import SpecserveError

CODE = '''def scale(values, factor):
    out = []
    for v in values:
        if v * factor >= 10:
            out.append(v * factor)
    return scale(out, 1) if out else out
'''

HUMANEVAL = [
    {"task_id": "HumanEval/0", "prompt": 'from typing import List\n\n\ndef add(xs: List[int], '
     'k: int) -> List[int]:\n    """Add k to every element.\n    >>> add([1], 2)\n    [3]\n'
     '    """\n', "canonical_solution": "    out = [x + k for x in xs]\n    return out\n"},
    {"task_id": "HumanEval/1", "prompt": "def two(a):\n", "canonical_solution": "    return a\n"},
    {"task_id": "HumanEval/2", "prompt": "def helper(a):\n    return a\n\n\ndef main(b):\n    "
     '"""Uses helper."""\n', "canonical_solution": "    x = helper(b)\n    y = x * 3\n"
     "    return y\n"},
]


def _edit(kind: str) -> Edit:
    from specserve.client.code_edits import _function

    fn = _function(CODE)
    assert fn is not None
    return applicable_edits(fn)[kind]


def _fenced(code: str) -> str:
    return f"Here it is:\n\n```python\n{code}```\n\nI renamed it."


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_passes_its_reference_and_fails_the_echo(kind: str) -> None:
    (rec,) = code_edits([("test:scale", CODE)], used=Counter({k: 1 for k in KINDS if k != kind}))
    assert rec.edit.kind == kind
    assert edit_made(_fenced(rec.reference), rec.edit)
    assert same_as_reference(_fenced(rec.reference), rec)
    assert not edit_made(_fenced(rec.code), rec.edit)
    assert not edit_made(rec.prediction, rec.edit)  # the prediction is the echo
    assert not edit_made("I cannot do that.", rec.edit)


def test_half_made_edits_fail() -> None:
    # the def renamed, the recursive call not
    half = CODE.replace("def scale", "def scale_v2")
    assert not edit_made(half, _edit("rename_function"))
    assert edit_made(half.replace("return scale(", "return scale_v2("),
                     _edit("rename_function"))
    # the parameter renamed in the signature only
    param = _edit("rename_parameter")
    assert (param.old, param.new) == ("values", "values_value")
    assert not edit_made(CODE.replace("(values,", "(values_value,"), param)
    # a parameter added without its default, or with another one
    add = _edit("add_parameter")
    assert not edit_made(CODE.replace("factor)", "factor, verbose)"), add)
    assert not edit_made(CODE.replace("factor)", "factor, verbose=True)"), add)
    assert edit_made(CODE.replace("factor)", "factor, verbose=False)"), add)
    # the constant is the one asked for (10 -> 11), not any change
    const = _edit("change_constant")
    assert (const.old, const.new) == ("10", "11")
    assert not edit_made(CODE.replace(">= 10", ">= 12"), const)
    assert not edit_made(CODE.replace(">= 10", ">= 10 and v != 11"), const)  # old one kept
    assert edit_made(CODE.replace(">= 10", ">= 11"), const)
    # a docstring that is a comment is no docstring
    doc = _edit("add_docstring")
    assert not edit_made(CODE.replace("    out = []", "    # Scale.\n    out = []"), doc)


def test_an_answer_that_changed_more_is_not_the_reference() -> None:
    (rec,) = code_edits([("test:scale", CODE)])
    assert rec.edit.kind == "rename_function"
    broken = rec.reference.replace("v * factor >= 10", "v >= 10")
    assert edit_made(broken, rec.edit) and not same_as_reference(broken, rec)


def test_answer_code_takes_the_first_fence_cut_off_or_not() -> None:
    assert answer_code("a\n```python\nx = 1\n```\n```python\ny = 2\n```") == "x = 1\n"
    assert answer_code("```\nx = 1\n") == "x = 1\n"
    assert answer_code("x = 1\n") == "x = 1\n"


def test_stdlib_functions_qualify_and_spread_over_modules() -> None:
    funcs = stdlib_functions()
    assert len(funcs) >= 24
    first = [label.split(":")[1].rsplit(".", 1)[0] for label, _ in funcs[:8]]
    assert len(set(first)) == 8  # round-robin: the first eight from eight modules
    assert stdlib_functions(["no_such_module_here"]) == []


def _humaneval(path: Path) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in HUMANEVAL)
    return path


def test_humaneval_keeps_single_functions_of_enough_lines(tmp_path: Path) -> None:
    funcs = humaneval_functions(_humaneval(tmp_path / "he.jsonl.gz"))
    assert [label for label, _ in funcs] == ["humaneval:HumanEval/0"]  # too short; two defs
    assert funcs[0][1].startswith("from typing import List")


def test_the_set_is_deterministic_balanced_and_written(tmp_path: Path) -> None:
    he = _humaneval(tmp_path / "he.jsonl.gz")
    a, b = build_code_edits(he, 24), build_code_edits(he, 24)
    assert a == b and len(a) == 25
    kinds = Counter(r.edit.kind for r in a)
    assert set(kinds) == set(KINDS) and max(kinds.values()) - min(
        kinds[k] for k in KINDS if k != "add_docstring") <= 1
    for r in a:
        assert r.instruction.endswith(f"```python\n{r.code}```")
        assert "Return the full updated function." in r.instruction
        assert r.prediction == f"```python\n{r.code}```"
        assert edit_made(r.reference, r.edit) and not edit_made(r.code, r.edit)
    write_jsonl(a, tmp_path / "edits.jsonl")
    lines = (tmp_path / "edits.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 25 and first["messages"][0]["role"] == "user"
    assert first["edit"]["kind"] == a[0].edit.kind and first["max_tokens"] > 0


def test_no_function_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import specserve.client.code_edits as ce

    monkeypatch.setattr(ce, "stdlib_functions", lambda: [])
    with pytest.raises(SpecserveError, match="no qualifying function"):
        build_code_edits(None)


def test_prompts_command_writes_the_set(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from specserve.cli.main import cli

    he, out = _humaneval(tmp_path / "he.jsonl.gz"), tmp_path / "edits.jsonl"
    res = CliRunner().invoke(cli, ["prompts", "--code-edits", "--humaneval", str(he),
                                   "--per-category", "4", "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["sources"] == {"stdlib": 4, "humaneval": 1} and summary["records"] == 5
    assert len(out.read_text(encoding="utf-8").splitlines()) == 5
