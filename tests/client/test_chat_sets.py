"""The categorised chat sets (ShareGPT + HumanEval): the published rule, the held-out split, a
truncated ShareGPT file, and ``specserve prompts``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.client.chat_sets import (
    ChatSetConfig,
    categorize,
    chat_set,
    sharegpt_turns,
    split_of,
)
from specserve.client.datasets import load_dataset
from specserve.errors import SpecserveError


@pytest.mark.parametrize(("text", "want"), [
    ("stack data structure program in python", "code"),
    ("Here is my function:\n```\nx = 1\n```\nwhy does it fail?", "code"),
    ("In a room with 3 girls and 2 boys, how many are smokers?", "maths"),
    ("What is 12 * 7?", "maths"),
    ("Summarize in detail Chapter Three of the book.", "extraction"),
    ("Write me a poem about ska music", "writing"),
    ("What is the best marketing tactic for a bakery?", "qa"),
    ("could combine the best features and functionalities", None),  # no whole word matches
    ("Sent: 8/2/2018", None),  # a date is no arithmetic
])
def test_the_rule(text: str, want: str | None) -> None:
    assert categorize(text) == want


def test_split_is_a_stable_tenth() -> None:
    texts = [f"prompt number {i}" for i in range(2000)]
    held = [t for t in texts if split_of(t) == "heldout"]
    assert 150 < len(held) < 250
    assert split_of("prompt number 7") == split_of("prompt number 7")


def _sharegpt(path: Path, turns: list[str], cut: int = 0) -> Path:
    entries = [{"id": str(i), "conversations": [{"from": "human", "value": t},
                                                {"from": "gpt", "value": "ok"}]}
               for i, t in enumerate(turns)]
    text = json.dumps(entries, indent=2)
    path.write_text(text[:len(text) - cut] if cut else text)
    return path


def test_a_truncated_sharegpt_file_gives_its_complete_entries(tmp_path: Path) -> None:
    turns = [f"Write a poem about the number {i}" for i in range(5)]
    assert list(sharegpt_turns(_sharegpt(tmp_path / "a.json", turns))) == turns
    assert list(sharegpt_turns(_sharegpt(tmp_path / "b.json", turns, cut=30))) == turns[:4]
    (tmp_path / "c.json").write_text('[{"conversations": [{"from": "hu')
    with pytest.raises(SpecserveError, match="no complete entry"):
        list(sharegpt_turns(tmp_path / "c.json"))


def _humaneval(path: Path, n: int) -> Path:
    with gzip.open(path, "wt") as f:
        for i in range(n):
            prompt = f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n"
            f.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": prompt}) + "\n")
    return path


def test_chat_set_caps_categories_and_keeps_splits_apart(tmp_path: Path) -> None:
    turns = ([f"Write a story about dragon number {i}" for i in range(300)]
             + [f"What is the capital of country {i}?" for i in range(300)])
    sg = _sharegpt(tmp_path / "sg.json", turns)
    he = _humaneval(tmp_path / "he.jsonl.gz", 120)
    held = chat_set(ChatSetConfig(sg, he, "heldout", per_category=5, max_tokens=64))
    train = chat_set(ChatSetConfig(sg, he, "train", per_category=500))
    cats = [p.category for p in held]
    assert cats == ["writing"] * 5 + ["qa"] * 5 + ["humaneval"] * 5
    assert all(split_of(p.text) == "heldout" and p.max_tokens == 64 for p in held)
    assert not {p.text for p in held} & {p.text for p in train}
    assert all(p.messages == (("user", p.text),) for p in held)


def test_prompts_command_writes_a_dataset_bench_reads(tmp_path: Path) -> None:
    sg = _sharegpt(tmp_path / "sg.json", [f"Write a story about cat {i}" for i in range(200)])
    out = tmp_path / "set.jsonl"
    res = CliRunner().invoke(cli, ["prompts", "--sharegpt", str(sg), "--per-category", "3",
                                   "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["categories"] == {"writing": 3}
    rows = load_dataset(out)
    assert [r.category for r in rows] == ["writing"] * 3 and rows[0].messages
    res = CliRunner().invoke(cli, ["prompts", "--out", str(out)])
    assert res.exit_code == 2 and "give --sharegpt" in res.stderr


def test_templated_prompts_carry_the_models_own_template(tiny_ckpt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from specserve.client.chat_sets import templated
    from specserve.client.prompt import Prompt

    tok = AutoTokenizer.from_pretrained(str(tiny_ckpt.target))
    msgs = (("user", "def add(a, b):"),)
    (p,) = templated([Prompt("ignored", 5, "code", messages=msgs)], tiny_ckpt.target)
    want = tok.apply_chat_template([{"role": "user", "content": "def add(a, b):"}],
                                   add_generation_prompt=True, tokenize=False)
    assert (p.text, p.messages, p.category, p.max_tokens) == (want, (), "code", 5)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tiny_ckpt.target.iterdir():
        if f.name.startswith("tokenizer"):
            (bare / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    for extra in ("chat_template.jinja", "chat_template.json"):
        (bare / extra).unlink(missing_ok=True)
    with pytest.raises(SpecserveError, match="no chat template"):
        templated([Prompt("x", None, "qa")], bare)


def test_demo_serves_a_dataset_when_given(tmp_path: Path) -> None:
    from specserve.demo import DemoRunConfig, demo_prompts

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "category": "qa"}) + "\n"
                            for i in range(3)))
    ps = demo_prompts(DemoRunConfig(repo="r", out="o", dataset=str(data), warmup=1,
                                    requests=4))
    assert [p.text for p in ps] == ["p0", "p1", "p2", "p0", "p1"]


def test_demo_on_a_dataset_shows_the_offline_tau_without_checking_it() -> None:
    from specserve.demo import summary_lines

    fig = {"ttft_ms": {"mean": 1.0, "p50": 1.0}, "tpot_ms": {"mean": 1.0, "p50": 1.0},
           "per_user_tok_s": {"mean": 1.0},
           "acceptance": {"tau_server": 1.4, "acceptance_rate": 0.5}}
    summary = {"variants": {"spec": fig, "baseline": fig}}
    check = {"tau_eval": 1.7, "ok": None, "tolerance": 0.1, "mode": "ngram"}
    text = "\n".join(summary_lines(summary, check))
    assert "offline eval.json 1.70 (not compared: other prompts)" in text
