"""String `format` handling for the schema analysis.

JSON Schema makes `format` an annotation unless the validator asserts it. Corral's judge is
`jsonschema` with its format checker, so a format falls in one of three groups:

* not checked by `jsonschema.FormatChecker` (e.g. "url", "int64", "byte"): an annotation, any
  string is valid, so the keyword is dropped;
* checked, and expressible as a regular language we can write down exactly (date, time,
  date-time, ipv4, uuid, hostname, ...): replaced by an anchored `pattern` (plus a length bound)
  whose language is a *subset* of what the checker accepts, never a superset;
* checked but not expressible here (idn-hostname, idn-email, ...): refused in strict
  mode, since passing it on would let the backend accept strings the judge rejects.

The backend's own format regexes are not used: some accept strings the checker rejects
(``backends.quirks.LOOSE_FORMATS``).

Copies: `format_constraint` returns a new dict on every call.
"""

from __future__ import annotations

import re

import rfc3986_validator
from jsonschema import Draft202012Validator

#: Formats the judge checks (with the installed extras); every other format is an annotation.
CHECKED_FORMATS: frozenset[str] = frozenset(Draft202012Validator.FORMAT_CHECKER.checkers)

_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"  # 0001-9999
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
    rf"|{_LEAP_YEAR}-02-29)"
)
# rfc3339-validator upper-cases the string first, so "t" and "z" are fine; no leap seconds.
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_DEC_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_IPV6 = (
    "(?:"
    + "|".join(
        [
            rf"(?:{_H16}:){{7}}{_H16}",
            rf"::(?:{_H16}:){{0,5}}{_H16}",
            rf"{_H16}::(?:{_H16}:){{0,4}}{_H16}",
            rf"(?:{_H16}:){{1}}{_H16}::(?:{_H16}:){{0,3}}{_H16}",
            rf"(?:{_H16}:){{2}}{_H16}::(?:{_H16}:){{0,2}}{_H16}",
            rf"(?:{_H16}:){{3}}{_H16}::(?:{_H16}:){{0,1}}{_H16}",
            rf"(?:{_H16}:){{4}}{_H16}::{_H16}",
            rf"(?:{_H16}:){{0,6}}{_H16}::",
            "::",
        ]
    )
    + ")"
)
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = r"(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)"
_DURATION = rf"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"
# Dot-atom local part @ host name; the checker only asks for an "@".
_EMAIL = rf"[a-zA-Z0-9!#$%&'*+/=?^_`{{|}}~-]+(?:\.[a-zA-Z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{_LABEL}(?:\.{_LABEL})*"


def _plain_regex(verbose: str) -> str:
    """A re.VERBOSE regex as a plain one both Python `re` and Rust `regex` read the same way."""
    lines = [re.sub(r"(?<!\\)#.*$", "", line) for line in verbose.splitlines()]
    plain = re.sub(r"\s+", "", "".join(lines))
    return plain.replace("\\#", "#").replace("{,", "{0,")


# The judge checks "uri"/"uri-reference" with rfc3986-validator's regexes: reuse them.
_URI = _plain_regex(rfc3986_validator.URI_RE)
_RELATIVE_REF = _plain_regex(rfc3986_validator.RELATIVE_REF_RE)

# The judge checks "iri"/"iri-reference" with rfc3987-syntax's grammar, which has no recursion:
# each rule below spells one of its rules (its `ucschar` stops at U+FFEF). Of its IPv6 forms,
# those with `::` inside the address are left out: its parser refuses "1::2:3:4:5:6", which the
# grammar's text allows, so only the forms it was seen to accept are kept (a subset).
_UCS = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
_PCT = "%[0-9A-Fa-f]{2}"
_IUNRESERVED = f"A-Za-z0-9\\-._~{_UCS}"
_SUB_DELIMS = "!$&'()*+,;="
_IPCHAR = f"(?:[{_IUNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_ISEGMENT_NZ_NC = f"(?:[{_IUNRESERVED}{_SUB_DELIMS}@]|{_PCT})+"
_IPATH_ABEMPTY = f"(?:/{_IPCHAR}*)*"  # each path form below ends in these segments
_IPATH_ABSOLUTE = f"/(?:{_IPCHAR}+{_IPATH_ABEMPTY})?"
_IPATH_ROOTLESS = f"{_IPCHAR}+{_IPATH_ABEMPTY}"
_IPATH_NOSCHEME = f"{_ISEGMENT_NZ_NC}{_IPATH_ABEMPTY}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6_3987 = (
    "(?:"
    + "|".join(
        [
            f"(?:{_H16}:){{6}}{_LS32}",
            f"::(?:{_H16}:){{5}}{_LS32}",
            f"(?:{_H16}:){{5}}{_H16}::{_H16}",
            f"(?:{_H16}:){{6}}{_H16}::",
        ]
    )
    + ")"
)
_IPVFUTURE = f"v[0-9A-Fa-f]+\\.[A-Za-z0-9\\-._~{_SUB_DELIMS}:]+"
_IHOST = f"(?:\\[(?:{_IPV6_3987}|{_IPVFUTURE})\\]|(?:[{_IUNRESERVED}{_SUB_DELIMS}]|{_PCT})*)"
_IAUTHORITY = f"(?:(?:[{_IUNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?{_IHOST}(?::[0-9]*)?"
_IQUERY = f"(?:{_IPCHAR}|[\ue000-\uf8ff/?])*"
_IFRAGMENT = f"(?:{_IPCHAR}|[/?])*"
_TAIL = f"(?:\\?{_IQUERY})?(?:#{_IFRAGMENT})?"
_IRI = (
    f"[A-Za-z][A-Za-z0-9+\\-.]*:"
    f"(?://{_IAUTHORITY}{_IPATH_ABEMPTY}|{_IPATH_ABSOLUTE}|{_IPATH_ROOTLESS})?{_TAIL}"
)
_IRELATIVE_REF = f"(?://{_IAUTHORITY}{_IPATH_ABEMPTY}|{_IPATH_ABSOLUTE}|{_IPATH_NOSCHEME})?{_TAIL}"
# uri-template's checker parses RFC 6570 templates; a subset of what it accepts: literals without
# braces, and expressions with an operator, variable names of word characters (dotted), a
# prefix length or an explode.
_VARSPEC = "[A-Za-z0-9_]+(?:\\.[A-Za-z0-9_]+)*(?::[1-9][0-9]{0,2}|\\*)?"
_URI_TEMPLATE = f"(?:[^{{}}]|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"


