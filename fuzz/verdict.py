"""Whether a run may pass on what it judged: a fuzzer that judged nothing has tested nothing.

A target fails the run when it judged no schema at all (every one refused, erred, hung, crashed
or ran out of tokens), or when the schemas it could not judge for any reason but an honest
refusal (``error``, ``hang``, ``crash``, outputs all cut by ``max_tokens``) are more than the
allowed share of its schemas (``--max-unjudged``; default 0: any). The commonest reason is
printed once, with a hint where one helps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.fuzz.report import Report

REASON_CHARS = 240


def reason_key(reason: str) -> str:
    """A reason as the report counts it: one line, its numbers kept (they are often the point:
    an HTTP status, a token limit), cut to a length that groups the same failure."""
    return re.sub(r"\s+", " ", reason).strip()[:REASON_CHARS] or "(no reason given)"


@dataclass(frozen=True)
class Shortfall:
    """A target that judged too little: counts, and its commonest reason."""

    target: str
    schemas: int
    judged: int
    refused: int
    unjudged: int
    reason: str
    times: int

    def message(self, hint: str = "") -> str:
        if self.judged == 0:
            head = f"{self.target}: no schema was judged ({self.schemas} sent"
        else:
            head = (
                f"{self.target}: {self.unjudged} of {self.schemas} schemas could not be judged "
                f"(more than --max-unjudged allows; {self.judged} judged"
            )
        head += f", {self.refused} refused)" if self.refused else ")"
        if self.times:
            head += f"; commonest reason ({self.times}×): {self.reason}"
        return head + (f"; {hint}" if hint else "")


def shortfalls(report: Report, max_share: float) -> list[Shortfall]:
    """The targets that judged no schema, or left more than ``max_share`` of their schemas
    unjudged for reasons other than a refusal."""
    out = []
    for name, st in report.targets.items():
        unjudged, refused = sum(st.unjudged.values()), sum(st.refused.values())
        if st.judged and unjudged <= max_share * st.schemas:
            continue
        reasons = st.unjudged if st.judged else st.unjudged + st.refused
        reason, times = reasons.most_common(1)[0] if reasons else ("", 0)
        out.append(Shortfall(name, st.schemas, st.judged, refused, unjudged, reason, times))
    return out
