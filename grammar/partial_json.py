"""A prefix of a JSON instance, parsed against a `JsonCloser`'s schema, and its closing text.

A `PartialJson` is a stack of frames, one per open value, each with the schema branches that may
describe it (`JsonCloser.branches`, narrowed by the value's first character). Each branch
remembers which branches of the enclosing value it came from, and a finished value keeps only
the enclosing branches that one of its own valid branches came from (a scalar or string by its
value, an object by its required names, an array by its length). So a `oneOf` whose branches
differ only in `required`, or by a discriminating `const`, is followed as the instance commits
to one; and the closing is chosen per branch, inside out, so the text closing an inner value and
the text closing its container come from the same branch path.

`feed` is incremental (cost: the new characters), `copy` is shallow (cost: the depth), and
`closing` reuses the closing text of every container frame that did not change since it was
last asked (cost: the innermost frames), so the engine can ask at every step.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass, field

from corral.grammar.shortest import (
    MAX_FILL,
    JsonCloser,
    Schema,
    complete_string,
    implied_types,
    json_kind,
    number_ok,
)

_Closing = tuple[str, list[str]]  # a closing text and the pointers it cuts short
_TYPE_OF_FIRST = {"{": "object", "[": "array", '"': "string", "t": "boolean", "f": "boolean"}
_LITERALS = ("true", "false", "null")
_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")  # the escape of a high surrogate


@dataclass
class _Frame:
    """One open value. `kind`: top, object, array, string, key, scalar. `state` (containers):
    what comes next; `text`: a string's or scalar's characters so far; `keys`: properties
    present; `count`: items so far; `key`: the property whose value is being written;
    `parents[i]`: the indices of the enclosing frame's branches that `schemas[i]` came from."""

    kind: str
    schemas: list[Schema]
    pointer: str
    parents: list[frozenset[int]] = field(default_factory=list)
    state: str = "value"
    text: str = ""
    escape: str = ""  # an unfinished escape sequence inside a string
    keys: tuple[str, ...] = ()
    count: int = 0
    key: str = ""


