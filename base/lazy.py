"""Package attributes imported on first use, so importing a package stays cheap.

``corral.engine`` and ``corral.schema_cache`` export names whose modules load torch or the
grammar backends; ``corral cache stats`` and the API's config parsing need none of that.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps each name to the module
    (relative to ``package``) that defines it; a name is imported once, then kept."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
