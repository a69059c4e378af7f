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

from corral.grammar.checks.open_items import canonical
from corral.grammar.checks.value_sites import UNIQUE
from corral.grammar.closing.partial_members import (
    cheapest_member,
    in_order,
    next_names,
    pattern_names,
)
from corral.grammar.closing.partial_values import (
    HIGH_SURROGATE,
    Frame,
    admits_type,
    finish_leaf,
    finish_string,
    holds,
    lone_char,
    pointer_escape,
)
from corral.grammar.closing.shortest import (
    MAX_FILL,
    JsonCloser,
    Schema,
)

_Closing = tuple[str, list[str]]  # a closing text and the pointers it cuts short
_TYPE_OF_FIRST = {"{": "object", "[": "array", '"': "string", "t": "boolean", "f": "boolean"}


class CharStream:
    """Text taken one character at a time (`_char`), until the text can no longer be valid
    (`broken`): what `PartialJson` and `tag_close.PartialTag` share."""

    broken = False

    def feed(self, text: str) -> None:
        for ch in text:
            if self.broken:
                return
            self._char(ch)

    def _char(self, ch: str) -> None:
        raise NotImplementedError

    def open_string(self) -> Frame | None:
        """The frame of the JSON string value being written, if the text ends inside one."""
        raise NotImplementedError


