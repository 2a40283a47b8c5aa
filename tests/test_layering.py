"""Package layering (docs/architecture.md, "Packages and who depends on whom"): the library
never imports the CLI, ``build`` and ``runtime`` never import each other, no parts of the package
import each other (directly or round a longer loop), the neutral modules stay free of torch at
import time, and nothing in the product imports or ships test-only code (checked on the source
and on the built wheel)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "specserve"
FORBIDDEN = {("build", "runtime"), ("runtime", "build")} | {
    (pkg, "cli") for pkg in ("build", "runtime", "spec", "triton", "client", "train")}


def _node(module: str) -> str:
    """``specserve.build.x`` -> ``build``; ``specserve.checkpoint`` -> ``checkpoint.py``."""
    parts = module.split(".")
    if parts[0] != "specserve" or len(parts) == 1:
        return "specserve"
    if (ROOT / parts[1]).is_dir():
        return parts[1]
    return f"{parts[1]}.py" if (ROOT / f"{parts[1]}.py").is_file() else "specserve"


def import_graph() -> dict[str, set[tuple[str, str]]]:
    """node -> {(imported node, importing file)} over every import in specserve/ (lazy ones
    inside functions included), edges between different nodes only."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT.parent)
        src = _node(".".join(rel.with_suffix("").parts).removesuffix(".__init__"))
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                targets = [n.module] if n.module != "specserve" else [
                    f"specserve.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            else:
                continue
            for t in targets:
                dst = _node(t) if t.startswith("specserve") else None
                if dst is not None and dst != src:
                    edges[src].add((dst, str(rel)))
    return edges


def test_no_forbidden_edges_and_no_mutual_imports() -> None:
    edges = import_graph()
    assert "build" in edges and "runtime" in edges  # the scan found the packages
    bad = [f"{src} -> {dst} ({f})" for src, out in edges.items() for dst, f in out
           if (src, dst) in FORBIDDEN]
    bad += [f"{src} <-> {dst} ({f})" for src, out in edges.items() for dst, f in out
            if any(back == src for back, _ in edges.get(dst, ()))]
    assert not bad, "layering violations:\n" + "\n".join(sorted(bad))


def test_neutral_modules_and_cli_do_not_import_torch() -> None:
    code = ("import sys, pkgutil, importlib, specserve.cli\n"
            "for m in pkgutil.iter_modules(specserve.cli.__path__):\n"
            "    importlib.import_module('specserve.cli.' + m.name)\n"
            "import specserve.checkpoint, specserve.engine_record, specserve.versions\n"
            "import specserve.build.validate, specserve.build.record, specserve.build.uptodate\n"
            "import specserve.triton.repository, specserve.triton.params\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent)
    assert out.stdout.strip() == "False", out.stderr


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a node list, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [node, nxt] if nxt in stack else [node, nxt]
            if nxt not in state and (found := visit(nxt, stack + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_find_cycle_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_of_any_length() -> None:
    graph = {src: {dst for dst, _ in out} for src, out in import_graph().items()}
    graph.pop("specserve", None)  # specserve/__init__.py (__version__) is below everything
    for out in graph.values():
        out.discard("specserve")
    assert find_cycle(graph) is None, find_cycle(graph)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module, lazy ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def test_product_imports_no_test_code() -> None:
    assert not (ROOT / "testing").exists()
    bad = [f"{f.relative_to(ROOT)}:{line} {mod}" for f in ROOT.rglob("*.py")
           for line, mod in _imports(f)
           if mod.split(".")[0] == "tests" or mod.startswith("specserve.testing")]
    assert not bad, bad


def test_wheel_ships_no_test_code(tmp_path: Path) -> None:
    """Built from a copy of the project's files (a test must not write into the checkout);
    tests/ is copied too, so a packaging rule that picked it up would show."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT.parent / name, src / name)
    for name in ("specserve", "tests"):
        shutil.copytree(ROOT.parent / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")], check=True,
                   capture_output=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("specserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n == "specserve/runtime/decoder.py" for n in names)
    outside = [n for n in names if not n.startswith(("specserve/", "specserve-"))]
    assert not outside, outside
    test_only = [n for n in names if "/testing/" in n or n.startswith("tests/")
                 or Path(n).name in {"tiny.py", "negative_control.py", "soak.py",
                                     "trivial_repo.py", "conftest.py"}]
    assert not test_only, test_only