def _regex_subset(depth: int) -> str:
    """Python regexes `re.compile` accepts, a regular subset with groups nested `depth` deep:
    literals (no braces), escapes of punctuation or of `dDwWsSbBAZntrfv`, `.`, classes of plain
    characters, escapes and ordered ASCII ranges, `(...)` and `(?:...)`, anchors, and one
    quantifier per atom (`* + ?` or a count of up to 3 digits, `{m,n}` only with m <= n),
    optionally lazy. No back-references, flags or look-arounds."""
    escape = r"\\(?:[!-/:-@\[-`{-~]|[dDwWsSntrfv])"
    ranges = "|".join(
        f"{a}-[{a}-{z}]"
        for lo, z in (("0", "9"), ("a", "z"), ("A", "Z"))
        for a in map(chr, range(ord(lo), ord(z) + 1))
    )
    cls = rf"\[\^?(?:{ranges}|{escape}|[^\\\[\]\-&~|^])+\]"
    counts = "|".join(f"{m},[{m}-9]" for m in range(10))
    quant = rf"(?:(?:[*+?]|\{{(?:[0-9]{{1,3}},?|,[0-9]{{1,3}}|{counts})\}})\??)"
    literal = r"[^\\^$.|?*+()\[\]{}]"
    atom = f"(?:{literal}|{escape}|\\.|{cls})"
    anchor = r"(?:\^|\$|\\[bBAZ])"
    alternation = f"(?:{anchor}|{atom}{quant}?)*(?:\\|(?:{anchor}|{atom}{quant}?)*)*"
    for _ in range(depth):
        group = f"\\((?:\\?:)?{alternation}\\)"
        atom = f"(?:{literal}|{escape}|\\.|{cls}|{group})"
        alternation = f"(?:{anchor}|{atom}{quant}?)*(?:\\|(?:{anchor}|{atom}{quant}?)*)*"
    return alternation


#: format -> (anchored regex, max length or None). Each language is a subset of what the
#: checker accepts (tests draw strings from each regex and ask the checker).
EXACT_FORMATS: dict[str, tuple[str, int | None]] = {
    "date": (f"^{_DATE}$", None),
    "time": (f"^{_TIME}$", None),
    "date-time": (f"^{_DATE}[tT]{_TIME}$", None),
    "ipv4": (f"^{_IPV4}$", None),
    "ipv6": (f"^{_IPV6}$", None),
    "uuid": (f"^{_UUID}$", None),
    "hostname": (rf"^{_LABEL}(?:\.{_LABEL})*$", 253),
    "email": (f"^{_EMAIL}$", None),
    "duration": (f"^{_DURATION}$", None),
    "uri": (f"^(?:{_URI})$", None),
    "uri-reference": (f"^(?:{_URI}|{_RELATIVE_REF})$", None),
    "json-pointer": (r"^(?:/(?:[^~/]|~[01])*)*$", None),
    "iri": (f"^(?:{_IRI})$", None),
    "iri-reference": (f"^(?:{_IRI}|{_IRELATIVE_REF})$", None),
    "uri-template": (f"^{_URI_TEMPLATE}$", None),
    "regex": (f"^{_regex_subset(3)}$", None),
}


def format_constraint(name: str) -> dict | None:
    """The string constraints that enforce `format: name` exactly.

    Returns {} for a format the judge does not check (an annotation), a dict with `pattern`
    (and maybe `maxLength`) for an expressible one, and None when it cannot be enforced.
    """
    if name not in CHECKED_FORMATS:
        return {}
    exact = EXACT_FORMATS.get(name)
    if exact is None:
        return None
    pattern, max_len = exact
    out: dict = {"pattern": pattern}
    if max_len is not None:
        out["maxLength"] = max_len
    return out
