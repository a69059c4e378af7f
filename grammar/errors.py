"""Errors a client can cause by sending a constraint."""

from typing import NamedTuple


class ConstraintError(ValueError):
    """A constraint the client sent cannot be compiled or enforced exactly.

    ``reason`` says what is wrong and what to do about it, ``pointer`` is the JSON pointer of the
    offending schema node ("" for the root or for non-JSON constraints) and ``keyword`` the schema
    keyword or grammar construct involved. The API turns it into an OpenAI-shaped 400.
    """

    def __init__(self, reason: str, pointer: str = "", keyword: str = "") -> None:
        where = f" (at {pointer or '/'}" + (f", keyword {keyword}" if keyword else "") + ")"
        super().__init__(reason + where)
        self.reason = reason
        self.pointer = pointer
        self.keyword = keyword


class Unenforced(NamedTuple):
    """A schema keyword that lenient mode let through without enforcing it."""

    pointer: str
    keyword: str
    reason: str
