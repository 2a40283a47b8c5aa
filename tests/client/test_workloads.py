"""Workloads: JSONL with prompt / messages / turns and categories, ShareGPT
JSON, bad input as one line with its line number, the built-in categorised sets, multi-turn
replay with the model's own replies, and every report split by category."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.client.builtin_prompts import BUILTIN, prose_paragraphs
from specserve.client.config import BenchmarkConfig
from specserve.client.datasets import dump_jsonl, load_dataset, load_prompts
from specserve.client.metrics import make_record
from specserve.client.prompt import Prompt, conversation_text
from specserve.client.report import build_summary, csv_rows
from specserve.client.run import run_benchmark
from specserve.client.summary import by_category, speedups
from specserve.errors import SpecserveError
from tests.helpers.openai_server import Script, ScriptedOpenAI


def _write(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def test_jsonl_prompt_messages_turns_category_and_max_tokens(tmp_path: Path) -> None:
    f = _write(tmp_path, "d.jsonl", "\n".join([
        '{"prompt": "def f(x):", "category": "code", "max_tokens": 9}',
        '{"messages": [{"role": "system", "content": "Be brief."},'
        ' {"role": "user", "content": "Hi"}], "category": "chat"}',
        '{"turns": ["Hello", {"text": "And then?"}], "category": "multi-turn",'
        ' "session_id": "s1"}',
        '{"text": "x = 1", "output_length": 7, "type": "single_turn"}']) + "\n")
    ps = load_dataset(f)
    assert ps[0] == Prompt("def f(x):", 9, "code")
    assert ps[1].messages == (("system", "Be brief."), ("user", "Hi"))
    assert ps[1].text == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    assert ps[2].turns == ("Hello", "And then?") and ps[2].category == "multi-turn"
    assert ps[3] == Prompt("x = 1", 7, "uncategorized")
    # the writer is the reader's inverse (the demo writes its prompts with it)
    g = _write(tmp_path, "round.jsonl", dump_jsonl(ps))
    assert load_dataset(g) == ps


def test_sharegpt_json_single_and_multi_turn(tmp_path: Path) -> None:
    data = [{"id": "a", "conversations": [{"from": "human", "value": "Q1"},
                                          {"from": "gpt", "value": "recorded A1"}]},
            {"id": "b", "category": "chat", "conversations": [
                {"from": "system", "value": "S"}, {"from": "human", "value": "Q1"},
                {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}]}]
    f = _write(tmp_path, "sg.json", json.dumps(data, indent=2))
    a, b = load_dataset(f)
    assert a == Prompt("Q1", None, "uncategorized")
    assert b.turns == ("Q1", "Q2") and b.category == "chat"  # recorded replies not replayed


@pytest.mark.parametrize(("text", "where", "why"), [
    ('{"prompt": "ok"}\n{"prompt": "x", "category": 5}\n', ":2:", "'category' must be a non"),
    ('{"prompt": "ok"}\n\n{"messages": "hi"}\n', ":3:", "'messages' must be a non-empty list"),
    ('{"messages": [{"role": "bot", "content": "x"}]}\n', ":1:", r"messages\[0\]"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
     ":1:", "last message must be the user's"),
    ('{"turns": []}\n', ":1:", "'turns' must be a non-empty list"),
    ('{"turns": ["a", 3]}\n', ":1:", r"turns\[1\] must be a non-empty string"),
    ('{"prompt": "a", "turns": ["b"]}\n', ":1:", "one of 'prompt', 'messages' or 'turns'"),
    ('{"prompt": "a", "temperature": 0.5}\n', ":1:", "'temperature' is not served per prompt"),
    ('{"prompt": "a", "max_tokens": "9"}\n', ":1:", "'max_tokens' must be a positive integer"),
    ('{"prompt": "ok"}\n{"prompt": "x",\n', ":2:", "invalid JSON"),
    ('[\n {"conversations": [{"from": "human", "value": "q"}]},\n {"conversations": 3}\n]',
     ":3: entry 1", "expected"),
    ('[\n {"conversations": [{"from": "human", "value": "q"}]},\n\n {"conversations": '
     '[{"from": "robot", "value": "q"}]}\n]', ":4: entry 1", r"conversations\[0\]"),
    ('[\n {"conversations": [{"from": "gpt", "value": "a"}]}\n]', ":2: entry 0", "no human"),
    ('[\n {"conversations": [{"from": "human", "value": "q"}]}\n {"x": 1}]', ":3:",
     "expected ',' or ']'"),
    ('[\n {"conversations": [{"from": "human", "value": "q"}\n', ":3:", "invalid JSON"),
    ("[]", "", "no prompts"),
    ("\n\n", "", "no prompts"),
])
def test_bad_input_is_one_line_with_the_line_number(tmp_path: Path, text: str, where: str,
                                                    why: str) -> None:
    f = _write(tmp_path, "bad.jsonl", text)
    with pytest.raises(SpecserveError, match=rf"bad\.jsonl{where}.*{why}") as e:
        load_dataset(f)
    assert "\n" not in str(e.value)


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match=r"nope\.jsonl: not found"):
        load_prompts(str(tmp_path / "nope.jsonl"), None, 3, 0)


@pytest.mark.parametrize("name", ["builtin-code", "builtin-prose", "builtin-json",
                                  "builtin-chat"])
def test_builtin_sets_are_deterministic_and_categorised(name: str) -> None:
    s = BUILTIN[name]
    a = load_prompts(None, name, 10, 0)
    assert a == load_prompts(None, name, 10, 0) and a != load_prompts(None, name, 10, 1)
    assert len(a) == 10 and {p.category for p in a} == {s.category}
    assert s.provenance
    if name == "builtin-json":   # a JSON array whose next record is open
        head = a[0].text.rsplit(",\n", 1)[0] + "]"
        assert len(json.loads(head)) == 2 and a[0].text.endswith('"name": ')
    if name == "builtin-chat":
        assert all(2 <= len(p.turns) <= 3 and p.turns[0] == p.text for p in a)
    if name == "builtin-prose":
        assert all(len(p.text.split()) >= 20 and "def " not in p.text for p in a)


def test_builtin_mix_cycles_the_categories() -> None:
    mix = load_prompts(None, "builtin-mix", 8, 0)
    assert [p.category for p in mix] == ["code", "prose", "structured", "multi-turn"] * 2


def test_prose_paragraphs_keep_prose_and_drop_code() -> None:
    src = ('"""A module.\n\nThis paragraph is written in plain English words and it goes on for '
           'long enough to count as prose for the benchmark set, twenty four words.\n\n'
           '>>> f(1)\n1\n"""\n'
           'def f(x):\n    """Short."""\n    return x\n')
    paras = prose_paragraphs(src)
    assert len(paras) == 1 and paras[0].startswith("This paragraph")


