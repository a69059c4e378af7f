"""`$ref` resolution for the schema analysis.

Every reference is resolved here and its (analysed) target hoisted into the output's `$defs`
under a generated name, so the schema handed to the backend only contains `#/$defs/<name>` and
`#` references, and no `$id`/`$anchor` can change what they mean. Plain JSON-pointer
references (`#/definitions/x`) are resolved directly; documents that use `$id` below the root,
anchors or non-pointer references go through `referencing` (the library `jsonschema` uses), which
costs a crawl of the document, so it is only set up when needed.

Copies: none; `resolve` returns the referenced node of the document itself, which callers only
read.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import referencing
import referencing.jsonschema
from referencing.exceptions import Unresolvable

from corral.grammar.core.errors import ConstraintError

_SLOW_MARKERS = ('"$id"', '"$anchor"', '"$dynamicAnchor"', '"$recursiveAnchor"')


class RefTable:
    """Resolves references of one document; `resolver` values are opaque scope handles."""

    def __init__(self, root: dict | bool, text: str | None = None) -> None:
        """`text`: the document as JSON, when the caller has it (saves serialising it again)."""
        self.root = root
        dialect = root.get("$schema", "") if isinstance(root, dict) else ""
        self._spec = referencing.jsonschema.specification_with(
            dialect if isinstance(dialect, str) else "", default=referencing.jsonschema.DRAFT202012
        )
        self._root_id = _root_id(root)
        self._registry: referencing.Registry | None = None
        if isinstance(root, dict) and _needs_registry(root, dialect, text):
            resource = self._spec.create_resource(root)
            self._registry = referencing.Registry().with_resource(self._root_id, resource).crawl()

    def root_scope(self) -> Any:
        """The scope handle for the document root."""
        if self._registry is None:
            return None
        return self._registry.resolver(base_uri=self._root_id)

    def enter(self, node: dict, scope: Any) -> Any:
        """The scope inside `node` (changes only where `node` carries an `$id`)."""
        if scope is None or node is self.root:
            return scope
        return scope.in_subresource(self._spec.create_resource(node))

    def resolve(self, ref: str, scope: Any, pointer: str) -> tuple[Any, Any, str]:
        """(target, scope inside the target, a pointer naming the target for error messages)."""
        if scope is None:
            return self._resolve_pointer(ref, pointer)
        try:
            resolved = scope.lookup(ref)
        except Unresolvable as e:
            raise ConstraintError(
                f"cannot resolve $ref {ref!r}: only references inside the schema are supported",
                pointer,
                "$ref",
            ) from e
        return resolved.contents, resolved.resolver, _fragment(ref)

    def _resolve_pointer(self, ref: str, pointer: str) -> tuple[Any, Any, str]:
        base, _, frag = ref.partition("#")
        if base and base != self._root_id:
            raise ConstraintError(
                f"cannot resolve $ref {ref!r}: only references inside the schema are supported",
                pointer,
                "$ref",
            )
        node: Any = self.root
        for raw in frag.split("/")[1:] if frag else ():
            token = unquote(raw).replace("~1", "/").replace("~0", "~")
            try:
                node = node[int(token)] if isinstance(node, list) else node[token]
            except (KeyError, IndexError, ValueError, TypeError) as e:
                raise ConstraintError(f"$ref {ref!r} points at nothing", pointer, "$ref") from e
        return node, None, frag


def _root_id(root: dict | bool) -> str:
    if not isinstance(root, dict):
        return ""
    rid = root.get("$id", root.get("id", ""))
    return rid.rstrip("#") if isinstance(rid, str) else ""


def _needs_registry(root: dict, dialect: object, text: str | None) -> bool:
    if text is None:
        text = json.dumps(root)
    if any(m in text for m in _SLOW_MARKERS[1:]):
        return True
    draft4 = isinstance(dialect, str) and "draft-04" in dialect
    n_ids = text.count('"$id"') + (text.count('"id"') if draft4 else 0)
    root_has_id = "$id" in root or (draft4 and "id" in root)
    if n_ids > (1 if root_has_id else 0):
        return True
    local = ("#", root.get("$id", "#") or "#")
    return any(not r.startswith(local) for r in _REF.findall(text))


#: A `"$ref": "..."` member in JSON text, with any separator spacing.
_REF = re.compile(r'"\$ref"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _fragment(ref: str) -> str:
    return "#" + ref.partition("#")[2] if "#" in ref else ref
