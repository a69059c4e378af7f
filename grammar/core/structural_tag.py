"""Structural tags: free text, then tagged segments whose content a JSON schema constrains.

A structural tag (SGLang's and vLLM's ``structural_tag`` response format, xgrammar's
``triggered_tags``) declares ``structures`` — each a ``begin`` string, a JSON ``schema`` and an
``end`` string — and ``triggers``. Outside a segment the output is free text that contains no
trigger; once a trigger appears, the output must continue with the rest of a structure's
``begin`` whose ``begin`` starts with that trigger, then a JSON value valid for its schema, then
its ``end``; then free text again (or the end of the output).

Options (xgrammar's names): ``at_least_one`` — the output holds at least one segment;
``stop_after_first`` — the output ends right after the first segment. Corral adds
``free_text: false`` (xgrammar's ``tags_with_separator``): segments only — at least one — one
after another, joined by ``separator``; tool calling uses it for ``tool_choice: "required"``.

It compiles to one llguidance Lark grammar: free text is the lexeme ``TEXT`` (any text without
a trigger); a trigger closes a *lazy* lexeme (``TEXT "trigger"``: it ends as soon as the trigger
is written), the rest of ``begin`` and ``end`` are literals, and each schema is embedded with
``%json`` after Corral's own analysis (fail closed). A trigger that is one special token of the
tokenizer (``<|python_tag|>``, ``[TOOL_CALLS]``) is matched as that token (``<[id]>``), never as
text: the model writes it as one token, and text cannot spell it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.grammar.core.errors import ConstraintError, Unenforced
from corral.grammar.regex.translate import literal_regex


@dataclass(frozen=True)
class TagStructure:
    begin: str
    schema: dict[str, Any] | bool
    end: str


@dataclass(frozen=True)
class StructuralTag:
    """A structural tag as parsed from a spec's canonical source (see the module docstring)."""

    structures: tuple[TagStructure, ...]
    triggers: tuple[str, ...]
    at_least_one: bool = False
    stop_after_first: bool = False
    free_text: bool = True
    separator: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "structures": [
                {"begin": s.begin, "schema": s.schema, "end": s.end} for s in self.structures
            ],
            "triggers": list(self.triggers),
            "at_least_one": self.at_least_one,
            "stop_after_first": self.stop_after_first,
            "free_text": self.free_text,
            "separator": self.separator,
        }

    def trigger_of(self, begin: str) -> str:
        """The longest trigger ``begin`` starts with ("" when it starts with none)."""
        return max((t for t in self.triggers if begin.startswith(t)), key=len, default="")


_OPTIONS = {"at_least_one": bool, "stop_after_first": bool, "free_text": bool, "separator": str}


def parse_structural_tag(value: Any) -> StructuralTag:
    """Check a structural tag given as JSON data; raises ConstraintError with a pointer."""
    if not isinstance(value, dict):
        raise ConstraintError("a structural tag must be a JSON object", keyword="structural_tag")
    unknown = sorted(set(value) - {"structures", "triggers", "type", *_OPTIONS})
    if unknown:
        raise ConstraintError(f"unknown structural tag field {unknown[0]!r}", f"/{unknown[0]}")
    structures = value.get("structures")
    if not isinstance(structures, list) or not structures:
        raise ConstraintError("structures must be a non-empty list", "/structures")
    parsed = tuple(_structure(s, i) for i, s in enumerate(structures))
    triggers = value.get("triggers")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise ConstraintError("triggers must be a list of non-empty strings", "/triggers")
    options = {}
    for name, kind in _OPTIONS.items():
        if name in value:
            if not isinstance(value[name], kind):
                raise ConstraintError(f"{name} must be a {kind.__name__}", f"/{name}")
            options[name] = value[name]
    tag = StructuralTag(parsed, tuple(triggers), **options)
    for i, s in enumerate(parsed):
        if tag.free_text and not tag.trigger_of(s.begin):
            raise ConstraintError(
                f"begin {s.begin!r} starts with none of the triggers; every structure's begin "
                "must start with one of them",
                f"/structures/{i}/begin",
            )
    if tag.free_text and not triggers:
        raise ConstraintError("triggers must not be empty", "/triggers")
    for k, t in enumerate(triggers):
        if any(u != t and u.startswith(t) for u in triggers):
            # free text ends at the first trigger written: the longer one could never start
            raise ConstraintError(
                f"trigger {t!r} is the start of another trigger", f"/triggers/{k}"
            )
    return tag


