"""Reading tool calls back as the text arrives: content, call starts, argument deltas.

The constraint (a structural tag, see ``api.tools``) guarantees the shape of the output: free
text without a trigger, or a call opener (``begin``: the trigger and the function's name), one
JSON value, the format's ``end``. So a small scanner that walks the same strings and tracks the
JSON value's nesting knows, at every character, where the output stands: in free text, inside an
opener (held back until the function's name is known), inside the arguments (passed on as they
arrive), or in the end string. It never re-parses what it has passed, so the deltas do not depend
on how the text was cut into tokens (multi-token jump-forward included), and feeding the whole
text at once gives exactly what feeding it piece by piece gave: streamed and non-streamed
responses agree.

Without a constraint (a format forced on a model that ignores it) the same scanner applies; text
that starts like an opener and then turns out not to be one is released as content.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.api.responses import new_id

_TEXT, _OPENING, _ARGS, _END = range(4)
_SCALAR = set("0123456789+-.eEtrufalsn")


@dataclass
class ScannedCall:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class Piece:
    """What became known: ``text`` (free text), or for call ``index`` its start (``name`` and
    ``id`` set) or an ``arguments`` delta."""

    index: int = -1
    text: str = ""
    name: str | None = None
    id: str | None = None
    arguments: str = ""


@dataclass
class CallScanner:
    """Incremental reader of one choice's output under a tool-call format.

    ``begins``: every call opener and the function it names; ``calls_only``: the output is
    calls and separators (``tool_choice: "required"``), so text between them is not content.
    """

    begins: dict[str, str]
    triggers: tuple[str, ...]
    end: str
    calls_only: bool = False
    calls: list[ScannedCall] = field(default_factory=list)
    _buf: str = ""
    _state: int = _TEXT
    _depth: int = 0
    _in_string: bool = False
    _escape: bool = False
    _scalar: bool = False

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return [p for p in out if not (p.text and self.calls_only)]

    def finish(self) -> list[Piece]:
        """At the end of the output: whatever is held back that is no call, as text."""
        out = []
        if self._state in (_TEXT, _OPENING) and self._buf:
            out.append(Piece(text=self._buf))
        self._buf = ""
        return [p for p in out if not (p.text and self.calls_only)]

    def _step(self, out: list[Piece]) -> bool:
        if not self._buf:
            return False
        if self._state == _TEXT:
            return self._text(out)
        if self._state == _OPENING:
            return self._opening(out)
        if self._state == _ARGS:
            return self._args(out)
        return self._end()

    def _text(self, out: list[Piece]) -> bool:
        hits = [i for i in (self._buf.find(t) for t in self.triggers) if i >= 0]
        if hits:
            cut = min(hits)
            self._state = _OPENING
        else:
            cut = len(self._buf) - _held_back(self._buf, self.triggers)
        if cut:
            out.append(Piece(text=self._buf[:cut]))
            self._buf = self._buf[cut:]
        return bool(hits)

    def _opening(self, out: list[Piece]) -> bool:
        for begin, name in self.begins.items():
            if self._buf.startswith(begin):
                call = ScannedCall(new_id("call_"), name)
                self.calls.append(call)
                out.append(Piece(index=len(self.calls) - 1, name=name, id=call.id))
                self._buf = self._buf[len(begin) :]
                self._state, self._depth = _ARGS, 0
                self._in_string = self._escape = self._scalar = False
                return True
        if any(begin.startswith(self._buf) for begin in self.begins):
            return False  # the name is still being written
        out.append(Piece(text=self._buf[0]))  # not an opener after all
        self._buf, self._state = self._buf[1:], _TEXT
        return True

    def _args(self, out: list[Piece]) -> bool:
        taken = 0
        for ch in self._buf:
            if self._scalar and ch not in _SCALAR:  # ``ch`` follows a finished top-level scalar
                self._state = _END
                break
            taken += 1
            if self._track(ch):
                self._state = _END
                break
        delta, self._buf = self._buf[:taken], self._buf[taken:]
        if not self.calls[-1].arguments:
            delta = delta.lstrip()
        if delta:
            self.calls[-1].arguments += delta
            out.append(Piece(index=len(self.calls) - 1, arguments=delta))
        return self._state == _END

    def _track(self, ch: str) -> bool:
        """Follow the JSON value through ``ch``; True when ``ch`` completed it."""
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
                return self._depth == 0
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            return self._depth == 0
        elif ch == '"':
            self._in_string = True
        elif ch in _SCALAR and self._depth == 0:
            self._scalar = True
        return False

    def _end(self) -> bool:
        if self._buf.startswith(self.end):
            self.calls[-1].complete = True
            self._buf, self._state = self._buf[len(self.end) :], _TEXT
            return True
        if self.end.startswith(self._buf):
            return False
        self.calls[-1].complete = True  # no end string (an unconstrained model's output)
        self._state = _TEXT
        return True


def _held_back(text: str, triggers: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that could grow into a trigger."""
    best = 0
    for t in triggers:
        for n in range(min(len(t) - 1, len(text)), best, -1):
            if text.endswith(t[:n]):
                best = n
                break
    return best
