"""Every ``specserve ...`` example is a command line the CLI accepts: the examples in every
command's ``--help`` (as Click prints them, so a re-wrapped line fails too) and the command lines
in README.md, docs/*.md and docs/methods/*.md (read at test time). Each line goes through the
command's own Click option parser, which runs no callbacks and checks no paths: an unknown command
or option, an option missing its value, a stray argument or a value outside a Choice fails."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from specserve.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
SHELL_ENDS = {">", ">>", "|", "||", "&&", ";", "&", "2>", "2>&1"}
FENCE = re.compile(r"^\s*(```|~~~)")
# a command line: `specserve NAME ...` or `specserve --help` (after an optional `$ ` prompt and
# environment assignments); `specserve` followed by anything else (a table row label) is not one
PROMPT = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                    r"(specserve (?:[a-z][a-z0-9-]*|-h|--help|--version)(?:\s.*)?)$")
ELISION = "..."  # a document's "the rest as above"
# an inline code span of prose that starts `specserve NAME`: a command, or a mention of one of its
# options (`specserve predict --summary`); usage syntax ([--x], A|B, <arg>, ...) is not checked
SPAN = re.compile(r"`(specserve [a-z][^`]*)`")
USAGE_SYNTAX = re.compile(r"[\[\]<>|]|\.\.\.")


class UnknownName(click.UsageError):
    """A command, or an option value outside its Choice, that the CLI does not have."""


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    return {n: c for n in names if (c := cli.get_command(ctx, n)) is not None}


def _joined(lines: list[str]) -> Iterator[str]:
    """Lines with shell continuations (a trailing backslash) joined."""
    buf = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield buf + line
        buf = ""
    if buf:
        yield buf


def examples(text: str) -> list[str]:
    """The ``specserve ...`` command lines of a help text or a document's code blocks."""
    out = []
    for line in _joined(text.splitlines()):
        m = PROMPT.match(line)
        if m:
            out.append(m.group(1).strip())
    return out


def _code_blocks(md: str) -> str:
    """The lines of a Markdown file's fenced code blocks and indented (4-space) blocks."""
    keep, inside = [], False
    for line in md.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if inside or line.startswith("    "):
            keep.append(line)
    return "\n".join(keep)


def check(line: str) -> None:
    """Parse ``line`` with the CLI's own parser; raise click.UsageError on what it refuses."""
    words = shlex.split(line, comments=True)
    words = [w for w in words if w != ELISION]
    for i, w in enumerate(words):
        if w in SHELL_ENDS:
            words = words[:i]
            break
    assert words[0] == "specserve", line
    if len(words) == 1 or words[1] in ("-h", "--help", "--version"):
        return
    commands = _commands()
    if words[1] not in commands:
        raise UnknownName(f"no such command {words[1]!r}")
    cmd = commands[words[1]]
    ctx = click.Context(cmd, info_name=words[1])  # the parser alone: no callbacks run
    parser = cmd.make_parser(ctx)
    values, rest, _ = parser.parse_args(list(words[2:]))
    if len(rest) > sum(1 for p in cmd.params if isinstance(p, click.Argument)):
        raise click.UsageError(f"unexpected arguments {rest}")
    for param in cmd.params:
        value = values.get(param.name)
        if isinstance(param.type, click.Choice) and value is not None:
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if v not in param.type.choices:
                    raise UnknownName(f"{param.opts[0]} {v!r}: not one of "
                                      f"{list(param.type.choices)}")


def _help(name: str | None) -> str:
    args = ["--help"] if name is None else [name, "--help"]
    result = CliRunner().invoke(cli, args, terminal_width=100, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


HELP_CASES = [None, *sorted(_commands())]


def _source(name: str | None) -> str:
    cmd = cli if name is None else _commands()[name]
    return f"{cmd.help or ''}\n{cmd.epilog or ''}"


@pytest.mark.parametrize("name", HELP_CASES, ids=[n or "specserve" for n in HELP_CASES])
def test_help_examples_parse(name: str | None) -> None:
    text = _help(name)
    lines = examples(text)
    # Click re-wraps a paragraph not marked \b: an example written in the source must come
    # out of --help whole, on lines of its own
    printed = {" ".join(ln.split()) for ln in lines}
    known = set(_commands())
    for line in examples(_source(name)):
        if line.split()[1] not in known:  # prose that starts a line with "specserve and ..."
            continue
        assert " ".join(line.split()) in printed, \
            f"`{name or 'specserve'} --help` mangles the example {line!r}"
    if name is not None:
        assert any(f"specserve {name}" in ln for ln in lines), f"{name}: no example in --help"
    for line in lines:
        try:
            check(line)
        except click.ClickException as e:
            pytest.fail(f"`{name or 'specserve'} --help` example {line!r}: {e.format_message()}")


def test_every_command_has_a_description() -> None:
    for name in sorted(_commands()):
        text = _help(name)
        usage, _, rest = text.partition("\n\n")
        first = rest.lstrip().splitlines()[0] if rest.strip() else ""
        assert first and not first.startswith(("Options:", "Example")), \
            f"`specserve {name} --help` has no description"


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "methods").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_document_command_lines_parse(doc: Path) -> None:
    bad = []
    for line in examples(_code_blocks(doc.read_text())):
        try:
            check(line)
        except click.ClickException as e:
            bad.append(f"{line!r}: {e.format_message()}")
    assert not bad, f"{doc.name}:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_document_inline_commands_name_real_options(doc: Path) -> None:
    """Inline spans may mention an option without its value, but every command, option and
    choice they name exists."""
    bad = []
    for m in SPAN.finditer(doc.read_text()):
        line = m.group(1).replace("\\|", "|")
        if USAGE_SYNTAX.search(line):
            continue
        try:
            check(line)
        except (click.NoSuchOption, UnknownName) as e:
            bad.append(f"{line!r}: {e.format_message()}")
        except click.UsageError:  # a mention: an option without its value, a placeholder
            pass
    assert not bad, f"{doc.name}:\n" + "\n".join(bad)


@pytest.mark.parametrize("line", [
    "specserve repo --engine e --out r --gpu-",          # a re-wrapped option
    "specserve bench --url 127.0.0.1:8001 --no-such-flag",
    "specserve no-such-command --out x",
    "specserve build --model m --ngram --backend tensorrt --out e",
    "specserve predict --params 7e9 --gpu h100 device-ids",
])
def test_the_checker_refuses(line: str) -> None:
    with pytest.raises(click.ClickException):
        check(line)


def test_the_same_gpu_names_everywhere() -> None:
    for name in ("predict", "doctor"):
        (gpu,) = [p for p in _commands()[name].params if p.name == "gpu"]
        assert isinstance(gpu.type, click.Choice)
        assert {"h100", "h100-sxm", "h200", "a100", "a100-80g"} <= set(gpu.type.choices), name
    check("specserve predict --params 70e9 --gpu h100")
    check("specserve doctor --model m --draft d --gpu h100-sxm")
