"""``--dialect auto``: one probe per dialect, in :data:`DIALECTS` order, until one visibly
constrains the output.

The probe asks for a greeting (the prompt does not mention the schema) under a schema a model
would not write unasked: an object with one required boolean ``probe``. A dialect is chosen when
its answer is an instance of that schema; a server that ignores an unknown field (and answers
in prose) or refuses the request form is passed over, and the reasons are kept for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.fuzz.dialects import DIALECTS
from corral.fuzz.dialects.base import LENGTH, OK, Dialect, EndpointError, Reply, Sampling
from corral.fuzz.judge import Judge, judge_output

PROBE_SCHEMA = {
    "type": "object",
    "properties": {"probe": {"type": "boolean"}},
    "required": ["probe"],
    "additionalProperties": False,
}
PROBE_MESSAGES = [
    {"role": "system", "content": "You are a friendly assistant."},
    {"role": "user", "content": "Say hello."},
]
PROBE_SAMPLING = Sampling(temperature=0.0, max_tokens=64, seed=0)
PROBED = tuple(n for n in DIALECTS if n != "tools")


class Sender(Protocol):
    async def model_for(self, dialect: Dialect) -> str | None: ...

    async def post(self, dialect: Dialect, body: dict) -> Reply: ...


@dataclass
class Choice:
    dialect: Dialect
    model: str | None
    passed_over: list[str] = field(default_factory=list)  # "name: why", in probe order

    def note(self) -> str:
        """How the dialect was chosen, and why the ones before it were not."""
        passed = f"; passed over {'; '.join(self.passed_over)}" if self.passed_over else ""
        return f"by probing (--dialect auto){passed}"


async def choose(sender: Sender) -> Choice:
    """The first dialect in :data:`PROBED` whose probe answer is an instance of the probe
    schema; :class:`EndpointError` naming every dialect's reason when none is."""
    passed: list[str] = []
    judge = Judge(PROBE_SCHEMA)
    for name in PROBED:
        d = DIALECTS[name]
        try:
            model = await sender.model_for(d)
        except EndpointError as e:
            passed.append(f"{name}: {e}")
            continue
        reply = await sender.post(d, d.body(model, PROBE_MESSAGES, PROBE_SCHEMA, PROBE_SAMPLING))
        why = _why_not(reply, judge)
        if not why:
            return Choice(d, model, passed)
        passed.append(f"{name}: {why}")
    raise EndpointError(
        "--dialect auto: no request form constrained the probe; " + "; ".join(passed)
    )


def _why_not(reply: Reply, judge: Judge) -> str:
    if reply.kind == LENGTH:
        return f"the answer ran past {PROBE_SAMPLING.max_tokens} tokens"
    if reply.kind != OK:
        return f"{reply.kind}: {reply.text[:200]}"
    judged: Any = judge_output(judge, reply.text.encode())
    if judged is None or judged[1]:
        return f"ignored the schema (answered {reply.text[:60]!r})"
    return ""
