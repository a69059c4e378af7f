"""ANALYSIS_VERSION: a digest of everything that shapes a compile, so caches never outlive it.

A compiled constraint depends on Corral's own schema analysis, rewrites, probe and backend glue
as much as on the backends and the libraries the analysis calls. The compiled-constraint cache
puts this digest into every entry's key and header, so an upgrade of any of them never serves a
grammar compiled by the old one. It covers:

* every ``.py`` file of this package, subfolders included (by path relative to the package);
* the Python implementation and version;
* the installed versions of the distributions in :data:`COMPILE_DEPENDENCIES`.

It is computed once, at import.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

#: The grammar package (this file lives in its ``core`` sub-package).
PACKAGE_DIR = Path(__file__).resolve().parents[1]

#: The distributions whose version changes what a compile produces: the two backends, the regex
#: algebra, and the judge and ``$ref`` resolver the schema analysis calls.
COMPILE_DEPENDENCIES = ("llguidance", "xgrammar", "interegular", "jsonschema", "referencing")


def source_files(folder: Path = PACKAGE_DIR) -> list[Path]:
    """The package's ``.py`` files, subfolders included, in a stable order."""
    return sorted(
        (p for p in folder.rglob("*.py") if "__pycache__" not in p.parts),
        key=lambda p: p.relative_to(folder).as_posix(),
    )


def source_digest(folder: Path = PACKAGE_DIR) -> str:
    """Hex sha256 over the relative paths and bytes of every ``.py`` file under ``folder``."""
    h = hashlib.sha256()
    for path in source_files(folder):
        data = path.read_bytes()
        h.update(f"{path.relative_to(folder).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def installed_versions(names: Iterable[str] = COMPILE_DEPENDENCIES) -> dict[str, str]:
    """``{distribution: version}`` as installed, with the Python that runs the compile."""
    versions = {"python": f"{platform.python_implementation()} {platform.python_version()}"}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def analysis_version(source: str, versions: Mapping[str, str]) -> str:
    """The cache's version stamp from a source digest and the versions that shape a compile."""
    h = hashlib.sha256(f"source\0{source}\0".encode())
    for name in sorted(versions):
        h.update(f"{name}\0{versions[name]}\0".encode())
    return h.hexdigest()


#: The stamp of the grammar package as installed (see the module docstring).
ANALYSIS_VERSION = analysis_version(source_digest(), installed_versions())
