"""Hypothesis strategies for text a user who does not write English sends: the class of input
that breaks byte-level code paths, drawn rather than picked.

Each drawn string mixes characters from classes that stress different parts of a server:

- **multi-byte**: two-byte Latin and Greek letters, three-byte CJK and symbols (``°``, ``€``);
  a token often ends inside one of them;
- **astral**: four-byte characters (emoji, a CJK extension letter, a musical symbol) that are
  two UTF-16 units and that a grammar backend may spell as a ``\\uD83D\\uDE00`` escape pair;
- **combining marks** after a base letter, and **right-to-left** letters (Hebrew, Arabic) with
  the directional marks around them;
- **escaped**: characters JSON must or may escape (``"``, ``\\``, control characters, U+2028)
  and that a backend spells as ``\\uXXXX``.

Lone surrogates are never drawn: they are not Unicode scalar values, and a server refuses them
before any grammar sees them (`grammar.core.input_checks`). Strings used as regex literals go
through `regex_literal`, which escapes what the regex dialects both backends read treat as
syntax. `corral fuzz --target` and the Unicode property tests draw from the same strategies.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: A few characters of each class (a sample, so shrinking ends on a readable one).
CLASSES: dict[str, str] = {
    "ascii": "aZ0 _-.",
    "multibyte": "éÑñüßøΩλж°€東京日本語한국",
    "astral": "😀🎉🚀𠀋𝄞🇯🇵",
    "combining": "e\u0301a\u0308n\u0303\u0323",
    "rtl": "שלוםمرحبا\u200f\u200e",
    "escaped": '"\\/\n\t\r\b\f\x00\x01\x1f\x7f\u2028\u2029',
}
#: Classes without the characters JSON must escape: for keys and names that some formats print
#: unescaped into a prompt or tag.
PRINTABLE = {k: v for k, v in CLASSES.items() if k != "escaped"}


def _chars(classes: dict[str, str]) -> st.SearchStrategy[str]:
    return st.sampled_from(sorted({c for chars in classes.values() for c in chars}))


def unicode_text(
    min_size: int = 1, max_size: int = 8, escaped: bool = True
) -> st.SearchStrategy[str]:
    """A string of `min_size`..`max_size` characters, at least one of them non-ASCII (so a
    draw never degenerates into the ASCII case every other test already covers)."""
    chars = _chars(CLASSES if escaped else PRINTABLE)
    wide = st.sampled_from(sorted({c for v in PRINTABLE.values() for c in v if ord(c) > 0x7F}))

    @st.composite
    def draw(draw: Any) -> str:
        body = draw(st.lists(chars, min_size=max(min_size - 1, 0), max_size=max_size - 1))
        at = draw(st.integers(0, len(body)))
        return "".join(body[:at] + [draw(wide)] + body[at:])

    return draw()


def regex_literal(text: str) -> str:
    """`text` as a regex that matches exactly it: syntax characters escaped, control characters
    and line separators as ``\\uXXXX`` (read the same by llguidance, xgrammar and Python)."""
    out = []
    for ch in text:
        if ch in ".^$*+?()[]{}|\\-":
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch in "\x7f\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


@st.composite
def unicode_schemas(draw: Any) -> dict:
    """An object schema whose keys, enum members, const and pattern are drawn Unicode strings,
    with a free string property (where a model writes Unicode of its own); every schema drawn
    has an instance."""
    keys = draw(st.lists(unicode_text(1, 5, escaped=False), min_size=2, max_size=4, unique=True))
    members = draw(st.lists(unicode_text(1, 6), min_size=1, max_size=4, unique=True))
    fixed = draw(unicode_text(1, 4))
    stem = draw(unicode_text(1, 3, escaped=False))
    props: dict[str, Any] = {
        keys[0]: {"enum": members},
        keys[1]: {"type": "string", "maxLength": draw(st.integers(1, 12))},
    }
    if len(keys) > 2:
        props[keys[2]] = {"const": fixed}
    if len(keys) > 3:
        props[keys[3]] = {"type": "string", "pattern": f"^{regex_literal(stem)}[a-zé]{{0,3}}$"}
    required = draw(st.lists(st.sampled_from(keys), unique=True, min_size=1))
    return {
        "type": "object",
        "properties": props,
        "required": sorted(required, key=keys.index),
        "additionalProperties": False,
    }


def unicode_choices() -> st.SearchStrategy[list[str]]:
    """Choices (a `choice` constraint's literals) that differ only past a shared prefix, so the
    choice is made inside a multi-byte character as often as at its start."""

    @st.composite
    def draw(draw: Any) -> list[str]:
        head = draw(st.sampled_from(["", "東", "😀", "é"]))
        tails = draw(st.lists(unicode_text(1, 4), min_size=2, max_size=4, unique=True))
        return [head + t for t in tails]

    return draw()