def _rec(i: int, variant: str, category: str, steps: list[int], e2e: float) -> object:
    chunks = [1, *steps]
    times = [0.01 * (j + 1) for j in range(len(chunks))]
    return make_record(index=i, variant=variant, phase="measure", model=variant, url="h:1",
                       prompt_index=i, send_time_unix_s=0.0, streaming=True,
                       chunk_times_s=times, chunk_tokens=chunks, end_s=e2e,
                       token_count_source="server", category=category)


def test_reports_split_tau_and_speedup_by_category() -> None:
    rs = [_rec(0, "spec", "code", [4, 4], 0.05), _rec(1, "spec", "code", [4, 2], 0.05),
          _rec(2, "spec", "prose", [1, 1], 0.08), _rec(3, "spec", "prose", [2, 1], 0.08),
          *[_rec(4 + i, "baseline", c, [1] * 6, 0.1) for i, c in
            enumerate(["code", "code", "prose", "prose"])]]
    cats = by_category(rs, n_boot=100)   # type: ignore[arg-type]
    assert list(cats) == ["code", "prose"]
    assert cats["code"]["variants"]["spec"]["tau"] == pytest.approx(3.5)
    assert cats["prose"]["variants"]["spec"]["tau"] == pytest.approx(1.25)
    assert cats["code"]["variants"]["baseline"]["tau"] == pytest.approx(1.0)
    assert cats["code"]["speedup"]["e2e_s"]["speedup"] == pytest.approx(2.0)
    assert cats["prose"]["speedup"]["e2e_s"]["speedup"] == pytest.approx(1.25)
    sp = speedups(rs)   # type: ignore[arg-type]
    summary = build_summary(rs, 1.0, None, sp, {"config": {"seed": 0}})  # type: ignore[arg-type]
    assert summary["categories"]["prose"]["variants"]["spec"]["tau"] == pytest.approx(1.25)
    rows = csv_rows(summary)
    tau = {(r["category"], r["variant"]): r["value"] for r in rows if r["metric"] == "tau"}
    assert tau[("code", "spec")] == pytest.approx(3.5)
    assert {r["category"] for r in rows} == {"all", "code", "prose"}


def _cfg(tmp_path: Path, url: str, **kw: object) -> BenchmarkConfig:
    base: dict[str, object] = dict(url=url, out=str(tmp_path / "out"), protocol="openai",
                                   model="demo", concurrency=2, requests=3, warmup=0,
                                   max_tokens=7, bootstrap=100, temperature=0.0)
    base.update(kw)
    return BenchmarkConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_multi_turn_resends_the_conversation_with_the_models_replies(tmp_path: Path,
                                                                     endpoint: str) -> None:
    data = tmp_path / "conv.jsonl"
    data.write_text(dump_jsonl([Prompt("Q1", category="multi-turn", turns=("Q1", "Q2", "Q3")),
                                Prompt("def f():", category="code")]))
    script = Script()
    with ScriptedOpenAI(script) as srv:
        out = run_benchmark(_cfg(tmp_path, srv.url, endpoint=endpoint, dataset=str(data),
                                 requests=2, concurrency=1), progress=False, plots=True)
    assert out.exit_code == 0
    recs = [json.loads(x) for x in (out.out / "requests.jsonl").read_text().splitlines()]
    conv = [r for r in recs if r["category"] == "multi-turn"]
    assert [r["turn"] for r in conv] == [0, 1, 2]
    bodies = [b for b in script.requests if "Q1" in json.dumps(b)]
    reply1 = conv[0]["output_text"].strip()
    if endpoint == "chat":
        assert bodies[1]["messages"] == [{"role": "user", "content": "Q1"},
                                         {"role": "assistant", "content": reply1},
                                         {"role": "user", "content": "Q2"}]
        assert len(bodies[2]["messages"]) == 5
    else:
        assert bodies[1]["prompt"] == conversation_text(
            [("user", "Q1"), ("assistant", reply1), ("user", "Q2")])
    s = out.summary
    assert set(s["categories"]) == {"code", "multi-turn"}
    assert s["categories"]["multi-turn"]["variants"]["spec"]["completed"] == 3
    readme = (out.out / "README.md").read_text()
    assert "## By category" in readme and "| multi-turn | spec | 3 |" in readme
    assert "category.png" in out.files and (out.out / "category.png").stat().st_size > 0
