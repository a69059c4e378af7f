"""Errors a client can cause by sending a constraint."""

from typing import NamedTuple


class ConstraintError(ValueError):
    """A constraint the client sent cannot be compiled or enforced exactly.

    ``reason`` says what is wrong and what to do about it, ``pointer`` is the JSON pointer of the
    offending schema node ("" for the root or for non-JSON constraints) and ``keyword`` the schema
    keyword or grammar construct involved. The API turns it into an OpenAI-shaped 400.

    ``limit`` names the bound the constraint would exceed when that is why it is refused (a
    backend's runtime limit found by probing at compile time, such as ``max_items_in_row``,
    ``lexer_states`` or ``recursion_depth``, or one of Corral's own size limits); the API then
    answers with code ``constraint_too_complex``.
    """

    def __init__(
        self, reason: str, pointer: str = "", keyword: str = "", limit: str | None = None
    ) -> None:
        where = f" (at {pointer or '/'}" + (f", keyword {keyword}" if keyword else "") + ")"
        super().__init__(reason + where)
        self.reason = reason
        self.pointer = pointer
        self.keyword = keyword
        self.limit = limit


class CompileUnavailable(RuntimeError):
    """A compile that could not be finished now (its deadline passed, its worker died).

    Not the client's mistake and never cached as a refusal: the API answers 503 with
    ``Retry-After: retry_after_s`` and ``code`` (``compile_timeout``, ``compile_worker_failed``).
    """

    def __init__(self, reason: str, code: str = "compile_timeout", retry_after_s: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.retry_after_s = retry_after_s


class Unenforced(NamedTuple):
    """A schema keyword that lenient mode let through without enforcing it."""

    pointer: str
    keyword: str
    reason: str
