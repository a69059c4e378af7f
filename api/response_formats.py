"""The constraint a request asks for: its response formats, in every dialect, and its ConstraintSpec.

A request names its constraint in one of several dialects: OpenAI's ``response_format``
(``json_object``, ``json_schema``) and Corral's extra types (``regex``, ``grammar``,
``choice``); vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
and ``structured_outputs``; SGLang's ``regex`` / ``json_schema`` / ``ebnf``. ``fold_constraint``
turns them into one response format while the request is parsed (two constraints are a 400),
and ``format_spec`` turns that format into a ConstraintSpec, the one path from a request to
its constraint. A folded format remembers the field it came from (``param``), which errors and
lenient-mode reports name.

The compile is awaited before any status line is sent, so a bad schema or grammar is a 400 even
for ``stream: true``; compile errors name the request field they came from.

Copies: `format_spec` passes the client's schema (or `close_objects` of it) to
`ConstraintSpec.json_schema`, which serialises it; the request's schema is never changed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from corral.api.errors import ApiError, constraint_error
from corral.api.responses import Unenforced
from corral.api.schema_forms import SchemaForms, form_of
from corral.grammar import CompiledConstraint, ConstraintError, ConstraintSpec, JsonFormat
from corral.grammar.schema.closed_objects import close_objects

if TYPE_CHECKING:
    from corral.schema_cache.entries import Lookup


def request_error(
    loc: tuple[str | int, ...], message: str, kind: str = "invalid_value"
) -> ValidationError:
    """A validation error at ``loc`` (a path in the request body), raised while parsing: the API
    answers it with a 400 whose ``param`` is that path."""
    detail = InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=None)
    return ValidationError.from_exception_data("request", [detail])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# -- response formats ---------------------------------------------------------------------------


class _Format(_Strict):
    """A response format; one folded from another field remembers that field (``param``) and
    the options that came with it (vLLM's ``structured_outputs``)."""

    _origin: str | None = PrivateAttr(default=None)
    _force_closed: bool = PrivateAttr(default=False)  # disable_additional_properties: true
    _flexible_json: bool = PrivateAttr(default=False)  # disable_any_whitespace: false

    @property
    def param(self) -> str:
        """The request field this constraint came from (named in errors and reports)."""
        return self._origin or self._default_param()

    def _default_param(self) -> str:
        return "response_format"


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)
    name: str = Field(max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = Field(
        default=None,
        description="true or absent: every keyword is enforced exactly or the request fails (400); "
        "false: lenient, keywords that cannot be enforced are listed in the response",
    )


class TextFormat(_Format):
    type: Literal["text"]


class JsonObjectFormat(_Format):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Format):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat
    _form: str | None = PrivateAttr(default=None)
    _form_known: bool = PrivateAttr(default=False)

    def schema_form(self) -> str | None:
        """The schema's form (``schema_forms.form_of``), computed once per request."""
        if not self._form_known:
            self._form, self._form_known = form_of(self.json_schema.schema_), True
        return self._form

    def _default_param(self) -> str:
        return "response_format.json_schema.schema"


class RegexFormat(_Format):
    """Corral extension: the output matches this regular expression (whole output)."""

    type: Literal["regex"]
    regex: str = Field(min_length=1)

    def _default_param(self) -> str:
        return "response_format.regex"


class GrammarFormat(_Format):
    """Corral extension: the output is a sentence of this grammar (GBNF-style EBNF or Lark)."""

    type: Literal["grammar"]
    grammar: str = Field(min_length=1)
    syntax: Literal["ebnf", "lark"] = "ebnf"

    def _default_param(self) -> str:
        return "response_format.grammar"


class ChoiceFormat(_Format):
    """Corral extension: the output is exactly one of these strings."""

    type: Literal["choice"]
    choice: list[str] = Field(min_length=1)

    def _default_param(self) -> str:
        return "response_format.choice"


class StructuralTagFormat(_Format):
    """SGLang's and vLLM's structural tag: free text, and after a trigger a tagged segment whose
    content a JSON schema constrains (see ``grammar.structural_tag``). ``at_least_one`` and
    ``stop_after_first`` are xgrammar's options of the same name; Corral's ``free_text: false``
    allows segments only, joined by ``separator`` (xgrammar's ``tags_with_separator``)."""

    type: Literal["structural_tag"]
    structures: list[dict[str, Any]] = Field(min_length=1)
    triggers: list[str] = Field(default_factory=list)
    at_least_one: bool = False
    stop_after_first: bool = False
    free_text: bool = True
    separator: str = ""

    def _default_param(self) -> str:
        return "response_format"