class PartialJson:
    """A prefix of a JSON instance being parsed against a `JsonCloser`'s schema."""

    def __init__(self, closer: JsonCloser, stack: list[_Frame]) -> None:
        self.closer = closer
        self.stack = stack
        self._closed: dict[tuple, list[_Closing | None]] = {}  # shared by copies
        self.broken = False  # text this parser does not model was fed
        # The separator (',' or ':') the text ends in, and the whitespace typed after it: a
        # separator such as ", " is only complete with its space.
        self.sep: str | None = None
        self.ws = 0

    @classmethod
    def empty(cls, closer: JsonCloser) -> PartialJson:
        return cls(closer, [_Frame("top", [closer.root], "", [frozenset()])])

    def copy(self) -> PartialJson:
        new = PartialJson(self.closer, [copy.copy(f) for f in self.stack])
        new.broken, new.sep, new.ws = self.broken, self.sep, self.ws
        new._closed = self._closed
        return new

    def feed(self, text: str) -> None:
        for ch in text:
            if self.broken:
                return
            self._char(ch)

    def _char(self, ch: str) -> None:
        top = self.stack[-1]
        if top.kind in ("string", "key"):
            return self._string_char(top, ch)
        if top.kind == "scalar":
            if ch in "0123456789+-.eEtrufalsn":
                top.text += ch
                return
            self._end_value()
            return self._char(ch)
        if ch in " \t\n\r":
            self.ws += 1
            return
        self.sep, self.ws = (ch, 0) if ch in ",:" else (None, 0)
        if top.state == "value":
            return self._open(top, ch)
        if top.kind == "object" and top.state in ("key_or_end", "key") and ch == '"':
            self.stack.append(_Frame("key", [], top.pointer))
        elif top.kind == "object" and top.state == "colon" and ch == ":":
            top.state = "value"
        elif ch == "," and top.state == "comma_or_end":
            top.state = "key" if top.kind == "object" else "value"
        elif ch in "}]" and top.state in ("comma_or_end", "key_or_end", "value_or_end"):
            self._end_value()
        elif top.kind == "array" and top.state == "value_or_end":
            top.state = "value"
            self._open(top, ch)
        else:
            self.broken = True

    def _open(self, parent: _Frame, ch: str) -> None:
        """A value starts with `ch` inside `parent` (expecting a value)."""
        if parent.kind == "object":
            node_of = lambda b: self.closer.child(b, parent.key)  # noqa: E731
            pointer = parent.pointer + "/" + _escape(parent.key)
        elif parent.kind == "array":
            node_of = lambda b: self.closer.child(b, parent.count)  # noqa: E731
            pointer = f"{parent.pointer}/{parent.count}"
        else:
            node_of, pointer = (lambda b: b), ""
        parent.state = "inside"
        kind = _TYPE_OF_FIRST.get(ch, "number")
        origins: dict[int, tuple[Schema, set[int]]] = {}  # one entry per distinct branch
        for i, s in enumerate(parent.schemas):
            for b in self.closer.branches(node_of(s)):
                if _admits_type(b, kind):
                    origins.setdefault(id(b), (b, set()))[1].add(i)
        schemas = [b for b, _ in origins.values()]
        frame = _Frame("scalar", schemas, pointer, [frozenset(p) for _, p in origins.values()])
        if ch == "{":
            frame.kind, frame.state = "object", "key_or_end"
        elif ch == "[":
            frame.kind, frame.state = "array", "value_or_end"
        elif ch == '"':
            frame.kind = "string"
        else:
            frame.text = ch
        self.stack.append(frame)

    def _string_char(self, top: _Frame, ch: str) -> None:
        if top.escape:  # a surrogate pair's high half waits for its low half (one character)
            top.escape += ch
            e = top.escape
            if e[1] != "u" or len(e) == 12 or (len(e) == 6 and not _HIGH.fullmatch(e)):
                top.text += json.loads('"' + e + '"') if _good(e) else "?"
                top.escape = ""
            elif len(e) in (7, 8) and e[6:] != "\\u"[: len(e) - 6]:
                self.broken = True  # a lone high surrogate: not modelled
            return
        if ch == "\\":
            top.escape = ch
        elif ch == '"':
            if top.kind == "key":
                self.stack.pop()
                parent = self.stack[-1]
                parent.key, parent.keys, parent.state = top.text, parent.keys + (top.text,), "colon"
            else:
                self._end_value()
        else:
            top.text += ch

    def _end_value(self) -> None:
        """The innermost value is complete: its enclosing value keeps the branches that one of
        the branches it is valid under came from (all of them, should none be: unknown)."""
        done = self.stack.pop()
        parent = self.stack[-1]
        kept = set().union(
            *(p for b, p in zip(done.schemas, done.parents, strict=True) if _holds(done, b))
        )
        if kept and len(kept) < len(parent.schemas):
            order = sorted(kept)
            parent.schemas = [parent.schemas[i] for i in order]
            parent.parents = [parent.parents[i] for i in order]
        if parent.kind == "top":
            parent.state = "done"
            return
        parent.state = "comma_or_end"
        if parent.kind == "array":
            parent.count += 1

    # ---- closing -----------------------------------------------------------------------------

    def closing(self) -> tuple[str, list[str]] | None:
        """The shortest text found that completes the instance, and the JSON pointers of the
        values it cuts short (open ones, and required ones it fills); None when unknown."""
        if self.broken:
            return None
        text = ""
        if self.sep is not None:
            full = self.closer.comma if self.sep == "," else self.closer.colon
            text = full[full.index(self.sep) + 1 :][self.ws :]
        # best[i]: the shortest closing of frames depth.. under branch i of frame `depth`
        depth = len(self.stack) - 1 - (self.stack[-1].kind == "key")  # its object finishes it
        best = self._close_frame(depth)
        while depth > 0:
            inner, depth = self.stack[depth], depth - 1
            own = self._close_frame(depth)
            via: list[_Closing | None] = [None] * len(own)
            for closed, parents in zip(best, inner.parents, strict=True):
                for i in parents if closed is not None else ():
                    if via[i] is None or len(closed[0]) < len(via[i][0]):  # type: ignore[index]
                        via[i] = closed
            best = [
                None if a is None or b is None else (a[0] + b[0], a[1] + b[1])
                for a, b in zip(via, own, strict=True)
            ]
        found = min((b for b in best if b is not None), key=lambda b: len(b[0]), default=None)
        return None if found is None else (text + found[0], list(found[1]))

    def _close_frame(self, depth: int) -> list[_Closing | None]:
        """For each branch of frame `depth`: the text that closes it once the frames inside it
        are closed, with the pointers it cuts short; None where that branch has none."""
        c, f = self.closer, self.stack[depth]
        if f.kind == "top":
            if f.state != "value":
                return [("", [])]
            value = c.shortest(c.root)
            return [None if value is None else (value, [""])]
        if f.kind in ("string", "scalar"):
            ends = (_finish_leaf(f, b, c) for b in f.schemas)
            return [None if e is None else (e, [f.pointer]) for e in ends]
        above = self.stack[depth + 1].kind if depth + 1 < len(self.stack) else None
        key = (f.kind, f.state, f.keys, f.count, f.key, above, f.pointer, *map(id, f.schemas))
        if above == "key" or key not in self._closed:
            options = [self._close_container(f, b, above) for b in f.schemas]
            if above == "key":
                return options
            self._closed[key] = options
        return self._closed[key]

    def _close_container(
        self, f: _Frame, node: Schema, above: str | None
    ) -> tuple[str, list[str]] | None:
        """The text that closes container `f` under branch `node`; `above`: the kind of the
        open frame inside it (already closed by then), None when `f` is innermost."""
        c, cut = self.closer, [f.pointer]
        if f.kind == "array":
            need = (node.get("minItems", 0) if isinstance(node, dict) else 0) - f.count
            if above is not None:  # the open item counts once closed
                need -= 1
            if f.state == "value":
                need = max(need, 1)
            if need > MAX_FILL:
                return None
            items = []
            start = f.count + (above is not None)
            for i in range(start, start + max(need, 0)):
                value = c.shortest(c.child(node, i))
                if value is None:
                    return None
                items.append(value)
                cut.append(f"{f.pointer}/{i}")
            after = f.state in ("comma_or_end", "inside")
            return (c.comma if items and after else "") + c.comma.join(items) + "]", cut
        if above == "key":
            return self._close_key(f, node, cut)
        head = ""
        if f.state in ("colon", "value"):
            value = c.shortest(c.child(node, f.key))
            if value is None:
                return None
            head = (c.colon if f.state == "colon" else "") + value
            cut.append(f.pointer + "/" + _escape(f.key))
        members = c.required_members(node, f.keys)
        if members is not None and f.state == "key" and not members:
            members = _cheapest_member(c, node, f.keys)  # after a comma a property must follow
        if members is None:
            return None
        cut += [f.pointer + "/" + _escape(m[0]) for m in members]
        texts = [c.dumps(k) + c.colon + v for k, v in members]
        after = f.state != "key_or_end" and f.state != "key"
        return head + (c.comma if texts and after else "") + c.comma.join(texts) + "}", cut

    def _close_key(self, f: _Frame, node: Schema, cut: list[str]) -> tuple[str, list[str]] | None:
        """An object whose innermost open value is a property name: finish the name (a declared
        property it may still become, or itself where any name is allowed), its value, the
        missing required properties, and the object."""
        c, key = self.closer, self.stack[-1]
        if key.escape or not isinstance(node, dict):
            return None
        typed = key.text
        later, undeclared = _next_names(node, f.keys)
        names = [n for n in later if n.startswith(typed)]
        if undeclared:  # itself, or extended where it would repeat a name (a repeated key)
            taken = {*f.keys, *node.get("properties", {})}
            fresh = (typed + s for s in itertools.chain([""], map(str, itertools.count())))
            names.append(next(n for n in fresh if n not in taken))
        best = None
        for name in names:
            value = c.shortest(c.child(node, name))
            rest = c.required_members(node, (*f.keys, name))
            if value is None or rest is None or not _in_order(node, name, rest):
                continue
            text = c.dumps(name[len(typed) :])[1:] + c.colon + value
            texts = [c.dumps(k) + c.colon + v for k, v in rest]
            text += (c.comma if texts else "") + c.comma.join(texts) + "}"
            if best is None or len(text) < len(best[0]):
                names_cut = [name] + [k for k, _ in rest]
                best = (text, cut + [f.pointer + "/" + _escape(n) for n in names_cut])
        return best


