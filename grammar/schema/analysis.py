"""JSON Schema analysis in front of the grammar backends (fail closed, rewrite to reach further).

`analyze_schema` walks a schema once and returns an equivalent schema that llguidance enforces
exactly, or raises `ConstraintError` naming the keyword it cannot enforce and its JSON pointer.

Invariants of the output schema (the contract with the backend):
* it accepts exactly the instances `jsonschema` (Draft 2020-12, with format checks) accepts for
  the input, except where lenient mode dropped a keyword, which is then listed in `unenforced`
  (dropping a keyword never widens what is accepted silently);
* it only uses keywords llguidance implements exactly: no annotations, none of
  ``backends.quirks.NOT_IMPLEMENTED_KEYWORDS`` (`oneOf`, `not`, `if`/`then`/`else`,
  `propertyNames`, ...), no `dependencies`, no `format` (``quirks.LOOSE_FORMATS``); all `$ref`s
  are `#` or `#/$defs/<generated>`.
The walk costs one pass over the schema plus the rewrites it performs; every step is charged to
`budget`, so pathological schemas (deeply nested `oneOf`/`not`) fail fast.

Copies: `analyze_schema` never changes its input; it builds a new tree, but the output shares the
input's `required`, `enum` and `type` lists and `const` values, so treat `SchemaPlan.schema` as
read-only.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from corral.grammar.checks.distinct_keys import dead_end_risk
from corral.grammar.core.errors import ConstraintError, Unenforced
from corral.grammar.core.input_checks import check_document, nesting_error
from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.schema import rewrite_log as log
from corral.grammar.schema.deferred import Deferred
from corral.grammar.schema.dialect import as_latest, dialect_of
from corral.grammar.schema.disjoint import DisjointProver
from corral.grammar.schema.facts import (
    ALL_TYPES,
    ANNOTATIONS,
    closed_keys,
    escape_pointer,
)
from corral.grammar.schema.fold import fold_finite
from corral.grammar.schema.formats import format_constraint
from corral.grammar.schema.negate import Negator, NotExpressible
from corral.grammar.schema.patterns import PatternTable
from corral.grammar.schema.plan import SchemaPlan
from corral.grammar.schema.refs import RefTable
from corral.grammar.schema.rewrite import KeywordRewrites
from corral.grammar.schema.rewrite_log import Rewritten
from corral.grammar.schema.size import MAX_ALTERNATIVES, worst_conjunct
from corral.grammar.schema.wellformed import check_count, check_list, check_number, check_type

_NON_NEGATIVE_INT = frozenset(
    "minLength maxLength minItems maxItems minProperties maxProperties minContains maxContains".split()
)
_NUMBERS = frozenset("minimum maximum exclusiveMinimum exclusiveMaximum multipleOf".split())
_SCHEMA_MAPS = frozenset(("properties", "patternProperties"))
_SCHEMA_LISTS = frozenset(("allOf", "anyOf", "prefixItems"))
_SINGLE_SCHEMAS = frozenset(("additionalProperties", "items"))


def analyze_schema(
    schema: dict | bool,
    *,
    lenient: bool = False,
    budget: int = 100_000,
    source: str | None = None,
    check_keys: bool = True,
    algebra: RegexAlgebra | None = None,
) -> SchemaPlan:
    """Rewrite `schema` into an equivalent one llguidance enforces exactly.

    `source`, when given, is `schema` as JSON text (a spec's source), read instead of
    serialising the schema again. `check_keys`: the output is JSON from its first byte, so the
    matcher may check values at their boundaries (`distinct_keys`, `value_checks`). Raises
    ConstraintError when the schema is invalid, when (strict mode) a keyword cannot be enforced
    exactly, or when the analysis uses up `budget` steps. `algebra`: the regex memos the
    analysis uses (pattern translations, the regex algebra); its owner decides how long they
    live (a fresh one, for this analysis only, when None)."""
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("a JSON Schema must be an object or a boolean", "", "")
    check_document(schema)
    try:
        return _Analyzer(schema, lenient, budget, source, check_keys, algebra).run()
    except RecursionError:  # the rewrites nest deeper than the input: still the client's schema
        raise nesting_error("schema") from None


class _Analyzer:
    def __init__(
        self,
        root: dict | bool,
        lenient: bool,
        budget: int,
        source: str | None,
        check_keys: bool,
        algebra: RegexAlgebra | None = None,
    ) -> None:
        self.root = root
        self.check_keys = check_keys
        self.lenient = lenient
        self.budget = budget
        self.unenforced: list[Unenforced] = []
        self.refs = RefTable(root, source)
        self.dialect = dialect_of(root)
        self.defs: dict[str, Any] = {}
        self._def_names: dict[int, str] = {}
        self._pointer = ""
        self._alternatives: dict = {}  # memo of schema_size.alternatives
        #: id(rewritten conjunct) -> how to name it in a size refusal
        self.describe: dict[int, str] = {}
        self.rewritten: list[Rewritten] = []
        self._pointers: dict[int, tuple[dict, str]] = {}
        self.algebra = algebra or RegexAlgebra()  # regex memos: the caller's, or this analysis's
        self.patterns = PatternTable(self.refuse, self.record, self.algebra)
        self.deferred = Deferred()  # `not`s a fold may settle, refused in run() if none does
        self.negator = Negator(self.lookup, self.tick, self.patterns.complement, self.deferred)
        self.prover = DisjointProver(
            self.lookup, self.tick, self.patterns.exact_source, self.algebra
        )
        self.rewrites = KeywordRewrites(self)
        #: (node, pointer) of each `minProperties` that needs keys not to repeat
        self._counted: list[tuple[dict, str]] = []

    def run(self) -> SchemaPlan:
        out = self.node(self.root, "", self.refs.root_scope())
        if self.defs:
            out = (
                {"$defs": self.defs, **out}
                if isinstance(out, dict)
                else {"$defs": self.defs, "allOf": [out]}
            )
            self._pointers[id(out)] = (out, "")
        self.deferred.settle(out, self.refuse)
        distinct = bool(self._counted) and self._distinct_keys(out)
        return SchemaPlan(
            out,
            tuple(self.unenforced),
            tuple(self.patterns.python_source.items()),
            distinct,
            tuple(self.rewritten),
            MappingProxyType(self._pointers),
        )

    # -- services used by the rewrites -------------------------------------------------------
    def tick(self, cost: int = 1) -> None:
        """Charge analysis steps; fail fast once the budget is spent."""
        self.budget -= cost
        if self.budget < 0:
            raise ConstraintError(
                "schema analysis exceeded its budget; simplify the schema (fewer nested "
                "oneOf/not/if branches)",
                self._pointer,
                "",
            )

    def lookup(self, ref: str) -> dict | bool | None:
        """The analysed target of an output `$ref` (None while it is being analysed)."""
        if not ref.startswith("#/$defs/"):
            return None
        return self.defs.get(ref[len("#/$defs/") :])

    def refuse(self, pointer: str, keyword: str, reason: str) -> None:
        """Strict: raise. Lenient: record that the keyword is not enforced (caller drops it)."""
        if not self.lenient:
            raise ConstraintError(reason, pointer, keyword)
        self.unenforced.append(Unenforced(pointer, keyword, reason))

    def record(self, pointer: str, keyword: str, rewrite: str) -> None:
        """Note a rewrite applied to `keyword` at `pointer` (a `rewrite_log` name) for the
        receipt; only where what is compiled differs from the keyword as written."""
        self.rewritten.append(Rewritten(pointer, keyword, rewrite))

    def negate(
        self,
        s: dict | bool,
        pointer: str,
        keyword: str,
        within: frozenset[str] = ALL_TYPES,
        context: dict | bool = True,
        hold: bool = False,
    ) -> Any:
        """Exact negation of `s` among instances of `within` types that satisfy `context`.
        Returns None after refusing `keyword` (lenient mode); with `hold`, a negation that
        cannot be written is returned as a conjunct for a fold to settle (`schema_deferred`)."""
        self.negator.pointer, self.negator.made_fraction = pointer, False
        try:
            out = self.negator.negate(s, within, self._context_keys(context), context)
        except NotExpressible as e:
            reason = f"'{keyword}' cannot be enforced exactly: {e.reason}"
            if hold:
                return self.deferred.hold(s, pointer, keyword, reason)
            self.refuse(pointer, keyword, reason)
            return None
        if self.negator.made_fraction:
            self.record(pointer, keyword, log.FRACTION_CHECK)
        return out

    def _context_keys(self, context: dict | bool, depth: int = 0) -> frozenset[str] | None:
        """Property names objects satisfying `context` are limited to (through $ref/allOf)."""
        keys = closed_keys(context)
        if keys is not None or not isinstance(context, dict) or depth > 4:
            return keys
        subs = list(context.get("allOf", ()))
        if "$ref" in context:
            subs.append(self.lookup(context["$ref"]))
        for sub in subs:
            if sub is not None and (keys := self._context_keys(sub, depth + 1)) is not None:
                return keys
        return None

    # -- the walk ------------------------------------------------------------------------------
    def node(self, s: Any, pointer: str, scope: Any) -> dict | bool:
        """The analysed form of schema `s` found at `pointer`."""
        self._pointer = pointer
        self.tick()
        if isinstance(s, bool):
            return s
        if not isinstance(s, dict):
            raise ConstraintError("a subschema must be an object or a boolean", pointer, "")
        s = as_latest(s, self.dialect, pointer, self.record, ANNOTATIONS)
        if isinstance(s.get("$id", s.get("id")), str):
            scope = self.refs.enter(s, scope)
        out: dict = {}
        self._pointers[id(out)] = (out, pointer)
        extra: list = []
        origin: list[str] = []  # the keyword each conjunct in `extra` was rewritten from
        for key, value in s.items():
            if key in ANNOTATIONS:
                continue
            where = f"{pointer}/{escape_pointer(key)}"
            self._keyword(key, value, s, where, scope, out, extra)
            origin += [key] * (len(extra) - len(origin))
        self.rewrites.finish(s, pointer, out, extra)
        self._guard_min_properties(out, pointer)
        origin += ["uniqueItems"] * (len(extra) - len(origin))
        own = out.get("allOf", [])  # assigned in place below: key order is property order
        conjuncts = own + extra
        origin = [f"allOf/{i}" for i in range(len(own))] + origin
        if conjuncts:
            out["allOf"] = conjuncts
            folded = self.fold(out)
            if folded is not None:
                self.record(pointer, origin[0].split("/")[0], log.FOLDED_ENUM)
                return {"enum": folded} if folded else False
        while conjuncts:
            out["allOf"] = conjuncts
            if not self._oversized(out, conjuncts, origin, pointer):
                return out
        out.pop("allOf", None)  # lenient mode dropped every conjunct
        return out

    def fold(self, out: dict) -> list | None:
        """The values analysed node `out` accepts when its conjuncts bound it to a small finite
        domain (``schema_fold``); None otherwise."""
        return fold_finite(out, self.lookup, self.defs, self.patterns.judge_sources())

    def _guard_min_properties(self, out: dict, pointer: str) -> None:
        """The backend counts a repeated free-form key (additional or pattern properties) towards
        minProperties (``backends.quirks.REPEATED_KEYS_COUNT``), but a JSON parser keeps one of
        the two, so the count can come up short. Exact as it stands when the required keys
        alone reach the bound, when the bound is 1 (an object with a key written holds one,
        repeated or not), or every key is declared; otherwise only when outputs never repeat a
        key (`_distinct_keys`)."""
        bound = out.get("minProperties")
        if not isinstance(bound, int) or bound <= max(1, len(set(out.get("required", ())))):
            return
        if out.get("additionalProperties") is False and not out.get("patternProperties"):
            return
        self._counted.append((out, pointer))

    def _distinct_keys(self, schema: dict | bool) -> bool:
        """Whether the matcher may refuse repeated keys in `schema` without a dead end; if not,
        every `minProperties` that needed it is refused (lenient: dropped)."""
        sources = self.patterns.python_source
        risk = (
            dead_end_risk(schema, sources, self.algebra)
            if self.check_keys
            else "the output is not JSON alone"
        )
        if risk is None:
            for _, pointer in self._counted:
                self.record(f"{pointer}/minProperties", "minProperties", log.DISTINCT_KEYS)
            return True
        for node, pointer in self._counted:
            self.refuse(
                f"{pointer}/minProperties",
                "minProperties",
                "'minProperties' beyond the required keys cannot be enforced exactly on objects "
                f"with free-form keys here ({risk}, so repeated keys cannot be ruled out); list "
                "the keys in 'properties' with 'additionalProperties': false, or require them",
            )
            node.pop("minProperties", None)
        return False

    def _oversized(self, out: dict, conjuncts: list, origin: list[str], pointer: str) -> bool:
        """Refuse the conjunct that makes `out` expand past the backend's limit; in lenient
        mode drop it (reported) and return True so the caller rebuilds `out`."""
        worst = worst_conjunct(out, conjuncts, self.lookup, self._alternatives)
        if worst is None:
            return False
        total, i = worst
        keyword = origin[i].split("/")[0]
        what = f"the allOf of {len(conjuncts)} schemas" if keyword == "allOf" else f"'{keyword}'"
        what = self.describe.get(id(conjuncts[i]), what)
        self.refuse(
            f"{pointer}/{origin[i]}",
            keyword,
            f"{what} expands to {total} alternatives for the backend, over the limit of "
            f"{MAX_ALTERNATIVES}; make the branches mutually exclusive (e.g. a required "
            "property with a different `const` in each) or simplify the schema",
        )
        del conjuncts[i], origin[i]
        self._alternatives.clear()
        return True

    def _keyword(
        self, key: str, value: Any, s: dict, where: str, scope: Any, out: dict, extra: list
    ) -> None:
        if key == "type":
            out[key] = check_type(value, where)
        elif key in ("enum", "required"):
            out[key] = check_list(value, where, key, strings=key == "required")
        elif key == "const":
            out[key] = value
        elif key == "pattern":
            self._pattern(value, where, out)
        elif key in _NON_NEGATIVE_INT:
            out[key] = check_count(value, where, key)
        elif key in _NUMBERS:
            out[key] = check_number(value, where, key)
        elif key in _SCHEMA_MAPS:
            out[key] = self._schema_map(value, where, scope, _closed_by_one_pattern(s))
        elif key in _SCHEMA_LISTS:
            out[key] = [
                self.node(sub, f"{where}/{i}", scope)
                for i, sub in enumerate(check_list(value, where, key))
            ]
        elif key in _SINGLE_SCHEMAS:
            self._single_schema(key, value, s, where, scope, out)
        elif key == "$ref":
            out[key] = self._ref(value, where, scope)
        elif key == "format":
            self._format(value, where, out, extra)
        else:
            self.rewrites.apply(key, value, s, where, scope, out, extra)

    def _schema_map(self, value: Any, where: str, scope: Any, closed: bool = False) -> dict:
        if not isinstance(value, dict):
            raise ConstraintError("must be an object of schemas", where, where.rsplit("/", 1)[-1])
        out = {k: self.node(v, f"{where}/{escape_pointer(k)}", scope) for k, v in value.items()}
        if where.endswith("/patternProperties"):
            return self.patterns.key_patterns(out, where, closed)
        return out

    def _pattern(self, value: Any, where: str, out: dict) -> None:
        if not isinstance(value, str):
            raise ConstraintError("pattern must be a string", where, "pattern")
        regex = self.patterns.translate(value, where, "pattern", exact=False)
        if regex is not None:
            out["pattern"] = regex

    def _single_schema(
        self, key: str, value: Any, s: dict, where: str, scope: Any, out: dict
    ) -> None:
        if key == "items" and isinstance(value, list):  # drafts before 2020-12: a tuple
            self.record(where, key, log.ITEMS_TUPLE)
            out["prefixItems"] = [self.node(v, f"{where}/{i}", scope) for i, v in enumerate(value)]
            if "additionalItems" in s:
                out["items"] = self.node(
                    s["additionalItems"], where[: -len("items")] + "additionalItems", scope
                )
            return
        out[key] = self.node(value, where, scope)

    def _ref(self, ref: Any, where: str, scope: Any) -> str:
        if not isinstance(ref, str):
            raise ConstraintError("$ref must be a string", where, "$ref")
        target, inner_scope, target_ptr = self.refs.resolve(ref, scope, where)
        if target is self.root:
            return "#"
        name = self._def_names.get(id(target))
        if name is None:
            name = f"d{len(self._def_names)}"
            self._def_names[id(target)] = name
            self.defs[name] = None  # in progress: recursive references see it as opaque
            ptr = target_ptr[1:] if target_ptr.startswith("#") else target_ptr
            self.defs[name] = self.node(target, ptr, inner_scope)
            self._pointer = where
        return f"#/$defs/{name}"

    def _format(self, name: Any, where: str, out: dict, extra: list) -> None:
        if not isinstance(name, str):
            raise ConstraintError("format must be a string", where, "format")
        constraint = format_constraint(name)
        if constraint is None:
            self.refuse(
                where,
                "format",
                f"format {name!r} is checked by the validator but cannot be enforced",
            )
        elif constraint:
            regex = self.patterns.translate(constraint["pattern"], where, "format", exact=False)
            extra.append({**constraint, "pattern": regex})
            self.record(where, "format", log.FORMAT_PATTERN)


def _closed_by_one_pattern(s: dict) -> bool:
    """Whether node `s` has one pattern key, `additionalProperties: false` and no declared
    name holding NUL: a key that pattern's backend regex misses is then refused."""
    names = s.get("properties")
    return (
        s.get("additionalProperties") is False
        and isinstance(s.get("patternProperties"), dict)
        and len(s["patternProperties"]) == 1
        and not (isinstance(names, dict) and any("\x00" in n for n in names))
    )