ResponseFormat = Annotated[
    TextFormat
    | JsonObjectFormat
    | JsonSchemaResponseFormat
    | RegexFormat
    | GrammarFormat
    | ChoiceFormat
    | StructuralTagFormat,
    Field(discriminator="type"),
]


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: one constraint, and options on how it is enforced."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1)
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, min_length=1)
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = Field(
        default=None, description="not supported: refused with a 400"
    )
    whitespace_pattern: str | None = Field(
        default=None, description="not supported: refused with a 400"
    )
    disable_any_whitespace: bool | None = Field(
        default=None, description="true: compact JSON (Corral's default); false: JSON may "
        "carry whitespace between tokens (a few characters at each place)",
    )  # fmt: skip
    disable_additional_properties: bool | None = Field(
        default=None, description="true: objects get only their declared properties "
        "(see open_objects); false: the request's or the server's open_objects setting",
    )  # fmt: skip
    disable_fallback: bool = Field(
        default=False, description="accepted either way: Corral never falls back to a weaker "
        "constraint (a constraint it cannot enforce exactly is a 400)",
    )  # fmt: skip


# -- the dialects, folded into one format -------------------------------------------------------

#: Top-level request fields of vLLM and SGLang that name a constraint, and what kind it is.
DIALECT_FIELDS = (
    ("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
    ("guided_grammar", "grammar"), ("regex", "regex"), ("json_schema", "json"), ("ebnf", "ebnf"),
)  # fmt: skip
NO_WHITESPACE_PATTERN = (
    "a custom whitespace pattern is not supported; JSON is compact unless "
    "structured_outputs.disable_any_whitespace is false"
)


def fold_constraint(
    response_format: _Format | None,
    dialect_values: dict[str, Any],
    structured_outputs: StructuredOutputs | None,
) -> _Format | None:
    """The one response format a request's constraint fields stand for (``response_format``
    itself when no other field is set). Raises a validation error at the second field when
    two fields constrain the output, or at an option that cannot be honoured."""
    sources = _sources(response_format, dialect_values, structured_outputs)
    if len(sources) > 1:
        first, second = sources[0].param, sources[1].param
        raise request_error(
            tuple(second.split(".")),
            f"{first} and {second} both constrain the output; send only one of them",
        )
    fmt = sources[0] if sources else response_format
    if structured_outputs is not None and fmt is not None:
        fmt._force_closed = structured_outputs.disable_additional_properties is True
        fmt._flexible_json = structured_outputs.disable_any_whitespace is False
    return fmt


def _sources(
    response_format: _Format | None, values: dict[str, Any], so: StructuredOutputs | None
) -> list[_Format]:
    found = []
    if response_format is not None and not isinstance(response_format, TextFormat):
        found.append(response_format)
    candidates = [(field, kind, values.get(field)) for field, kind in DIALECT_FIELDS]
    if so is not None:
        if so.structural_tag is not None:
            raise request_error(("structured_outputs", "structural_tag"), "not supported")
        if so.whitespace_pattern is not None:
            raise request_error(("structured_outputs", "whitespace_pattern"), NO_WHITESPACE_PATTERN)
        candidates += [
            ("structured_outputs.json", "json", so.json_),
            ("structured_outputs.regex", "regex", so.regex),
            ("structured_outputs.choice", "choice", so.choice),
            ("structured_outputs.grammar", "grammar", so.grammar),
            ("structured_outputs.json_object", "json_object", so.json_object or None),
        ]
    for param, kind, value in candidates:
        if value is not None:
            fmt = _format_of(param, kind, value)
            fmt._origin = param
            found.append(fmt)
    return found


def _format_of(param: str, kind: str, value: Any) -> _Format:
    """The response format a dialect's constraint field stands for."""
    if kind == "json":
        schema = _schema(param, value)
        return JsonSchemaResponseFormat(
            type="json_schema",
            json_schema=JsonSchemaFormat(name=param.split(".")[0], schema=schema),
        )
    if kind == "regex":
        return RegexFormat(type="regex", regex=value)
    if kind == "choice":
        return ChoiceFormat(type="choice", choice=value)
    if kind == "json_object":
        return JsonObjectFormat(type="json_object")
    # vLLM takes GBNF (``root ::= ...``) or Lark (``start: ...``) and tells them apart by "::="
    syntax = "ebnf" if kind == "ebnf" or "::=" in value else "lark"
    return GrammarFormat(type="grammar", grammar=value, syntax=syntax)


def _schema(param: str, value: dict[str, Any] | str) -> dict[str, Any] | bool:
    """A schema given as an object or as JSON text (vLLM and SGLang accept text)."""
    if isinstance(value, dict):
        return value
    try:
        schema = json.loads(value)
    except (ValueError, RecursionError) as e:
        reason = "it is nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise request_error(tuple(param.split(".")), f"not a JSON schema: {reason}") from None
    if not isinstance(schema, dict | bool):
        raise request_error(tuple(param.split(".")), "a JSON schema is an object or a boolean")
    return schema


# -- format -> ConstraintSpec -------------------------------------------------------------------


@dataclass(frozen=True)
class FormatSpec:
    """A constraint and the request field it came from (for error messages); ``closed``:
    whether ``close_objects`` narrowed its schema (a rewrite the receipt names)."""

    spec: ConstraintSpec
    param: str
    closed: bool = False


def wants_closed_objects(open_objects: bool | None, server_default_open: bool) -> bool:
    """Whether a request's schemas get closed objects (see ``grammar.schema_close``)."""
    return not (server_default_open if open_objects is None else open_objects)


def format_spec(
    fmt: ResponseFormat | None, forms: SchemaForms, closed: bool = True
) -> FormatSpec | None:
    """The constraint a (folded) response format asks for; None for plain text. Raises a 400.

    ``forms``: the server's schema forms (a json_schema's spec is derived once per form).
    ``closed``: generate only the declared properties of objects whose schema is silent about
    extra keys (a narrowing: the output is still valid against the schema as sent)."""
    try:
        return _format_spec(fmt, forms, closed)
    except ConstraintError as e:
        raise constraint_error(e, fmt.param if fmt is not None else "response_format") from e


def _format_spec(fmt: ResponseFormat | None, forms: SchemaForms, closed: bool) -> FormatSpec | None:
    if fmt is None or isinstance(fmt, TextFormat):
        return None
    layout = JsonFormat(flexible=True) if fmt._flexible_json else None
    if isinstance(fmt, JsonObjectFormat):
        return FormatSpec(ConstraintSpec.json_object(json_format=layout), fmt.param)
    if isinstance(fmt, JsonSchemaResponseFormat):
        strict = fmt.json_schema.strict is not False  # absent means strict: fail closed
        closing = closed or fmt._force_closed
        key = (fmt.schema_form(), strict, closing, layout is not None)
        found = forms.spec(key)  # derived before, here or (seeded) on another replica
        if found is None:
            sent = fmt.json_schema.schema_
            schema = close_objects(sent) if closing else sent
            spec = ConstraintSpec.json_schema(schema, strict=strict, json_format=layout)
            found = spec, schema != sent
            forms.remember(key, *found)
        return FormatSpec(found[0], fmt.param, found[1])
    if isinstance(fmt, RegexFormat):
        return FormatSpec(ConstraintSpec.regex(fmt.regex), fmt.param)
    if isinstance(fmt, GrammarFormat):
        make = ConstraintSpec.lark if fmt.syntax == "lark" else ConstraintSpec.ebnf
        return FormatSpec(make(fmt.grammar), fmt.param)
    if isinstance(fmt, StructuralTagFormat):
        tag = fmt.model_dump(exclude={"type"})
        narrowed = False
        if closed or fmt._force_closed:
            structures = []
            for s in tag["structures"]:
                schema = close_objects(s["schema"]) if "schema" in s else None
                narrowed |= schema != s.get("schema")
                structures.append(s if schema is None else s | {"schema": schema})
            tag["structures"] = structures
        spec = ConstraintSpec.structural_tag_of(tag, json_format=layout)
        return FormatSpec(spec, fmt.param, narrowed)
    return FormatSpec(ConstraintSpec.choice(fmt.choice), fmt.param)


#: The compile service's ``alookup``: the compiled constraint and where it came from.
CompileFn = Callable[[ConstraintSpec], Awaitable["Lookup"]]


async def compile_or_400(
    compile_fn: CompileFn,
    spec: ConstraintSpec,
    on_error: Callable[[ConstraintError], ApiError],
) -> Lookup:
    """Await the compile; a ConstraintError becomes the 400 that ``on_error`` builds."""
    try:
        return await compile_fn(spec)
    except ConstraintError as e:
        raise on_error(e) from e


def unenforced_report(
    compiled: CompiledConstraint | None, param: str, extra: tuple = ()
) -> list[Unenforced] | None:
    """Lenient mode's list of keywords that were not enforced; None when there are none."""
    items = [(u.pointer, u.keyword, u.reason) for u in (compiled.unenforced if compiled else ())]
    items += list(extra)
    if not items:
        return None
    return [Unenforced(pointer=p, keyword=k, reason=r, param=param) for p, k, r in items]
