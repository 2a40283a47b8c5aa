"""Package layering (docs/architecture.md, "Packages and who depends on whom"): the library
never imports the CLI, ``build`` and ``runtime`` never import each other, no parts of the package
import each other (directly or round a longer loop), no two modules import each other either
(inside a package or across: the module graph has no cycle but the allowlisted ones), the neutral
modules stay free of torch at import time, and nothing in the product imports or ships test-only
code (checked on the source and on the built wheel).

Every import counts: at module level, lazy ones inside functions, and type-only ones under
``if TYPE_CHECKING:`` (an annotation is a dependency of the design too, and a lazy or type-only
import is how a cycle hides from the interpreter)."""

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
    (pkg, "cli") for pkg in ("build", "runtime", "spec", "triton", "client", "train", "doctor",
                            "watch", "frontends", "serving")} | {
    # the serving core is below its doors; one door never goes through another
    ("serving", "triton"), ("serving", "frontends"), ("frontends", "triton")}
# what the serving core must never import: the doors' runtimes
DOOR_RUNTIMES = ("tritonclient", "triton_python_backend_utils", "dynamo")
BLS_LIB = "specserve.triton.models.bls_lib"


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


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The cycles of a directed graph: its strongly connected components of more than one node
    (Tarjan 1972), each the set of nodes that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = {stack.pop()}
            while v not in comp:
                comp.add(stack.pop())
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def test_cycles_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert sorted(map(sorted, cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}))) == [
        ["a", "b"], ["c", "d"]]


def test_no_import_cycle_of_any_length() -> None:
    graph = {src: {dst for dst, _ in out} for src, out in import_graph().items()}
    graph.pop("specserve", None)  # specserve/__init__.py (__version__) is below everything
    for out in graph.values():
        out.discard("specserve")
    assert cycles(graph) == [], cycles(graph)


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports, over every ``*.py`` under the package ``root`` (every
    import: module level, inside functions, under ``if TYPE_CHECKING:``; absolute and relative;
    ``from pkg import name`` is the module ``pkg.name`` when there is one, else ``pkg``)."""
    files = {".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(
        ".__init__"): f for f in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, f in files.items():
        pkg = name if f.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # a name inside a module: that module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def test_module_cycles_are_found_in_a_planted_tree(tmp_path: Path) -> None:
    """A lazy import one way and a type-only one back is a cycle; so is a relative loop of
    three; a one-way import is none."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for rel, text in {
        "__init__.py": "", "sub/__init__.py": "",
        "a.py": "def f():\n    from pkg.b import g\n    return g\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n"
                "def g(): pass\n",
        "c.py": "import pkg.a\n",
        "sub/x.py": "from . import y\n", "sub/y.py": "from .z import h\n",
        "sub/z.py": "from ..sub import x\ndef h(): pass\n",
    }.items():
        (pkg / rel).write_text(text)
    assert sorted(map(sorted, cycles(module_graph(pkg)))) == [
        ["pkg.a", "pkg.b"], ["pkg.sub.x", "pkg.sub.y", "pkg.sub.z"]]
    (pkg / "b.py").write_text("def g(): pass\n")
    (pkg / "sub" / "z.py").write_text("def h(): pass\n")
    assert cycles(module_graph(pkg)) == []


def test_no_module_imports_itself_round_a_loop() -> None:
    found = cycles(module_graph(ROOT))
    assert "specserve.runtime.decoder" in module_graph(ROOT)   # the scan found the modules
    found_sorted = sorted(sorted(c) for c in found)
    assert not found_sorted, "module import cycles:\n" + "\n".join(
        " <-> ".join(c) for c in found_sorted)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module, lazy ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def test_doors_are_adapters_over_the_serving_core() -> None:
    """``frontends/`` imports nothing of ``triton/`` (absolute or relative, lazy or type-only);
    ``serving/`` imports neither a door nor a door's runtime; no product module outside the BLS
    model imports the BLS model's private library (``triton/models/bls_lib``)."""
    graph = module_graph(ROOT)
    assert "specserve.serving.loop" in graph and "specserve.frontends.dynamo_worker" in graph
    bad = [f"{src} -> {dst}" for src, out in graph.items() for dst in out
           if (src.startswith("specserve.frontends") and dst.startswith("specserve.triton"))
           or (src.startswith("specserve.serving") and dst.startswith(
               ("specserve.triton", "specserve.frontends")))
           or (dst.startswith(BLS_LIB) and not src.startswith(BLS_LIB)
               and src != "specserve.triton.models.bls")]
    bad += [f"{f.relative_to(ROOT)}:{line} {mod}" for f in (ROOT / "serving").rglob("*.py")
            for line, mod in _imports(f) if mod.split(".")[0] in DOOR_RUNTIMES]
    assert not bad, "door layering violations:\n" + "\n".join(sorted(bad))


def test_serving_core_tests_need_no_door() -> None:
    """tests/serving/ drives the core as a door would, without one (the door table is the one
    test there that goes through every door on purpose)."""
    tests = ROOT.parent / "tests" / "serving"
    assert (tests / "test_loop.py").is_file()
    bad = [f"{f.name}:{line} {mod}" for f in sorted(tests.glob("*.py"))
           if f.name != "test_door_features.py" for line, mod in _imports(f)
           if mod.startswith(("specserve.triton", "specserve.frontends"))
           or mod.split(".")[0] in DOOR_RUNTIMES]
    assert not bad, bad


def test_door_layering_catches_a_relative_import(tmp_path: Path) -> None:
    """The module graph resolves a relative import into ``triton/`` (``from ..triton import``),
    which the package-level scan of absolute imports would miss."""
    pkg = tmp_path / "specserve"
    for rel, text in {"__init__.py": "", "triton/__init__.py": "", "triton/llm_io.py": "",
                      "frontends/__init__.py": "",
                      "frontends/w.py": "def f():\n    from ..triton import llm_io\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert module_graph(pkg)["specserve.frontends.w"] == {"specserve.triton.llm_io"}


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
