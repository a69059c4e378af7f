"""A prefix of a JSON instance, parsed against a `JsonCloser`'s schema, and its closing text.

A `PartialJson` is a stack of frames, one per open value, each with the schema branches that may
describe it (`anyOf`/`oneOf` branches narrowed by the value's first character). `feed` is
incremental (cost: the new characters), `copy` is shallow (cost: the depth), and `closing`
reuses the closing text of every container frame that did not change since it was last asked
(cost: the innermost frames), so the engine can ask at every step.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from corral.grammar.shortest import (
    MAX_FILL,
    JsonCloser,
    Schema,
    complete_string,
    implied_types,
    json_kind,
    number_ok,
)

_TYPE_OF_FIRST = {"{": "object", "[": "array", '"': "string", "t": "boolean", "f": "boolean"}
_LITERALS = ("true", "false", "null")


@dataclass
class _Frame:
    """One open value. `kind`: top, object, array, string, key, scalar. `state` (containers):
    what comes next; `text`: a string's or scalar's characters so far; `keys`: properties
    present; `count`: items so far; `key`: the property whose value is being written."""

    kind: str
    schemas: list[Schema]
    pointer: str
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
        self._closed: dict[tuple, tuple[str, list[str]] | None] = {}  # shared by copies
        self.broken = False  # text this parser does not model was fed
        # The separator (',' or ':') the text ends in, and the whitespace typed after it: a
        # separator such as ", " is only complete with its space.
        self.sep: str | None = None
        self.ws = 0

    @classmethod
    def empty(cls, closer: JsonCloser) -> PartialJson:
        return cls(closer, [_Frame("top", closer.branches(closer.root), "")])

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
            self.stack.pop()
            self._value_done()
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
        schemas = [
            b
            for s in parent.schemas
            for b in self.closer.branches(node_of(s))
            if _admits_type(b, kind)
        ]
        if ch == "{":
            self.stack.append(_Frame("object", schemas, pointer, state="key_or_end"))
        elif ch == "[":
            self.stack.append(_Frame("array", schemas, pointer, state="value_or_end"))
        elif ch == '"':
            self.stack.append(_Frame("string", schemas, pointer))
        else:
            self.stack.append(_Frame("scalar", schemas, pointer, text=ch))

    def _string_char(self, top: _Frame, ch: str) -> None:
        if top.escape:
            top.escape += ch
            if top.escape[1] != "u" or len(top.escape) == 6:
                top.text += json.loads('"' + top.escape + '"') if _good(top.escape) else "?"
                top.escape = ""
            return
        if ch == "\\":
            top.escape = ch
        elif ch == '"':
            self.stack.pop()
            if top.kind == "key":
                parent = self.stack[-1]
                parent.key, parent.keys, parent.state = top.text, parent.keys + (top.text,), "colon"
            else:
                self._value_done()
        else:
            top.text += ch

    def _end_value(self) -> None:
        self.stack.pop()
        self._value_done()

    def _value_done(self) -> None:
        parent = self.stack[-1]
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
        text, cut = "", []
        if self.sep is not None:
            full = self.closer.comma if self.sep == "," else self.closer.colon
            text = full[full.index(self.sep) + 1 :][self.ws :]
        for depth in range(len(self.stack) - 1, -1, -1):
            part = self._close_frame(depth, cut)
            if part is None:
                return None
            text += part
        return text, cut

    def _close_frame(self, depth: int, cut: list[str]) -> str | None:
        c, f = self.closer, self.stack[depth]
        innermost = depth == len(self.stack) - 1
        if f.kind == "top":
            if f.state == "value":
                cut.append("")
                return c.shortest(c.root)
            return ""
        if f.kind == "key":
            return ""  # its object frame finishes the name
        if f.kind in ("string", "scalar"):
            cut.append(f.pointer)
            ends = (_finish_leaf(f, b, c) for b in f.schemas)
            return min((e for e in ends if e is not None), key=len, default=None)
        above = None if innermost else self.stack[depth + 1].kind
        key = (f.kind, f.state, f.keys, f.count, f.key, above, f.pointer, *map(id, f.schemas))
        best = self._closed.get(key) if above != "key" else None
        if best is None:
            options = [self._close_container(f, b, above) for b in f.schemas]
            found = [o for o in options if o is not None]
            best = min(found, key=lambda o: len(o[0])) if found else None
            if above != "key":
                self._closed[key] = best
        if best is None:
            return None
        cut.extend(best[1])
        return best[0]

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
        if undeclared and typed not in node.get("properties", {}):
            names.append(typed)
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
        head = "n" if f.escape == "\\" else "0" * (6 - len(f.escape))
        if not _good(f.escape + head):
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


def _good(escape: str) -> bool:
    """Whether a complete escape sequence decodes to a character JSON text may hold alone."""
    try:
        ch = json.loads('"' + escape + '"')
    except ValueError:
        return False
    return not 0xD800 <= ord(ch) <= 0xDFFF