def _next_names(node: dict, present: tuple[str, ...]) -> tuple[list[str], bool]:
    """The declared property names that may follow `present`, and whether an undeclared one
    may: the grammar writes declared properties first, in declared order, then the others."""
    order = {name: i for i, name in enumerate(node.get("properties", {}))}
    undeclared = node.get("additionalProperties", True) is not False
    if any(k not in order for k in present):
        return [], undeclared
    last = max((order[k] for k in present), default=-1)
    return [n for n, i in order.items() if i > last], undeclared


def _in_order(node: dict, name: str, rest: list[tuple[str, str]]) -> bool:
    """Whether the missing required properties `rest` may still follow property `name`."""
    order = node.get("properties", {})
    if name not in order:
        return all(k not in order for k, _ in rest)
    names = list(order)
    return all(k not in order or names.index(k) > names.index(name) for k, _ in rest)


def _cheapest_member(c: JsonCloser, node: Schema, present: tuple[str, ...]):
    """[(name, value)]: the shortest property `node` still allows, or None."""
    if not isinstance(node, dict):
        return None
    names, undeclared = _next_names(node, present)
    if undeclared and "" not in present and "" not in node.get("properties", {}):
        names.append("")
    options = [(n, c.shortest(c.child(node, n))) for n in names]
    options = [(n, v) for n, v in options if v is not None]
    best = min(options, key=lambda o: len(c.dumps(o[0])) + len(o[1]), default=None)
    return None if best is None else [best]


