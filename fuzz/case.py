"""The plain data that moves between the runner, the worker processes and the report.

A case keeps its schema as JSON text, and :attr:`Case.schema` parses a new copy on every read:
the stages of a case, and the third-party code they call, each get a schema of their own.
hypothesis-jsonschema, for one, rewrites the schema it is given in place (``$ref`` resolved into
the tree, ``_id`` keys added), so a shared object would make every later stage, and the
reproducer, test a schema that is not the corpus file's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from corral.fuzz.stats import LogHistogram

#: Failure kinds. UNSOUND (an invalid instance allowed) gates CI by default.
UNSOUND = "unsound"  # the engine allowed output that the judge rejects
INCOMPLETE = "incomplete"  # the engine refused a valid instance (over-constrained)
KEY_ORDER = "key-order"  # a valid instance refused only because its keys are not in schema order
DEAD_END = "dead-end"  # a walk reached a prefix with no allowed continuation
MISMATCH = "mismatch"  # the mask and accept() disagree, or tokens past the vocabulary allowed
ERROR = "error"  # the engine raised something other than a refusal
CRASH = "crash"  # the worker process died inside the engine
HANG = "hang"  # the engine ran past the per-stage time limit
SLOW_COMPILE = "slow-compile"
SLOW_MASK = "slow-mask"
KINDS = (
    UNSOUND,
    INCOMPLETE,
    KEY_ORDER,
    DEAD_END,
    MISMATCH,
    ERROR,
    CRASH,
    HANG,
    SLOW_COMPILE,
    SLOW_MASK,
)
#: The kinds a target's row in the report counts (crash and hang come from its status).
ROW_KINDS = (UNSOUND, INCOMPLETE, KEY_ORDER, DEAD_END, MISMATCH, ERROR)


@dataclass(frozen=True)
class Case:
    """One schema to fuzz, frozen: ``schema_json`` is the schema's JSON text and :attr:`schema`
    a fresh copy of it. ``tests`` are ``(instance, label)`` pairs from the corpus; the label is
    only informative, the judge relabels every instance. ``prompt`` is text URL targets add to
    the prompt they send (``--unicode``)."""

    id: str
    schema_json: str
    tests: list[tuple[Any, bool | None]] = field(default_factory=list)
    source: str = ""
    seed: int = 0
    prompt: str = ""

    @classmethod
    def from_schema(
        cls,
        id: str,
        schema: Any,
        tests: list[tuple[Any, bool | None]] | None = None,
        source: str = "",
        seed: int = 0,
        prompt: str = "",
    ) -> Case:
        """A case of ``schema`` as it is now; later changes to that object do not reach it."""
        return cls(id, json.dumps(schema, ensure_ascii=False), tests or [], source, seed, prompt)

    @property
    def schema(self) -> Any:
        """A new copy of the schema on every read: its reader may change it, nobody else sees."""
        return json.loads(self.schema_json)

    def failure(
        self, target: str, kind: str, text: str | None, detail: str, shrinkable: bool = True
    ) -> Failure:
        """A finding on this case with two schema copies of its own: shrinking replaces
        ``schema``; ``original_schema`` stays the corpus file's."""
        return Failure(
            target,
            kind,
            self.id,
            self.schema,
            text,
            detail,
            original_schema=self.schema,
            original_text=text,
            shrinkable=shrinkable,
        )


@dataclass
class Failure:
    """One finding. ``schema``/``text`` are shrunk when ``shrunk``; the originals are kept."""

    target: str
    kind: str
    case_id: str
    schema: Any
    text: str | None  # instance text ("" or None when there is no instance, e.g. a hang)
    detail: str
    original_schema: Any = None
    original_text: str | None = None
    shrunk: bool = False
    shrinkable: bool = True  # False when the text cannot be replayed (e.g. it is not UTF-8)
    keywords: tuple[str, ...] = ()
    #: Unsound: the keywords the instance breaks (the judge's), i.e. what the engine dropped.
    dropped: tuple[str, ...] = ()
    reproduced: str = ""  # URL targets: how the server answered the shrunk schema, sent again
    reproducer: str = ""  # path of the saved reproducer, filled in by the runner


@dataclass
class TargetOutcome:
    """What one target did with one case."""

    target: str
    status: str = "ok"  # ok · refused · error · crash · hang · skipped
    reason: str = ""
    #: Whether anything this target produced or accepted was judged: in-process, the schema
    #: compiled; a URL, at least one output was not cut short and was judged.
    judged: bool = False
    compile_s: float = 0.0
    walks: dict[str, int] = field(default_factory=dict)
    valid_checked: int = 0
    valid_rejected: int = 0
    invalid_checked: int = 0
    invalid_accepted: int = 0
    mask: LogHistogram = field(default_factory=LogHistogram)
    failures: list[Failure] = field(default_factory=list)

    def kinds(self) -> set[str]:
        return {f.kind for f in self.failures}


@dataclass
class CaseResult:
    case_id: str
    source: str
    keywords: tuple[str, ...] = ()
    judged: bool = True
    note: str = ""
    n_valid: int = 0
    n_invalid: int = 0
    outcomes: dict[str, TargetOutcome] = field(default_factory=dict)
    #: Differential mode: ``"a|b"`` -> ``differential.DiffStats`` of that engine pair.
    diff: dict[str, Any] = field(default_factory=dict)
