"""Checks every constraint passes before any recursive code sees it: nesting depth, lone surrogates.

* Nesting: Corral's schema analysis, ``close_objects`` and the canonical form recurse once or a
  few times per JSON level, so a schema nested thousands of levels deep would raise Python's
  ``RecursionError``. A schema document nested deeper than :data:`MAX_NESTING_DEPTH` JSON levels
  (every object and array counts) is refused with ``limit="nesting_depth"``; llguidance itself
  reads at most 128 levels (``limit="recursion_depth"``), so nothing compilable is lost.
* Lone surrogates (``"\\ud800"`` in a Python ``str``) cannot be encoded as UTF-8, so no tokenizer
  and no backend can handle them: they are refused wherever they occur (any key or string of a
  schema - a ``description`` too -, a regex, a grammar, a choice), with the JSON pointer of the
  place, rather than dropped or replaced.

Both checks walk with an explicit stack (no recursion) and cost microseconds on typical schemas.
"""

from __future__ import annotations

from typing import Any

from corral.grammar.errors import ConstraintError

#: The deepest schema document accepted, in JSON levels (see the module docstring).
MAX_NESTING_DEPTH = 200


def check_document(doc: Any, what: str = "schema") -> None:
    """Refuse ``doc`` (decoded JSON) when it nests too deeply or holds a lone surrogate."""
    depth, dirty = _scan(doc)
    if depth > MAX_NESTING_DEPTH:
        raise nesting_error(what, depth)
    if dirty:
        pointer, keyword, in_key = _find_surrogate(doc)
        place = "a member name" if in_key else "a string"
        raise ConstraintError(
            f"the {what} has {place} with a lone surrogate (an unpaired UTF-16 code unit such as "
            "\\ud800), which is not valid Unicode text; remove it or write a whole character",
            pointer=pointer,
            keyword=keyword,
        )


def nesting_error(what: str, depth: int | None = None) -> ConstraintError:
    """The refusal of a constraint nested too deeply to walk (``limit="nesting_depth"``)."""
    if what != "schema":
        return ConstraintError(
            f"the {what} is nested too deeply to parse; flatten it into more rules",
            keyword="nesting",
            limit="nesting_depth",
        )
    levels = f"{depth} levels deep" if depth is not None else "too deeply"
    return ConstraintError(
        f"the schema is nested {levels}; at most {MAX_NESTING_DEPTH} levels of JSON nesting "
        "are accepted (and llguidance reads about 128): flatten it, or name repeated parts in "
        "$defs and use $ref",
        keyword="nesting",
        limit="nesting_depth",
    )


def check_text(text: str, what: str, pointer: str = "") -> None:
    """Refuse a constraint text (regex, grammar, choice) that holds a lone surrogate."""
    if text.isascii() or _encodable(text):
        return
    at = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
    raise ConstraintError(
        f"the {what} has a lone surrogate (U+{ord(text[at]):04X}) at character {at}, which is "
        "not valid Unicode text; remove it or write a whole character",
        pointer=pointer,
        keyword=what,
    )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean(s: str) -> bool:
    return s.isascii() or _encodable(s)


def _scan(doc: Any) -> tuple[int, bool]:
    """(the document's depth in JSON levels, whether some string or key is not encodable);
    stops descending once the depth passes the limit."""
    deepest, dirty = 0, False
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            dirty = dirty or not _clean(node)
            continue
        if not isinstance(node, dict | list):
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING_DEPTH:
            continue
        if isinstance(node, dict):
            dirty = dirty or not all(_clean(k) for k in node if isinstance(k, str))
            stack.extend((v, depth + 1) for v in node.values())
        else:
            stack.extend((v, depth + 1) for v in node)
    return deepest, dirty


def _find_surrogate(doc: Any) -> tuple[str, str, bool]:
    """(pointer, keyword, whether it is in a member name) of the first lone surrogate, in an
    order that checks an object's member names before anything below it - so the pointer's own
    tokens are always clean text."""
    stack: list[tuple[Any, str, str]] = [(doc, "", "")]
    while stack:
        node, pointer, keyword = stack.pop()
        if isinstance(node, str):
            if not _clean(node):
                return pointer, keyword, False
        elif isinstance(node, dict):
            if not all(_clean(k) for k in node):
                return pointer, keyword, True
            for k, v in node.items():
                stack.append((v, f"{pointer}/{_escape(k)}", k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                stack.append((v, f"{pointer}/{i}", keyword))
    return "", "", False  # pragma: no cover - only called when _scan found one


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
