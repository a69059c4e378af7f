"""Test-only fault injection through the real step code: `CORRAL_FAULTS`.

A comma-separated list of faults, each firing once:

- `step@N`: `Engine.step` raises `RuntimeError` in its N-th step that runs a batch (1-based),
  after scheduling and before the forward: a failure of the step itself (AsyncEngine restarts).
- `seq@N`: the per-sequence postprocessing of the first sequence of the N-th step raises
  `RuntimeError`: a failure tied to one sequence (only that sequence fails).
- `mask@N`: the grammar mask fill (on the mask thread) of the first constrained sequence of the
  N-th step raises `RuntimeError`: a matcher failure (only that sequence fails).

Read by the `Engine` at construction from `EngineConfig.faults`, or from the environment
variable when that is None, so a test can arm a real server subprocess. Unset: no faults and
no cost beyond one integer comparison per step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_VAR = "CORRAL_FAULTS"
KINDS = ("step", "seq", "mask")


class InjectedFault(RuntimeError):
    """The exception an armed fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int


def parse_faults(text: str | None) -> tuple[Fault, ...]:
    """`"step@3,seq@5"` -> faults; raises ValueError naming a malformed entry."""
    faults = []
    for entry in (text or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        kind, _, n = entry.partition("@")
        if kind not in KINDS or not n.isdigit() or int(n) < 1:
            raise ValueError(
                f"{ENV_VAR}: bad fault {entry!r}; expected kind@N with kind in {KINDS}, N >= 1"
            )
        faults.append(Fault(kind, int(n)))
    return tuple(faults)


class Faults:
    """The armed faults of one engine; each fires once (the set survives an engine rebuild)."""

    def __init__(self, faults: tuple[Fault, ...] = ()) -> None:
        self._armed = set(faults)
        self.fired: list[Fault] = []

    @classmethod
    def from_config(cls, configured: str | None) -> Faults:
        return cls(parse_faults(configured if configured is not None else os.environ.get(ENV_VAR)))

    def __bool__(self) -> bool:
        return bool(self._armed)

    def fire(self, kind: str, step: int) -> None:
        """Raise `InjectedFault` if `kind@step` is armed (disarming it)."""
        error = self.take(kind, step)
        if error is not None:
            raise error

    def take(self, kind: str, step: int) -> InjectedFault | None:
        """The `InjectedFault` for `kind@step` if it is armed (disarming it), to raise elsewhere
        (e.g. on the mask thread)."""
        fault = Fault(kind, step)
        if fault not in self._armed:
            return None
        self._armed.discard(fault)
        self.fired.append(fault)
        return InjectedFault(f"injected fault {kind}@{step} ({ENV_VAR})")
