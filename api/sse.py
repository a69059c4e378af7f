"""Server-sent events: each JSON payload framed so that no client's line splitter cuts it.

JSON text may hold U+0085 (NEL), U+2028 and U+2029 unescaped inside strings, and JSON encoders
that keep non-ASCII text as it is (pydantic's, ``json.dumps(ensure_ascii=False)``) do. SSE ends
lines only at CR and LF, but clients split with ``str.splitlines`` (httpx's ``iter_lines``, so
everything built on it), which also ends a line at each of those three: a streamed answer
holding one arrived as two lines, neither of them JSON. Escaped (``\\u2028``) they are the same
JSON value on one line; outside strings JSON never holds them, so escaping is always exact.
"""

from __future__ import annotations

_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})

DONE = "data: [DONE]\n\n"


def data_event(json_text: str, event: str | None = None) -> str:
    """One event whose data is ``json_text`` (with an ``event:`` name line when given)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json_text.translate(_LINE_ENDS)}\n\n"
