"""Corral's packages form layers: each imports only from the layers below it, and no modules
import each other in a cycle. Imports inside functions count (they are how cycles hide);
imports under ``if TYPE_CHECKING:`` do not (they never run).

    layer 0  corral.base                   paths, lazy exports, worker processes, heap
    layer 1  corral.grammar, corral.mask_kernels
    layer 2  corral.schema_cache
    layer 3  corral.engine, corral.fuzz
    layer 4  corral.api
    layer 5  corral.fleet
    layer 6  corral (the CLI: corral.cli*, corral.warming)

``corral`` itself (``corral/__init__.py``) holds only ``__version__`` and imports nothing, so
any layer may read it.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "corral.base": 0,
    "corral.grammar": 1,
    "corral.mask_kernels": 1,
    "corral.schema_cache": 2,
    "corral.engine": 3,
    "corral.fuzz": 3,
    "corral.api": 4,
    "corral.fleet": 5,
    "corral.cli": 6,
}


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """``{top package: folder}`` as ``pyproject.toml`` maps them, with ``corral`` itself."""
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: root / folder for name, folder in tool["package-dir"].items()}
    return {"corral": root / "corral", **dirs}


def modules(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name and file; sub-packages of a mapped folder included."""
    found = {}
    for package, folder in dirs.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            if package == "corral" and parts and any(f"corral.{parts[0]}" == p for p in dirs):
                continue  # a mapped package that also has a folder of that name under corral/
            found[".".join([package, *parts])] = path
    return found


def layer_of(module: str) -> int | None:
    """The layer of a module; None for ``corral`` itself (readable from anywhere)."""
    if module == "corral":
        return None
    for package, layer in LAYERS.items():
        if module == package or module.startswith(package + "."):
            return layer
    return LAYERS["corral.cli"]  # the CLI's other modules under corral/ (corral.warming, ...)


def owner(module: str) -> str:
    """The top package a module belongs to (``corral.cli`` for the CLI's modules)."""
    for package in LAYERS:
        if module == package or module.startswith(package + "."):
            return package
    return "corral" if module == "corral" else "corral.cli"


def _runtime_nodes(tree: ast.AST):
    """Every node except what sits under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The Corral modules ``name`` imports at run time (module level or inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            if not base.startswith("corral"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(package_dirs(root))
    return {name: imports(name, path, known) for name, path in known.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a module in a layer not below the importer's (another package of the same
    layer counts too)."""
    bad = []
    for src, targets in edges.items():
        for dst in sorted(targets):
            if owner(src) == owner(dst) or layer_of(dst) is None:
                continue
            if layer_of(dst) >= layer_of(src):
                bad.append(f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_every_package_imports_only_from_the_layers_below_it():
    edges = graph()
    assert len(edges) > 150
    assert {"corral.base.paths", "corral.grammar.core.spec", "corral.engine.serving.engine"} <= set(
        edges
    )
    assert upward_imports(edges) == []


def test_no_modules_import_each_other_in_a_cycle():
    assert cycles(graph()) == []


def test_the_cli_package_root_imports_nothing():
    tree = ast.parse((ROOT / "corral" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "corral.base" = "base", "corral.grammar" = "grammar",'
        ' "corral.engine" = "engine" }\n'
    )
    for rel, text in {"corral/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "base/__init__.py": "",
            "base/paths.py": "def f():\n    from corral.engine.core import X\n",
            "grammar/__init__.py": "",
            "grammar/core/__init__.py": "",
            "grammar/core/spec.py": "from corral.base.paths import f\n",
            "engine/__init__.py": "",
            "engine/core.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from corral.cli import main\n"
                "from corral.grammar.core import spec\nX = 1\n"
            ),
        },
    )
    edges = graph(root)
    assert edges["corral.grammar.core.spec"] == {"corral.base.paths"}
    assert edges["corral.engine.core"] == {"corral.grammar.core.spec"}  # TYPE_CHECKING skipped
    assert upward_imports(edges) == [
        "corral.base.paths (layer 0) imports corral.engine.core (layer 3)"
    ]
    assert cycles(edges) == [
        ["corral.base.paths", "corral.engine.core", "corral.grammar.core.spec"]
    ]


def test_a_cycle_within_one_package_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/a.py": "from corral.engine import b\n",
            "engine/b.py": "def g():\n    from . import a\n",
            "engine/c.py": "from corral.engine.a import thing\n",
        },
    )
    edges = graph(root)
    assert upward_imports(edges) == []
    assert cycles(edges) == [["corral.engine.a", "corral.engine.b"]]
    groups = defaultdict(list)
    for src, dst in edges.items():
        groups[len(dst)].append(src)
    assert sorted(groups[1]) == ["corral.engine.a", "corral.engine.b", "corral.engine.c"]


#: Third-party packages only the grammar layer may import: the engine and the API see matchers
#: and the grammar layer's batch fill (``corral.grammar.MaskBatchFiller``), never a backend.
GRAMMAR_BACKENDS = ("llguidance", "xgrammar")
#: The packages that must not import them.
BACKEND_FREE = ("corral.engine", "corral.api")


def backend_imports(root: Path = ROOT) -> list[str]:
    """Every import of a grammar backend in a module of ``BACKEND_FREE``: module level, inside
    functions, under ``if TYPE_CHECKING:``, or by name (``importlib.import_module``)."""

    def backend(name: str) -> bool:
        return any(name == b or name.startswith(b + ".") for b in GRAMMAR_BACKENDS)

    found = []
    for name, path in sorted(modules(package_dirs(root)).items()):
        if owner(name) not in BACKEND_FREE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and node.args:  # import_module("x"), __import__("x")
                func = ast.unparse(node.func)
                arg = node.args[0]
                literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                dynamic = func.endswith("import_module") or func == "__import__"
                names = [arg.value] if literal and dynamic else []
            else:
                continue
            found += [f"{name}:{node.lineno} imports {n}" for n in names if backend(n)]
    return found


def test_the_engine_and_the_api_never_import_a_grammar_backend():
    assert backend_imports() == []


def test_a_backend_import_inside_a_function_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/a.py": "def f():\n    import llguidance.torch as t\n",
            "engine/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from xgrammar import G\n"
            ),
            "engine/c.py": "import importlib\nm = importlib.import_module('xgrammar')\n",
            "engine/d.py": "import llguidance_extra\nfrom corral.grammar import MaskBatchFiller\n",
            "grammar/__init__.py": "import llguidance\n",  # the grammar layer may
        },
    )
    assert backend_imports(root) == [
        "corral.engine.a:2 imports llguidance.torch",
        "corral.engine.b:3 imports xgrammar",
        "corral.engine.c:2 imports xgrammar",
    ]
