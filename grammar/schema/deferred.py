"""`not` that only a finite domain beside it can settle (``allOf [enum [...], not {...}]``).

A negation that cannot be written for the backend (an object in `enum`, `multipleOf`, negated
`patternProperties`, ...) is still exact where the values it could apply to are a short list:
the analysis then folds the conjunction into one `enum` (``schema_fold``), asking the judge about
each value with the `not` as written. So a `not` whose negation fails is not refused at once:
:meth:`Deferred.hold` keeps it as a raw `{"not": ...}` conjunct, and :meth:`Deferred.settle`, at
the end of the analysis, refuses each one that no fold took away (strict), or drops it and
reports it (lenient). The negator refuses to negate a held one, with the reason it was held for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Deferred:
    """The raw `not` conjuncts held for a fold, by id: (the conjunct, pointer, keyword, reason)."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[dict, str, str, str]] = {}

    def hold(self, sub: Any, pointer: str, keyword: str, reason: str) -> dict:
        """A conjunct `{"not": sub}` to leave to a fold; refused later if none takes it."""
        conj = {"not": sub}
        self.held[id(conj)] = (conj, pointer, keyword, reason)
        return conj

    def reason(self, node: Any) -> str | None:
        """Why `node` was held (None: it is not a held conjunct)."""
        found = self.held.get(id(node))
        return found[3] if found is not None and found[0] is node else None

    def settle(self, out: Any, refuse: Callable[[str, str, str], None]) -> None:
        """Refuse every held conjunct still in `out` (in place: lenient mode drops them)."""
        if not self.held:
            return
        stack, seen = [out], set()
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
                continue
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            parts = node.get("allOf")
            if isinstance(parts, list):
                kept = [p for p in parts if self.reason(p) is None]
                for p in parts:
                    if self.reason(p) is not None:
                        _, pointer, keyword, reason = self.held[id(p)]
                        refuse(pointer, keyword, reason)  # strict: raises
                if len(kept) < len(parts):
                    node["allOf"] = kept
                    if not kept:
                        del node["allOf"]
            stack.extend(v for k, v in node.items() if k not in ("enum", "const"))
