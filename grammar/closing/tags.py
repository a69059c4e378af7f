"""Budget closing for structural tags: tool calls that are complete when `max_tokens` runs out.

A structural tag's output (`grammar.structural_tag`) is free text and segments, each a
structure's ``begin``, a JSON value for its schema, and its ``end`` — a tool call in the
served model's format. `TagCloser` gives `engine.budget_close` the same two answers
`shortest.JsonCloser` gives for a bare JSON schema, through `PartialTag` (the parser it feeds
the output to): the shortest text that completes the output from where it is —

- inside a segment's JSON: the JSON's closing (`partial_json`), then the structure's ``end``;
- inside ``end``: the rest of it;
- inside a ``begin`` (after a trigger, or where segments only are allowed): the rest of the
  ``begin`` of the structure whose call is shortest, its schema's shortest instance, ``end``;
- in free text, or right after a segment: nothing, unless a segment is still owed
  (``at_least_one`` or segments only, none yet; a separator typed after a segment).

The pointers a closing cuts short are prefixed with the segment's index (``/0/...``: the first
call's arguments). As for bare JSON, the answer is a proposal that the engine runs through the
sequence's matcher before relying on it.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from corral.grammar.closing.partial_json import CharStream, PartialJson
from corral.grammar.closing.shortest import JsonCloser

if TYPE_CHECKING:
    from corral.grammar.closing.partial_values import Frame
    from corral.grammar.core.structural_tag import StructuralTag


class TagCloser:
    """Closings for one structural tag; immutable once built, share it."""

    def __init__(self, tag: StructuralTag, closers: list[JsonCloser]) -> None:
        self.tag = tag
        self.closers = closers  # one per structure
        self.calls = [
            None if (body := c.shortest(c.root)) is None else s.begin + body + s.end
            for s, c in zip(tag.structures, closers, strict=True)
        ]
        # the text outside segments that can still matter: a separator and a begin
        self.window = len(tag.separator) + max((len(s.begin) for s in tag.structures), default=0)

    @classmethod
    def for_spec(cls, spec: Any) -> TagCloser:
        """The closer of a structural_tag `ConstraintSpec`: each structure's schema analysed as
        its grammar embeds it (same strictness and JSON layout)."""
        from corral.grammar.core.spec import ConstraintSpec

        tag = spec.structural_tag()
        closers: dict[str, JsonCloser] = {}  # a function's openers share one schema
        for s in tag.structures:
            key = repr(s.schema)
            if key not in closers:
                sub = ConstraintSpec.json_schema(
                    s.schema, strict=spec.strict, json_format=spec.json_format
                )
                closers[key] = JsonCloser.for_spec(sub)
        return cls(tag, [closers[repr(s.schema)] for s in tag.structures])

    def start(self) -> PartialTag:
        return PartialTag(self)


class PartialTag(CharStream):
    """The output so far under a `TagCloser` (interface of `partial_json.PartialJson`)."""

    def __init__(self, closer: TagCloser) -> None:
        self.closer = closer
        self.outside = ""  # text since the last segment ended (or since the start)
        self.segment: int | None = None  # the structure being written, once its begin is
        self.json: PartialJson | None = None
        self.ended = 0  # characters of the structure's end written
        self.count = 0  # segments complete
        self.broken = False

    def copy(self) -> PartialTag:
        new = copy.copy(self)
        new.json = None if self.json is None else self.json.copy()
        return new

    def open_string(self) -> Frame | None:
        """The string being written inside a segment's JSON (None in free text or a tag)."""
        if self.segment is None or self.json is None or _done(self.json):
            return None
        return self.json.open_string()

    def _char(self, ch: str) -> None:
        tag = self.closer.tag
        if self.segment is None:
            self.outside = (self.outside + ch)[-self.closer.window :]
            for i, s in enumerate(tag.structures):
                if self.outside.endswith(s.begin):
                    self.segment, self.json = i, PartialJson.empty(self.closer.closers[i])
                    return
            return
        end = tag.structures[self.segment].end
        if self.json is not None and not _done(self.json):
            self.json.feed(ch)
            self.broken = self.json.broken
        elif end[self.ended : self.ended + 1] == ch:
            self.ended += 1
            if self.ended == len(end):
                self.segment, self.json, self.ended, self.outside = None, None, 0, ""
                self.count += 1
        else:
            self.broken = True  # text between the JSON and the end: not modelled

    def closing(self) -> tuple[str, list[str]] | None:
        """The shortest text found that completes the output, and the JSON pointers it cuts
        short; None when unknown."""
        if self.broken:
            return None
        if self.segment is not None:
            end = self.closer.tag.structures[self.segment].end
            if self.json is None or _done(self.json):
                return end[self.ended :], []
            found = self.json.closing()
            if found is None:
                return None
            return found[0] + end, [f"/{self.count}{p}" for p in found[1]]
        return self._from_outside()

    def _from_outside(self) -> tuple[str, list[str]] | None:
        tag, text = self.closer.tag, self.outside
        owed = self.count == 0 and (tag.at_least_one or not tag.free_text)
        options: list[str] = []
        if tag.free_text:
            # free text may end here unless a trigger was written (then a begin must follow)
            if not owed and not any(t in text for t in tag.triggers):
                options.append("")
            heads = [text[i:] for i in range(len(text) + 1)]  # a begin may start anywhere

        else:
            if self.count and not text:
                options.append("")
            heads = [text]
        lead = tag.separator if self.count and not tag.free_text else ""
        for call in self.closer.calls:
            if call is None:
                continue
            whole = lead + call
            for head in heads:
                if whole.startswith(head) and (head or not tag.free_text or owed):
                    options.append(whole[len(head) :])
        best = min(options, key=len, default=None)
        return None if best is None else (best, [f"/{self.count}"] if best else [])


def _done(partial: PartialJson) -> bool:
    """Whether the JSON value is complete (nothing more may be added to it)."""
    top = partial.stack[0]
    return len(partial.stack) == 1 and top.state == "done"
