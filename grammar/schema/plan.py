"""SchemaPlan: what the JSON-Schema analysis hands the compiler (``schema_analysis``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from corral.grammar.core.errors import Unenforced
from corral.grammar.schema.patterns import python_dialect
from corral.grammar.schema.rewrite_log import Rewritten


@dataclass(frozen=True)
class SchemaPlan:
    """The analysed schema handed to the backend, and what (in lenient mode) it leaves out."""

    schema: dict | bool
    unenforced: tuple[Unenforced, ...] = ()
    #: (backend regex, the Python pattern it was translated from), for `judged_schema`
    regex_sources: tuple[tuple[str, str], ...] = ()
    #: no object may repeat a key (`distinct_keys`): `minProperties` on free keys counts on it
    distinct_keys: bool = False
    #: the keyword rewrites applied, in the order of the walk (`rewrite_log`)
    rewrites: tuple[Rewritten, ...] = ()
    #: id(analysed object node) -> (the node, its pointer in the input); see `pointer_of`
    pointers: Mapping[int, tuple[dict, str]] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False
    )

    def pointer_of(self, node: Any) -> str | None:
        """The input pointer of an object node of `schema` (None: a node the rewrites built)."""
        found = self.pointers.get(id(node))
        return found[1] if found is not None and found[0] is node else None

    def judged_schema(self) -> dict | bool:
        """`schema` with each regex back in Python's dialect, for `jsonschema` to judge.

        The backend regexes use syntax Python's `re` cannot read (`\\x{...}`); a narrowed
        `pattern` is judged by its source, so this checks the rewrites, not the narrowing."""
        return python_dialect(self.schema, dict(self.regex_sources))