def _finish_leaf(f: _Frame, node: Schema, closer: JsonCloser) -> str | None:
    """The rest of an open string (closing quote included) or scalar, valid under `node`."""
    if f.kind == "scalar":
        for lit in _LITERALS:
            if lit.startswith(f.text):
                return lit[len(f.text) :] if number_ok(node, json.loads(lit)) else None
        base = "0" if f.text[-1] in "-+eE." else ""
        grow = not any(ch in f.text for ch in ".eE")  # digits may still be appended
        for rest in (base + "0" * k for k in range(4 if grow else 1)):
            try:
                value = json.loads(f.text + rest)
            except ValueError:
                return None
            if number_ok(node, value):
                return rest
        return None
    head, text = "", f.text
    if f.escape:
        head = _finish_escape(f.escape)
        if head is None:
            return None
        text += json.loads('"' + f.escape + head + '"')
    if not isinstance(node, dict):
        return None if node is False else head + '"'
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        fits = [v[len(text) :] for v in values if isinstance(v, str) and v.startswith(text)]
        rest = min(fits, key=len, default=None)
    else:
        rest = complete_string(node, text)
    return None if rest is None else head + json.dumps(rest, ensure_ascii=False)[1:]


def _holds(f: _Frame, node: Schema) -> bool:
    """Whether the complete value of frame `f` may be valid under branch `node` (its type was
    checked when it opened; keywords not looked at here count as satisfied)."""
    if not isinstance(node, dict):
        return node is not False
    if f.kind == "scalar":
        try:
            return number_ok(node, json.loads(f.text))
        except ValueError:
            return False
    if f.kind == "string":
        if "const" in node or "enum" in node:
            return f.text in ([node["const"]] if "const" in node else node["enum"])
        rest = complete_string(node, f.text)
        return rest in (None, "") and len(f.text) <= node.get("maxLength", len(f.text))
    n = len(f.keys) if f.kind == "object" else f.count
    if f.kind == "object" and not set(node.get("required", ())) <= set(f.keys):
        return False
    kind = "Properties" if f.kind == "object" else "Items"
    return node.get("min" + kind, 0) <= n <= node.get("max" + kind, n)


def _admits_type(node: Schema, kind: str) -> bool:
    """Whether `node` may describe a value starting with a character of `kind`."""
    if not isinstance(node, dict):
        return node is True
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return any(json_kind(v) in (kind, "null" if kind != "string" else "") for v in values)
    types = node.get("type") or implied_types(node)
    types = {types} if isinstance(types, str) else set(types)
    if kind == "number":
        return bool(types & {"number", "integer", "null"})
    return kind in types or (kind == "boolean" and "null" in types)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _finish_escape(e: str) -> str | None:
    """The shortest rest of the escape sequence `e` that makes it one character (a high
    surrogate gets a low one after it)."""
    if e == "\\":
        return "n"
    if len(e) < 6:
        head = "0" * (6 - len(e))
        return head + "\\udc00" if _HIGH.fullmatch(e + head) else head if _good(e + head) else None
    low = "\\udc00"
    head = low[len(e) - 6 :] if low.startswith(e[6:]) else "0" * (12 - len(e))
    return head if _good(e + head) else None


def _good(escape: str) -> bool:
    """Whether a complete escape sequence decodes to a character JSON text may hold alone."""
    try:
        ch = json.loads('"' + escape + '"')
    except ValueError:
        return False
    return not 0xD800 <= ord(ch) <= 0xDFFF
