"""The receipt of a constraint (``corral``): what enforced it, as observed for this request.

Every constrained response carries one (a stream: in its first chunk), and so does the 200 of
``POST /v1/constraints/validate`` and ``POST /v1/constraints``. It names the constraint by its
content digest and the compiled-constraint cache's key, the backend and its version, Corral's
cache format and grammar-code versions, where this request's compiled form came from (a cache
tier, another request's compile it joined, or a compile of its own with its duration), the
rewrites Corral applied to the request's constraint before compiling it (the request-level ones
first, then each schema keyword the analysis rewrote, pointed into its request field), and the
keywords lenient mode does not enforce (``exact`` is false then). An unconstrained response carries no
receipt: nothing was compiled, so there is nothing to vouch for.

``Constraint`` is a request's constraint before its compile (the spec, the 400 a refusal
becomes, how lenient mode's report points into the request); ``enforce`` compiles it through
the server's compile service, the one path of every endpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.api.engine_call import compile_for
from corral.api.errors import ApiError
from corral.api.responses import Receipt, Rewrite, Unenforced
from corral.grammar import CompiledConstraint, ConstraintError, ConstraintSpec
from corral.grammar.core.compiled import FORMAT_VERSION
from corral.schema_cache.disk import STORE_VERSION
from corral.schema_cache.entries import entry_key

if TYPE_CHECKING:
    from corral.api.state import ServerState
    from corral.schema_cache.entries import Lookup

#: Corral's compiled-entry format and disk-store layout, as one version string.
CACHE_FORMAT = f"{FORMAT_VERSION}.{STORE_VERSION}"


@dataclass(frozen=True)
class Constraint:
    """A request's constraint before its compile.

    ``refused`` turns a ConstraintError into the request's 400 (its ``param`` and pointer name
    the request field); ``report`` lists lenient mode's unenforced keywords with pointers into
    the request; ``locate`` turns a pointer into the compiled constraint's source into (request
    field, pointer within it); ``rewrites`` are the changes that made ``spec`` from the
    request."""

    spec: ConstraintSpec
    refused: Callable[[ConstraintError], ApiError]
    report: Callable[[CompiledConstraint], list[Unenforced] | None]
    locate: Callable[[str], tuple[str, str]]
    rewrites: tuple[Rewrite, ...] = ()


@dataclass(frozen=True)
class Enforced:
    """A compiled constraint, lenient mode's report (None when exact) and its receipt."""

    compiled: CompiledConstraint
    unenforced: list[Unenforced] | None
    receipt: Receipt


async def enforce(state: ServerState, request: Any, constraint: Constraint) -> Enforced:
    """Compile ``constraint`` through the server's compile service (a refusal is its 400; the
    compile is abandoned if the client disconnects) and write its receipt."""
    found = await compile_for(state, request, constraint.spec, constraint.refused)
    unenforced = constraint.report(found.compiled)
    return Enforced(found.compiled, unenforced, _receipt(constraint, found, unenforced))


def _receipt(constraint: Constraint, found: Lookup, unenforced: list[Unenforced] | None) -> Receipt:
    """What ``found`` says about this request's compile; ``compile_ms`` only for its own."""
    c = found.compiled
    compiled_here = found.source == "compiled"
    return Receipt(
        kind=str(constraint.spec.kind),
        digest=c.spec_digest,
        cache_key=entry_key(c.spec_digest, c.tokenizer_fingerprint, c.analysis_version),
        tokenizer=c.tokenizer_fingerprint,
        backend=c.backend,
        backend_version=c.backend_version,
        cache_format=CACHE_FORMAT,
        analysis_version=c.analysis_version[:16],
        cache=found.source,
        compile_ms=round(found.compile_s * 1000, 3) if compiled_here else None,
        exact=not unenforced,
        rewrites=[*constraint.rewrites, *_keyword_rewrites(constraint, c)],
        unenforced=unenforced or [],
    )


def _keyword_rewrites(constraint: Constraint, compiled: CompiledConstraint) -> list[Rewrite]:
    """The analysis's keyword rewrites, pointed into the request; a schema compiled more than
    once (a function under two call openers) is listed once."""
    out, seen = [], set()
    for r in compiled.rewrites:
        param, pointer = constraint.locate(r.pointer)
        if (param, pointer, r.keyword, r.rewrite) not in seen:
            seen.add((param, pointer, r.keyword, r.rewrite))
            out.append(
                Rewrite(
                    rewrite="keyword",
                    param=param,
                    pointer=pointer,
                    keyword=r.keyword,
                    detail=r.rewrite,
                )
            )
    return out
