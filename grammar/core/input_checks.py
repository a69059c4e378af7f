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

from corral.grammar.core.errors import ConstraintError

#: The deepest schema document accepted, in JSON levels (see the module docstring).
MAX_NESTING_DEPTH = 200


def check_document(doc: Any, what: str = "schema") -> None:
    """Refuse ``doc`` (decoded JSON) when it nests too deeply or holds a lone surrogate."""
    depth, dirty = _scan(doc)
    if depth > MAX_NESTING_DEPTH:
        raise nesting_error(what, depth)
    found = lone_surrogate_path(doc) if dirty else None
    if found is not None:
        path, in_key = found
        place = "a member name" if in_key else "a string"
        raise ConstraintError(
            f"the {what} has {place} with a lone surrogate (an unpaired UTF-16 code unit such as "
            "\\ud800), which is not valid Unicode text; remove it or write a whole character",
            pointer="".join(f"/{_escape(str(p))}" for p in path),
            keyword=next((p for p in reversed(path) if isinstance(p, str)), ""),
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
    at = lone_surrogate_at(text)
    if at is None:
        return
    raise ConstraintError(
        f"the {what} has a lone surrogate (U+{ord(text[at]):04X}) at character {at}, which is "
        "not valid Unicode text; remove it or write a whole character",
        pointer=pointer,
        keyword=what,
    )


def is_valid_text(text: str) -> bool:
    """False when ``text`` holds a UTF-16 surrogate on its own: JSON allows ``"\\ud800"`` and
    Python's parser keeps it, but no UTF-8 encoder, tokenizer or regex engine takes it."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in ``text``; None when it is valid Unicode."""
    if is_valid_text(text):
        return None
    return next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)


def lone_surrogate_path(data: Any) -> tuple[tuple[str | int, ...], bool] | None:
    """Where the first lone surrogate in a parsed JSON value is: (path, in_key), or None.

    ``path`` leads to the string, or to the object one of whose member names holds it
    (``in_key``); an object's names are checked before anything below it, so the path's own
    names are always valid text. Strings are checked where they are met; only containers go on
    the stack."""
    if isinstance(data, str):
        return None if is_valid_text(data) else ((), False)
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str) and not is_valid_text(key):
                return path, True
            if isinstance(value, str):
                if not is_valid_text(value):
                    return (*path, key), False
            elif isinstance(value, dict | list):
                stack.append(((*path, key), value))
    return None


def data_depth(value: Any) -> int:
    """How many JSON levels ``value`` spans (a scalar 0, ``[]`` 1, ``[[1]]`` 2); iterative, and
    it stops descending past :data:`MAX_NESTING_DEPTH` levels."""
    return _scan(value)[0]


def _scan(doc: Any) -> tuple[int, bool]:
    """(the document's depth in JSON levels, whether some string or key is not valid text);
    stops descending once the depth passes the limit. Only containers go on the stack, and a
    string costs one ``isascii`` unless it has other characters: this runs on every schema of
    every request, so it is written for speed."""
    if not isinstance(doc, dict | list):
        return 0, isinstance(doc, str) and not is_valid_text(doc)
    deepest, dirty = 0, False
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
        if depth > MAX_NESTING_DEPTH:
            continue
        if isinstance(node, dict):
            if not dirty:
                dirty = not all(k.isascii() or is_valid_text(k) for k in node if isinstance(k, str))
            node = node.values()
        for value in node:
            if isinstance(value, str):
                if not (dirty or value.isascii() or is_valid_text(value)):
                    dirty = True
            elif isinstance(value, dict | list):
                stack.append((value, depth + 1))
    return deepest, dirty


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