def _structure(s: Any, i: int) -> TagStructure:
    at = f"/structures/{i}"
    if not isinstance(s, dict) or set(s) - {"begin", "schema", "end"}:
        raise ConstraintError("a structure is an object with begin, schema and end", at)
    begin, end, schema = s.get("begin"), s.get("end", ""), s.get("schema", True)
    if not isinstance(begin, str) or not begin:
        raise ConstraintError("begin must be a non-empty string", f"{at}/begin")
    if not isinstance(end, str):
        raise ConstraintError("end must be a string", f"{at}/end")
    if not isinstance(schema, dict | bool):
        raise ConstraintError("schema must be a JSON schema (object or boolean)", f"{at}/schema")
    return TagStructure(begin, schema, end)


#: (analysed schema, what lenient mode left out) for one structure's schema, pointers relative.
Analyse = Callable[[dict[str, Any] | bool], tuple[dict[str, Any] | bool, tuple[Unenforced, ...]]]


def structural_tag_lark(
    tag: StructuralTag,
    json_options: dict[str, Any],
    special_token: Callable[[str], int | None],
    analyse: Analyse,
) -> tuple[str, tuple[Unenforced, ...]]:
    """The Lark grammar of ``tag`` and the lenient report (pointers into the tag's source).

    ``special_token(text)``: the id of the special token that is exactly ``text``, or None.
    ``analyse``: Corral's schema analysis (fail closed); its errors are re-pointed here.
    """
    unenforced: list[Unenforced] = []
    text_triggers = [t for t in tag.triggers if special_token(t) is None]
    rules = []
    for i, s in enumerate(tag.structures):
        at = f"/structures/{i}/schema"
        try:
            schema, left_out = analyse(s.schema)
        except ConstraintError as e:
            raise ConstraintError(e.reason, at + e.pointer, e.keyword, e.limit) from e
        unenforced += [Unenforced(at + u.pointer, u.keyword, u.reason) for u in left_out]
        trigger = tag.trigger_of(s.begin)
        opener = _opener(trigger, tag, special_token)
        parts = [opener, _literal(s.begin[len(trigger) :]), _json_rule(schema, json_options)]
        rules.append(f"seg_{i}: " + " ".join(p for p in [*parts, _literal(s.end)] if p))
    rules.append("seg: " + " | ".join(f"seg_{i}" for i in range(len(tag.structures))))
    rules.append(_text_lexeme(text_triggers))
    for k, t in enumerate(text_triggers):
        rules.append(f"trig_{k}[lazy]: TEXT {_literal(t)}")
    return "\n".join([_start(tag), *rules]), tuple(unenforced)


def _start(tag: StructuralTag) -> str:
    if tag.free_text:
        if tag.stop_after_first:
            return "start: seg" if tag.at_least_one else "start: TEXT | seg"
        return f"start: seg{'+' if tag.at_least_one else '*'} TEXT"
    if tag.stop_after_first:
        return "start: seg"
    if not tag.separator:
        return "start: seg+"
    return f"start: seg ({_literal(tag.separator)} seg)*"


def _opener(trigger: str, tag: StructuralTag, special_token: Callable[[str], int | None]) -> str:
    """What a segment starts with: free text and its trigger (free-text mode), or the trigger."""
    if not trigger:
        return ""
    token = special_token(trigger)
    if token is not None:
        return f"TEXT <[{token}]>" if tag.free_text else f"<[{token}]>"
    if not tag.free_text:
        return _literal(trigger)
    return f"trig_{[t for t in tag.triggers if special_token(t) is None].index(trigger)}"


def _text_lexeme(text_triggers: list[str]) -> str:
    """Free text: anything that does not contain a (textual) trigger."""
    if not text_triggers:
        return r"TEXT: /(?s:.*)/"
    alternatives = "|".join(literal_regex(t) for t in text_triggers)
    return rf"TEXT: /(?s:.*)/ & ~/(?s:.*)(?:{alternatives})(?s:.*)/"


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def _json_rule(schema: dict[str, Any] | bool, json_options: dict[str, Any]) -> str:
    if schema is False:
        raise ConstraintError("the schema is `false`: no value is valid", keyword="false")
    body = {} if schema is True else dict(schema)
    return "%json " + json.dumps(body | {"x-guidance": json_options}, ensure_ascii=False)
