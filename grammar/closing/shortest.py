"""Shortest valid instances and completions under a JSON schema (budget closing).

`JsonCloser` holds a schema (the one the grammar enforces, after analysis) and answers two
questions: the shortest valid instance (`shortest`), and, through a `partial_json.PartialJson`
(`PartialJson.empty(closer)`) fed a prefix of an instance, the shortest text that completes it: open strings, numbers and
literals finished, missing required properties and `minItems` items filled with their own
shortest values, open arrays and objects closed. Text is compact, with the constraint's
separators; properties come in the order the grammar writes them (declared order). The answer is
a proposal the caller verifies against the real matcher (a schema shape this module does not
model yields None or a completion the matcher refuses, never a silent "valid"):
`engine.budget_close` runs it through the matcher before relying on it.

Sharing. A closer is built once per constraint and shared: by the request threads that prepare
it and by the engine's thread, whose sequences' parsers ask it at every step. What it answers is
memoised as it is asked (by node identity), so the memo is its state: every memo is written
under the closer's lock, each entry only once and only complete, and a complete entry is read
without the lock. A node being worked out (a recursive `$ref`) is marked busy under that lock,
so another thread never mistakes it for a recursion of its own: a closer asked from several
threads answers as one thread asking the same questions, in the order they took the lock, would.
(Where a schema recurses, a node's answer may depend on what was asked first; the constraint
runtime asks for the root's shortest instance before it shares a closer.) Its string automata
are its `strings.Patterns`, under their own lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from jsonschema import Draft202012Validator

from corral.grammar.checks.open_items import canonical
from corral.grammar.checks.value_sites import UNIQUE
from corral.grammar.closing.conjunction import merge
from corral.grammar.closing.numbers import (  # noqa: F401 - re-exported
    implied_types,
    json_kind,
    number_ok,
    smallest_number,
)
from corral.grammar.closing.strings import (  # noqa: F401 - re-exported
    MAX_FILL,
    Patterns,
    complete_string,
    fresh_suffix,
    search_pattern,
    shortest_string,
)

Schema = dict | bool
_ANY: dict = {}  # the schema `true`: shared, never mutated
_UNKNOWN = object()  # not in a memo yet
_APPLICATORS = frozenset(("allOf", "anyOf", "oneOf"))
#: The most alternatives one schema node is expanded into (`allOf` of `anyOf`s multiply).
MAX_BRANCHES = 64


class JsonCloser:
    """Shortest instances and completions for one schema. Its schema and separators never
    change; its memos grow under its lock (see the module's "Sharing"): share it freely."""

    def __init__(self, schema: Schema, item_separator: str = ",", key_separator: str = ":"):
        self.root = schema
        self.comma, self.colon = item_separator, key_separator
        self.patterns = Patterns()  # the automata of its `pattern`s
        # Reentrant: a node's shortest instance asks for its children's.
        self._lock = threading.RLock()
        self._memo: dict[int, str | None] = {}
        self._busy: set[int] = set()  # nodes being worked out, by the thread holding the lock
        # id(node) -> (node, result): the node is kept alive, so its id is never reused and
        # every schema a frame holds stays one object (the closing cache keys on their ids)
        self._resolved: dict[int, tuple[Schema, Schema]] = {}
        self._branches: dict[int, tuple[Schema, list[Schema]]] = {}

    @classmethod
    def for_spec(cls, spec: Any) -> JsonCloser:
        """The closer of a json_schema / json_object `ConstraintSpec`, over the analysed schema
        that its grammar enforces."""
        from corral.grammar.schema.analysis import analyze_schema

        plan = analyze_schema(spec.schema(), lenient=not spec.strict, source=spec.source or None)
        fmt = spec.json_format  # regexes in Python's dialect: interegular reads those
        return cls(plan.judged_schema(), fmt.item_separator, fmt.key_separator)

    # ---- schema navigation -------------------------------------------------------------------

    def resolve(self, node: Schema) -> Schema:
        """`node` with a local `$ref` followed (its siblings kept as an `allOf` beside it);
        the same object every time it is asked, whatever the thread."""
        found = self._resolved.get(id(node))
        if found is None:
            with self._lock:
                found = self._resolved.get(id(node))
                if found is None:
                    found = self._resolved[id(node)] = (node, self._resolve(node))
        return found[1]

    def _resolve(self, node: Schema) -> Schema:
        for _ in range(64):
            if not isinstance(node, dict) or "$ref" not in node:
                break
            target: Any = self.root
            for part in node["$ref"].lstrip("#").split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                target = target[int(part)] if isinstance(target, list) else target.get(part, {})
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {"allOf": [target, rest]} if isinstance(target, dict) and rest else target
        return node

    def branches(self, node: Schema) -> list[Schema]:
        """The alternatives `node` stands for, each a plain schema (no `allOf` / `anyOf` /
        `oneOf` at its top; true as {}): the disjunctive normal form, `allOf` parts merged;
        the same list every time it is asked (never change it)."""
        found = self._branches.get(id(node))
        if found is None:
            with self._lock:
                found = self._branches.get(id(node))
                if found is None:
                    found = self._branches[id(node)] = (node, self._flatten(node))
        return found[1]

    def _flatten(self, node: Schema) -> list[Schema]:
        node = self.resolve(node)
        if node is True:
            return [_ANY]
        values = listed_values(node)
        if values is not None and any(isinstance(v, dict | list) for v in values):
            # objects and arrays in `enum`/`const`: one branch per value, spelt out as a schema
            rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
            out = [merge(rest, _spelt(v)) for v in values]
            return [b for b in out if b is not False][:MAX_BRANCHES] or [False]
        if not isinstance(node, dict) or not node.keys() & _APPLICATORS:
            return [node]
        out: list[Schema] = [{k: v for k, v in node.items() if k not in _APPLICATORS}]
        factors = [self.branches(part) for part in node.get("allOf", ())]
        factors += [
            [b for alt in node[key] for b in self.branches(alt)]
            for key in ("anyOf", "oneOf")
            if node.get(key)
        ]
        for alts in factors:
            merged = (merge(a, b) for a in out for b in alts)
            # a bound on the product: a closing is looked for among these branches only
            out = [m for m in merged if m is not False][:MAX_BRANCHES]
        return out or [False]

    def child(self, node: Schema, key: str | int) -> Schema:
        """The schema of property `key` (str) or item `key` (int) of a value under `node`."""
        if not isinstance(node, dict):
            return node
        if isinstance(key, int):
            prefix = node.get("prefixItems", [])
            return prefix[key] if key < len(prefix) else node.get("items", True)
        props = node.get("properties", {})
        if key in props:
            return props[key]
        for pattern, sub in node.get("patternProperties", {}).items():
            if search_pattern(pattern, key):
                return sub
        return node.get("additionalProperties", True)

    # ---- shortest instances ------------------------------------------------------------------

    def shortest(self, node: Schema) -> str | None:
        """The shortest valid instance of `node` as compact text, or None (none found)."""
        key = id(node)
        found = self._memo.get(key, _UNKNOWN)
        if found is not _UNKNOWN:
            return found  # type: ignore[return-value]
        with self._lock:
            found = self._memo.get(key, _UNKNOWN)
            if found is not _UNKNOWN:
                return found  # type: ignore[return-value]
            if key in self._busy:
                return None  # a recursive reference: no finite instance along this path
            self._busy.add(key)
            try:
                alts = [self._shortest_one(b) for b in self.branches(node)]
            finally:
                self._busy.discard(key)
            best = min((a for a in alts if a is not None), key=len, default=None)
            self._memo[key] = best
            return best

    def _shortest_one(self, node: Schema) -> str | None:
        if node is True or node == {}:
            return "0"
        if node is False or not isinstance(node, dict):
            return None
        if "const" in node:
            return self.dumps(node["const"])
        if "enum" in node:
            return min((self.dumps(v) for v in node["enum"]), key=len, default=None)
        types = node.get("type") or implied_types(node)
        types = [types] if isinstance(types, str) else types
        made = (self._of_type(node, t) for t in types)
        return min((m for m in made if m is not None), key=len, default=None)

    def _of_type(self, node: dict, kind: str) -> str | None:
        if kind == "null":
            return "null"
        if kind == "boolean":
            return "true"
        if kind in ("integer", "number"):
            value = smallest_number(node, kind == "integer")
            return None if value is None else json.dumps(value)
        if kind == "string":
            text = shortest_string(node, self.patterns)
            return None if text is None else self.dumps(text)
        if kind == "array":
            if node.get("minItems", 0) > MAX_FILL:
                return None
            if UNIQUE in node:  # string items that must not repeat (``value_sites``)
                items = self.distinct_items(node, 0, node.get("minItems", 0), set())
            else:
                items = [self.shortest(self.child(node, i)) for i in range(node.get("minItems", 0))]
            if items is None or None in items:
                return None
            return "[" + self.comma.join(items) + "]"  # type: ignore[arg-type]
        if kind == "object":
            members = self.required_members(node, ())
            if members is None:
                return None
            return "{" + self.comma.join(self.dumps(k) + self.colon + v for k, v in members) + "}"
        return None

    def distinct_items(
        self, node: dict, start: int, count: int, taken: set[str]
    ) -> list[str] | None:
        """The texts of `count` items from index `start` of an array under `node` whose string
        items must not repeat: none in `taken` (which gains them) nor twice. Listed strings
        are taken shortest first; open strings get digits appended."""
        out = []
        for i in range(start, start + count):
            item = self.resolve(self.child(node, i))
            listed = self._listed_strings(item)
            if listed is not None:
                free = [v for v in listed if v not in taken]
                if not free:
                    return None
                text = min(free, key=lambda v: (len(self.dumps(v)), v))
            else:
                shortest = self.shortest(item)
                text = None if shortest is None else json.loads(shortest)
                if not isinstance(text, str):  # open items (``open_items``): compared whole
                    fresh = None if shortest is None else self._fresh(item, shortest, taken)
                    if fresh is None:
                        return None
                    out.append(fresh)
                    continue
                text += fresh_suffix(text, taken) if text in taken else ""
            taken.add(text)
            out.append(self.dumps(text))
        return out

    def _fresh(self, item: Schema, shortest: str, taken: set[str]) -> str | None:
        """A text of an instance of `item` whose value (``open_items.canonical``) is not in
        `taken` (which gains it): the shortest instance, or one grown from it (a number counted
        up, a member's string given digits or its number counted up, another literal)."""
        judge = Draft202012Validator({"$defs": self.root.get("$defs", {}), "allOf": [item]})
        value = json.loads(shortest)
        bases = [value]
        if isinstance(value, dict):  # also with each declared member it lacks
            for branch in self.branches(item):
                props = branch.get("properties", {}) if isinstance(branch, dict) else {}
                filled = ((k, self.shortest(sub)) for k, sub in props.items() if k not in value)
                bases += [{**value, k: json.loads(v)} for k, v in filled if v is not None]
        texts = (t for base in bases for t in _variants(base, len(taken) + 1))
        for text in texts:
            key = canonical(text.encode())
            if key not in taken and judge.is_valid(json.loads(text)):
                taken.add(key)
                return text
        return None

    def _listed_strings(self, node: Schema, depth: int = 0) -> list[str] | None:
        """The strings `node` lists (`enum`/`const`, or an `anyOf` of such), else None."""
        node = self.resolve(node)
        if isinstance(node, dict) and set(node) - {"type"} == {"anyOf"} and depth < 16:
            found = [self._listed_strings(b, depth + 1) for b in node["anyOf"]]
            return None if None in found else [v for f in found for v in f]  # type: ignore[union-attr]
        listed = listed_values(node)
        return None if listed is None else [v for v in listed if isinstance(v, str)]

    def required_members(
        self, node: Schema, present: Iterable[str]
    ) -> list[tuple[str, str]] | None:
        """(name, shortest value text) of `node`'s required properties missing from `present`,
        in the order the grammar writes them; None when one has no instance."""
        if not isinstance(node, dict):
            return []
        out: list[tuple[str, str]] = []
        seen = set(present)
        # the grammar writes declared properties in their declared order, then the others
        order = {name: i for i, name in enumerate(node.get("properties", {}))}
        required = sorted(node.get("required", []), key=lambda n: order.get(n, len(order)))
        for name in required:
            if name in seen:
                continue
            seen.add(name)
            value = self.shortest(self.child(node, name))
            if value is None:
                return None
            out.append((name, value))
        need = node.get("minProperties", 0) - len(seen)
        if need > 0:  # more keys than the required ones: the shortest the object allows
            extra = self._free_members(node, seen, need)
            if extra is None:
                return None
            out += extra
        return out

    def _free_members(self, node: dict, seen: set[str], need: int) -> list | None:
        """`need` more (name, shortest value text) members for `minProperties`, none in
        `seen`: optional declared properties first (the grammar writes them before the free
        keys), then the shortest keys of each pattern, then other keys; None: not enough."""
        names = [n for n in node.get("properties", {}) if n not in seen]
        for pattern in node.get("patternProperties", {}):
            first = shortest_string({"type": "string", "pattern": pattern}, self.patterns)
            if first is not None:
                names += [first, *(first + str(k) for k in range(need + len(seen) + 1))]
        if node.get("additionalProperties", True) is not False:
            names += ["", *(str(k) for k in range(need + len(seen) + 1))]
        out: list[tuple[str, str]] = []
        for name in dict.fromkeys(names):
            if len(out) == need:
                break
            if name in seen:
                continue
            value = self.shortest(self.child(node, name))
            if value is not None:
                seen.add(name)
                out.append((name, value))
        return out if len(out) == need else None

    def dumps(self, value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(self.comma, self.colon))


def listed_values(node: Schema) -> list | None:
    """The values an `enum`/`const` node lists, else None."""
    if not isinstance(node, dict):
        return None
    return [node["const"]] if "const" in node else node.get("enum")


def _spelt(value: Any) -> Schema:
    """The schema of exactly `value`, with an object's keys in its own order (the order the
    backend writes them)."""
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {k: _spelt(v) for k, v in value.items()},
            "required": list(value),
            "additionalProperties": False,
        }
    if isinstance(value, list):
        n = len(value)
        return {
            "type": "array",
            "prefixItems": [_spelt(v) for v in value],
            "items": False,
            "minItems": n,
            "maxItems": n,
        }
    return {"const": value}


def _variants(value: Any, n: int) -> Iterator[str]:
    """`value` and up to about `n` values grown from it, as compact text (``_fresh``)."""
    yield json.dumps(value, separators=(",", ":"))
    steps = range(1, n + 1)
    if isinstance(value, bool) or value is None:
        yield from ("true", "false", "null")
    elif isinstance(value, int | float):
        yield from (json.dumps(value + k) for k in steps)
    elif isinstance(value, dict):
        for key, v in value.items():
            if isinstance(v, str) or (isinstance(v, int | float) and not isinstance(v, bool)):
                grown = (v + str(k) if isinstance(v, str) else v + k for k in steps)
                yield from (json.dumps({**value, key: g}, separators=(",", ":")) for g in grown)
        yield from (json.dumps({**value, f"k{k}": 0}, separators=(",", ":")) for k in steps)
    elif isinstance(value, list):
        yield from (json.dumps([*value, k], separators=(",", ":")) for k in steps)