class PartialJson(CharStream):
    """A prefix of a JSON instance being parsed against a `JsonCloser`'s schema."""

    def __init__(self, closer: JsonCloser, stack: list[Frame]) -> None:
        self.closer = closer
        self.stack = stack
        self._closed: dict[tuple, list[_Closing | None]] = {}  # shared by copies
        self.broken = False  # text this parser does not model was fed
        # The separator (',' or ':') the text ends in, and the whitespace typed after it: a
        # separator such as ", " is only complete with its space.
        self.sep: str | None = None
        self.ws = 0
        # the text so far, and where the character being read sits in it (open items of an
        # array whose items must not repeat are compared whole: ``open_items``)
        self.text, self.pos = "", 0

    @classmethod
    def empty(cls, closer: JsonCloser) -> PartialJson:
        return cls(closer, [Frame("top", [closer.root], "", [frozenset()])])

    def feed(self, text: str) -> None:
        base = len(self.text)
        self.text += text
        for i, ch in enumerate(text):
            if self.broken:
                return
            self.pos = base + i
            self._char(ch)

    def open_string(self) -> Frame | None:
        top = self.stack[-1] if self.stack else None
        return top if top is not None and top.kind == "string" else None

    def copy(self) -> PartialJson:
        new = PartialJson(self.closer, [copy.copy(f) for f in self.stack])
        new.broken, new.sep, new.ws = self.broken, self.sep, self.ws
        new.text, new.pos = self.text, self.pos
        new._closed = self._closed
        return new

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
            self.stack.append(Frame("key", [], top.pointer))
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

    def _open(self, parent: Frame, ch: str) -> None:
        """A value starts with `ch` inside `parent` (expecting a value)."""
        if parent.kind == "object":
            node_of = lambda b: self.closer.child(b, parent.key)  # noqa: E731
            pointer = parent.pointer + "/" + pointer_escape(parent.key)
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
                if admits_type(b, kind):
                    origins.setdefault(id(b), (b, set()))[1].add(i)
        schemas = [b for b, _ in origins.values()]
        frame = Frame("scalar", schemas, pointer, [frozenset(p) for _, p in origins.values()])
        if ch == "{":
            frame.kind, frame.state = "object", "key_or_end"
        elif ch == "[":
            frame.kind, frame.state = "array", "value_or_end"
        elif ch == '"':
            frame.kind = "string"
        else:
            frame.text = ch
        frame.start = self.pos
        self.stack.append(frame)

    def _string_char(self, top: Frame, ch: str) -> None:
        if top.escape:  # a surrogate pair's high half waits for its low half (one character)
            top.escape += ch
            e = top.escape
            if e[1] != "u" or len(e) == 12 or (len(e) == 6 and not HIGH_SURROGATE.fullmatch(e)):
                top.text += json.loads('"' + e + '"') if lone_char(e) else "?"
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
        the branches it is valid under came from (should none be, no closing is proposed)."""
        done = self.stack.pop()
        parent, patterns = self.stack[-1], self.closer.patterns
        pairs = zip(done.schemas, done.parents, strict=True)
        kept = set().union(*(p for b, p in pairs if holds(done, b, patterns)))
        if not kept:
            # no branch followed holds the value (the branches were cut at MAX_BRANCHES, or
            # the text is invalid): any closing from here could be wrong, so none is proposed
            self.broken = True
            return
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
            if done.kind == "string":
                parent.held += (done.text,)
            elif _unique(parent.schemas):  # an open item, compared whole
                end = self.pos + (done.kind != "scalar")  # a number ends before its delimiter
                parent.held += (canonical(self.text[done.start : end].encode()),)

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
            held = self._held(depth)
            ends = (finish_leaf(f, b, c, held) for b in f.schemas)
            return [None if e is None else (e, [f.pointer]) for e in ends]
        inner = self.stack[depth + 1] if depth + 1 < len(self.stack) else None
        above = None if inner is None else inner.kind
        key = (f.kind, f.state, f.keys, f.count, f.key, above, f.pointer, *map(id, f.schemas))
        # an array whose items must not repeat depends on the open item's text (`_taken`)
        fresh = above == "key" or (above is not None and _unique(f.schemas))
        if fresh or key not in self._closed:
            options = [self._close_container(f, b, inner) for b in f.schemas]
            if above == "key":
                return options
            self._closed[key] = options
        return self._closed[key]

    def _held(self, depth: int) -> tuple[str, ...]:
        """The string items that the value at `depth` must not repeat: those its array holds,
        where the array's items must not repeat (``value_checks``), else none."""
        parent = self.stack[depth - 1] if depth > 0 else None
        if parent is None or parent.kind != "array" or not _unique(parent.schemas):
            return ()
        return parent.held

    def _close_container(
        self, f: Frame, node: Schema, inner: Frame | None
    ) -> tuple[str, list[str]] | None:
        """The text that closes container `f` under branch `node`; `inner`: the open frame
        inside it (already closed by then), None when `f` is innermost."""
        c, cut = self.closer, [f.pointer]
        above = None if inner is None else inner.kind
        if f.kind == "array":
            need = (node.get("minItems", 0) if isinstance(node, dict) else 0) - f.count
            if above is not None:  # the open item counts once closed
                need -= 1
            if f.state == "value":
                need = max(need, 1)
            if need > MAX_FILL:
                return None
            start = f.count + (above is not None)
            unique = _unique([node])
            taken = self._taken(f, node, inner) if unique else None
            if unique and taken is None:
                return None
            if taken is not None:  # items that must not repeat
                items = c.distinct_items(node, start, max(need, 0), taken)  # type: ignore[arg-type]
            else:
                items = [c.shortest(c.child(node, i)) for i in range(start, start + max(need, 0))]
            if items is None or None in items:
                return None
            cut += [f"{f.pointer}/{i}" for i in range(start, start + len(items))]
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
            cut.append(f.pointer + "/" + pointer_escape(f.key))
        members = c.required_members(node, f.keys)
        if members and f.keys and not in_order(node, f.keys[-1], members):
            return None  # declared properties come in declared order: these cannot follow
        if members is not None and f.state == "key" and not members:
            members = cheapest_member(c, node, f.keys)  # after a comma a property must follow
        if members is None:
            return None
        cut += [f.pointer + "/" + pointer_escape(m[0]) for m in members]
        texts = [c.dumps(k) + c.colon + v for k, v in members]
        after = f.state != "key_or_end" and f.state != "key"
        return head + (c.comma if texts and after else "") + c.comma.join(texts) + "}", cut

    def _close_key(self, f: Frame, node: Schema, cut: list[str]) -> tuple[str, list[str]] | None:
        """An object whose innermost open value is a property name: finish the name (a declared
        property it may still become, a key a pattern completes it to, or itself where any name
        is allowed), its value, the missing required properties, and the object."""
        c, key = self.closer, self.stack[-1]
        if key.escape or not isinstance(node, dict):
            return None
        typed = key.text
        later, undeclared = next_names(node, f.keys)
        names = [n for n in later if n.startswith(typed)]
        if undeclared:  # itself, or extended where it would repeat a name (a repeated key)
            taken = {*f.keys, *node.get("properties", {})}
            fresh = (typed + s for s in itertools.chain([""], map(str, itertools.count())))
            names.append(next(n for n in fresh if n not in taken))
        names += pattern_names(node, typed, f.keys, c.patterns)
        best = None
        for name in names:
            value = c.shortest(c.child(node, name))
            rest = c.required_members(node, (*f.keys, name))
            if value is None or rest is None or not in_order(node, name, rest):
                continue
            text = c.dumps(name[len(typed) :])[1:] + c.colon + value
            texts = [c.dumps(k) + c.colon + v for k, v in rest]
            text += (c.comma if texts else "") + c.comma.join(texts) + "}"
            if best is None or len(text) < len(best[0]):
                names_cut = [name] + [k for k, _ in rest]
                best = (text, cut + [f.pointer + "/" + pointer_escape(n) for n in names_cut])
        return best

    def _taken(self, f: Frame, node: Schema, inner: Frame | None) -> set[str] | None:
        """For an array under `node` whose items must not repeat: the items it holds once
        `inner` (an open item) is finished as its closing finishes it (strings decoded, other
        items ``open_items.canonical``); None when that would repeat one it holds."""
        taken = set(f.held)
        if inner is not None and inner.kind == "string":  # finished as its shortest branch
            patterns = self.closer.patterns
            ends = (finish_string(inner, b, patterns, f.held) for b in inner.schemas)
            found = [e for e in ends if e is not None]
            if found:
                taken.add(min(found, key=lambda e: len(e[0]))[1])
        elif inner is not None:  # an open item: finished as its own closing finishes it
            typed = self.text[inner.start :]
            schema = self.closer.child(node, f.count)
            item = PartialJson(self.closer, [Frame("top", [schema], "", [frozenset()])])
            item.feed(typed)
            end = item.closing()
            value = None if end is None else canonical((typed + end[0]).encode())
            if value is None or value in taken:
                return None  # no closing known that does not repeat an item
            taken.add(value)
        return taken


def _unique(schemas: list[Schema]) -> bool:
    return any(isinstance(b, dict) and UNIQUE in b for b in schemas)
